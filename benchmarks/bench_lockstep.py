"""Users' fits one at a time, in lockstep, and in lockstep stacked (uph.lm.engine.lockstep, .round), on any device.

Each user walks the validate job's path of radii (the default's 9, svd_cvh at d = 32, exact solver) on
its own tokens. One at a time, every evaluation is queued, read back and waited for before the solver's
next step; in lockstep, every user's next evaluation is queued back to back and read back once a round;
stacked (the users' tokens side by side in two halves, as a GPU's fit jobs have them), a round is one
batched pass, and the halves' rounds alternate.

    .venv/bin/python benchmarks/bench_lockstep.py [--device cpu|cuda] [--vocab 49152] [--users 4] [--tokens 1600]
        [--chunk 1024] [--ops [--scale 0.3]]

Two ways to read it. At the model's vocabulary on a CPU the kernels are the whole cost and the first two
orders run at one speed (the same arithmetic). At a small vocabulary (`--vocab 512`) the kernels cost
next to nothing, and what is left (with `--chunk 1024`, a GPU's chunks) is the host's work per evaluation
(the solver's step, the dispatch of an evaluation's operations): the floor of a GPU evaluation run one at
a time, where the host and the device wait for each other, and the part a round overlaps with the device's
work in lockstep, and stacking shares among its users. It also counts the host reads of each order's
device part (`device_reads`, in a second, untimed pass: every read of a tensor's values to the host)
beside the evaluations and lockstep rounds, and the host's time in the stacked fits' solver steps (ball
steps and the rest, a third pass). Stacked values are each user's to float32 rounding (the
largest relative difference of an objective is printed); the first two orders', bit for bit.

`--ops` prints instead how many operations one round dispatches in its device part
(uph.device.count_dispatched_ops) for 1 and for 12 users stacked, each at a theta of `--scale` times a
standard normal (a large scale tilts a conditional head's tokens past EXP_SAFE), one line: `ops per round: U=1 <n>,
U=12 <n>`, and below it the same not stacked. A stacked round dispatches as many for 12 as for 1 while
their tokens fit one block (uph.lm.engine.round.STACK_SCRATCH: 262,144 tokens at V = 512, 2,730 at 49,152),
dispatched each on its own, 12 times as many (each a kernel launch on a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch

import uph.lm.engine.lockstep
import uph.lm.engine.objective
import uph.lm.engine.round
from uph.device import count_dispatched_ops, count_host_reads
from uph.lm.data.models import OutputLayer
from uph.lm.engine.fit import fit_path, fit_path_steps
from uph.lm.engine.heads import HeadSettings, make_head
from uph.lm.engine.lockstep import run_lockstep
from uph.lm.engine.objective import Objective
from uph.lm.engine.round import evaluate_round
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import on_device, prepare, prepare_halves, prepare_stack

RADII = (0.05, 0.15, 0.5, 1.5, 5, 15, 50, 150, 500)  # config.yaml's fit.radii


def users(vocab: int, hidden: int, n_users: int, n_tokens: int, device, chunk: int | None = None, stacked=False):
    """(head, every user's tokens): a random output layer with an LM's logit scale, each user's hidden
    states tilted by a theta of its own, targets drawn from the tilted model; `stacked`: the users' tokens
    side by side in one Stack (uph.lm.engine.tokens.prepare_stack), or "halves": in two, as a GPU's fit jobs
    have them (prepare_halves)."""
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(vocab, hidden, generator=generator) / hidden**0.5 * 4
    svd = torch.linalg.svd(W.double(), full_matrices=False)
    head = make_head("svd_cvh", W, d=32, alpha=1.0, settings=HeadSettings.defaults(), svd=svd)
    layer = on_device(OutputLayer(W), device)
    splits = []
    for _ in range(n_users):
        h = torch.randn(n_tokens, hidden, generator=generator)
        star = 3 * torch.randn(32, generator=generator)
        probabilities = torch.softmax(head.logits(h, star), dim=-1)
        splits.append((h, torch.multinomial(probabilities.float(), 1, generator=generator).squeeze(1)))
    if stacked == "halves":
        return head, prepare_halves(splits, layer, chunk=chunk, device=device)
    if stacked:
        return head, prepare_stack(splits, layer, chunk=chunk, device=device)
    return head, [prepare(h, y, layer, chunk=chunk, device=device) for h, y in splits]


def device_reads(order) -> int:
    """How many times `order`'s evaluations waited for the device: the host reads of each round's
    uph.lm.engine.objective._device_round (counted by uph.device.count_host_reads), and each stacked pass's
    sums read (uph.lm.engine.round: one wait each); an untimed pass."""
    device_round, read, reads = uph.lm.engine.objective._device_round, uph.lm.engine.round._InFlight.read, []

    def counted_round(requests, need_grad):
        result, n = count_host_reads(device_round, requests, need_grad)
        reads.append(n)
        return result

    def counted_read(in_flight):
        reads.append(1)
        return read(in_flight)

    uph.lm.engine.objective._device_round, uph.lm.engine.round._InFlight.read = counted_round, counted_read
    try:
        order()
    finally:
        uph.lm.engine.objective._device_round, uph.lm.engine.round._InFlight.read = device_round, read
    return sum(reads)


def ops_per_round(head, tokens, settings: SolverSettings, scale: float = 0.3) -> int:
    """The operations one round (evaluate_round) dispatches in its device part for every user of `tokens` at a
    theta of its own (`scale` times a standard normal; uph.device.count_dispatched_ops), after an uncounted
    round (warm-up)."""
    objectives = [Objective(t, head, settings.beta, settings.lam) for t in tokens]
    generator = torch.Generator().manual_seed(1)
    requests = [
        (objective, scale * torch.randn(head.d, generator=generator, dtype=torch.float64)) for objective in objectives
    ]
    evaluate_round(requests)
    return count_dispatched_ops(evaluate_round, requests)[1]


def solver_seconds(order) -> tuple[float, float]:
    """The host's seconds in `order`'s fits' steps, apart from their evaluations (a second, untimed pass):
    the ball steps (uph.lm.engine.solvers.ball_model_minimizers, a round's at once) and the rest (the
    driver's time in the fits' generators less the ball steps: the projected-gradient norm, the line
    search's tests, the BFGS update, the finite checks, and each path's set-up, its Objective and
    curvature, which is device work). On a GPU both overlap the other half's pass."""
    advance, minimizers, spent = uph.lm.engine.lockstep._advance, uph.lm.engine.lockstep.ball_model_minimizers, {}

    def clocked(name, function):
        def call(*args):
            start = time.perf_counter()
            result = function(*args)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
            return result

        return call

    uph.lm.engine.lockstep._advance = clocked("advance", advance)
    uph.lm.engine.lockstep.ball_model_minimizers = clocked("ball", minimizers)
    try:
        order()
    finally:
        uph.lm.engine.lockstep._advance, uph.lm.engine.lockstep.ball_model_minimizers = advance, minimizers
    return spent.get("ball", 0.0), spent.get("advance", 0.0) - spent.get("ball", 0.0)


def timed(function, device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1600)
    parser.add_argument("--chunk", type=int, help="tokens per chunk (default: the device's; 1024 as on a GPU)")
    parser.add_argument("--ops", action="store_true", help="count the operations a round dispatches for 1 and 12 users")
    parser.add_argument(
        "--scale", type=float, default=0.3, help="--ops: the thetas' scale (large: tilts past EXP_SAFE)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.ops:
        counts = {}
        for stacked in (True, False):
            for k in (1, 12):
                head, tokens = users(args.vocab, args.hidden, k, args.tokens, device, args.chunk, stacked)
                counts[stacked, k] = ops_per_round(head, tokens, SolverSettings.defaults(), args.scale)
        print(f"ops per round: U=1 {counts[True, 1]}, U=12 {counts[True, 12]}")
        print(
            f"(not stacked, each user's evaluation dispatched on its own: U=1 {counts[False, 1]}, U=12 {counts[False, 12]})"
        )
        return
    head, tokens = users(args.vocab, args.hidden, args.users, args.tokens, device, args.chunk)
    _, stacked_tokens = users(args.vocab, args.hidden, args.users, args.tokens, device, args.chunk, "halves")
    settings = SolverSettings.defaults()
    rounds = []
    queue_round = uph.lm.engine.lockstep.queue_round
    uph.lm.engine.lockstep.queue_round = lambda requests: rounds.append(len(requests)) or queue_round(requests)

    def one_at_a_time():
        return [fit_path(t, head, "exact", settings, RADII) for t in tokens]

    def lockstep():
        return run_lockstep([fit_path_steps(t, head, "exact", settings, RADII) for t in tokens])

    def stacked():
        return run_lockstep([fit_path_steps(t, head, "exact", settings, RADII) for t in stacked_tokens])

    fit_path(tokens[0], head, "exact", settings, RADII[:2])  # warm-up: allocator, kernels
    stacked()
    measured = {}
    for label, order in [("one at a time", one_at_a_time), ("lockstep", lockstep), ("stacked", stacked)]:
        rounds.clear()
        seconds, paths = timed(order, device)
        measured[label] = (seconds, paths, len(rounds), device_reads(order))
    alone, together, batched = (measured[label][1] for label in ("one at a time", "lockstep", "stacked"))
    evaluations = sum(result.evaluations for path in alone for _, result in path)
    same = all(torch.equal(a, b) for path_a, path_b in zip(alone, together) for (a, _), (b, _) in zip(path_a, path_b))
    gap = max(
        abs(a.objective - b.objective) / abs(a.objective)
        for path_a, path_b in zip(alone, batched)
        for (_, a), (_, b) in zip(path_a, path_b)
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    chunk = len(tokens[0].chunks[0].targets)
    print(f"V {args.vocab}, H {args.hidden}, {args.users} users x {args.tokens} tokens in chunks of {chunk}, 9 radii")
    print(f"{evaluations} evaluations one at a time; rounds: queue_round's; reads back: counted in their device part")
    print(f"{'order':<14}{'wall s':>9}{'ms / evaluation':>17}{'rounds':>8}{'reads back':>12}")
    for label, (seconds, _, n_rounds, reads) in measured.items():
        print(f"{label:<14}{seconds:>9.2f}{1e3 * seconds / evaluations:>17.2f}{n_rounds:>8}{reads:>12}")
    alone_s = measured["one at a time"][0]
    print(f"lockstep / one at a time: {measured['lockstep'][0] / alone_s:.2f}; the same thetas: {same}")
    print(f"stacked / one at a time: {measured['stacked'][0] / alone_s:.2f}; objectives within {gap:.1e} (relative)")
    ball, rest = solver_seconds(stacked)
    print(
        f"stacked, the host's solver steps a fit-evaluation: ball steps {1e6 * ball / evaluations:.0f} us "
        f"(a round's at once), the rest {1e6 * rest / evaluations:.0f} us"
    )


if __name__ == "__main__":
    main()
