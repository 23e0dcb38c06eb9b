"""Users' fits one at a time against the same fits in lockstep (uph.lm.engine.lockstep), on any device.

Each user walks the validate job's path of radii (the default's 9, svd_cvh at d = 32, exact solver) on
its own tokens. One at a time, every evaluation is queued, read back and waited for before the solver's
next step; in lockstep, every user's next evaluation is queued back to back and read back once a round.

    .venv/bin/python benchmarks/bench_lockstep.py [--device cpu|cuda] [--vocab 49152] [--users 4] [--tokens 1600]
        [--chunk 1024] [--ops]

Two ways to read it. At the model's vocabulary on a CPU the kernels are the whole cost and the two
orders run at one speed (the same arithmetic). At a small vocabulary (`--vocab 512`) the kernels cost
next to nothing, and what is left (with `--chunk 1024`, a GPU's chunks) is the host's work per evaluation (the solver's step, the dispatch
of an evaluation's operations): the floor of a GPU evaluation run one at a time, where the host and the
device wait for each other, and the part a round overlaps with the device's work in lockstep. It also
counts the host reads of each order's device part (`device_reads`, in a second, untimed pass: every read of
a tensor's values to the host) beside the evaluations and lockstep rounds.

`--ops` prints instead how many operations one round dispatches (torch.profiler: the aten operations called
from Python, not those they call in turn) for 1 and for 12 users, one line: `ops per round: U=1 <n>, U=12 <n>`.
A round that stacks its users into one computation dispatches about as many for 12 as for 1; one that
dispatches each user's evaluation on its own, 12 times as many (each a kernel launch on a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch

import uph.lm.engine.lockstep
import uph.lm.engine.objective
from uph.device import count_host_reads
from uph.lm.data.models import OutputLayer
from uph.lm.engine.fit import fit_path, fit_path_steps
from uph.lm.engine.heads import HeadSettings, make_head
from uph.lm.engine.lockstep import run_lockstep
from uph.lm.engine.objective import Objective, evaluate_many
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import on_device, prepare

RADII = (0.05, 0.15, 0.5, 1.5, 5, 15, 50, 150, 500)  # config.yaml's fit.radii


def users(vocab: int, hidden: int, n_users: int, n_tokens: int, device, chunk: int | None = None):
    """(output layer, head, every user's tokens): a random output layer with an LM's logit scale, each
    user's hidden states tilted by a theta of its own, targets drawn from the tilted model."""
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(vocab, hidden, generator=generator) / hidden**0.5 * 4
    svd = torch.linalg.svd(W.double(), full_matrices=False)
    head = make_head("svd_cvh", W, d=32, alpha=1.0, settings=HeadSettings.defaults(), svd=svd)
    layer = on_device(OutputLayer(W), device)
    tokens = []
    for _ in range(n_users):
        h = torch.randn(n_tokens, hidden, generator=generator)
        star = 3 * torch.randn(32, generator=generator)
        probabilities = torch.softmax(head.logits(h, star), dim=-1)
        y = torch.multinomial(probabilities.float(), 1, generator=generator).squeeze(1)
        tokens.append(prepare(h, y, layer, chunk=chunk, device=device))
    return head, tokens


def device_reads(order) -> int:
    """How many times `order`'s evaluations read back to the host in their device part (every round's
    uph.lm.engine.objective._device_round: what a GPU waits on), counted by uph.device.count_host_reads; an
    untimed pass."""
    device_round, reads = uph.lm.engine.objective._device_round, []

    def counted(requests, need_grad):
        result, n = count_host_reads(device_round, requests, need_grad)
        reads.append(n)
        return result

    uph.lm.engine.objective._device_round = counted
    try:
        order()
    finally:
        uph.lm.engine.objective._device_round = device_round
    return sum(reads)


def ops_per_round(head, tokens, settings: SolverSettings) -> int:
    """The operations one round of evaluate_many dispatches for every user of `tokens` at a theta of its own
    (torch.profiler: aten operations without an aten parent), after an unprofiled round (warm-up)."""
    objectives = [Objective(t, head, settings.beta, settings.lam) for t in tokens]
    generator = torch.Generator().manual_seed(1)
    requests = [
        (objective, 0.3 * torch.randn(head.d, generator=generator, dtype=torch.float64)) for objective in objectives
    ]
    evaluate_many(requests)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        evaluate_many(requests)
    return sum(
        event.name.startswith("aten::") and not (event.cpu_parent and event.cpu_parent.name.startswith("aten::"))
        for event in profile.events()
    )


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
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.ops:
        head, tokens = users(args.vocab, args.hidden, 12, args.tokens, device, args.chunk)
        counts = {k: ops_per_round(head, tokens[:k], SolverSettings.defaults()) for k in (1, 12)}
        print(f"ops per round: U=1 {counts[1]}, U=12 {counts[12]}")
        return
    head, tokens = users(args.vocab, args.hidden, args.users, args.tokens, device, args.chunk)
    settings = SolverSettings.defaults()
    rounds = []
    evaluate_many = uph.lm.engine.lockstep.evaluate_many
    uph.lm.engine.lockstep.evaluate_many = lambda requests: rounds.append(len(requests)) or evaluate_many(requests)

    def one_at_a_time():
        return [fit_path(t, head, "exact", settings, RADII) for t in tokens]

    def lockstep():
        return run_lockstep([fit_path_steps(t, head, "exact", settings, RADII) for t in tokens])

    fit_path(tokens[0], head, "exact", settings, RADII[:2])  # warm-up: allocator, kernels
    rounds.clear()
    alone_s, alone = timed(one_at_a_time, device)
    alone_rounds = len(rounds)
    rounds.clear()
    together_s, together = timed(lockstep, device)
    together_rounds = len(rounds)
    alone_reads, together_reads = (device_reads(order) for order in (one_at_a_time, lockstep))
    evaluations = sum(result.evaluations for path in alone for _, result in path)
    same = all(torch.equal(a, b) for path_a, path_b in zip(alone, together) for (a, _), (b, _) in zip(path_a, path_b))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    chunk = len(tokens[0].chunks[0].targets)
    print(f"V {args.vocab}, H {args.hidden}, {args.users} users x {args.tokens} tokens in chunks of {chunk}, 9 radii")
    print(f"{evaluations} evaluations; rounds: evaluate_many's; reads back: counted in their device part")
    print(f"{'order':<14}{'wall s':>9}{'ms / evaluation':>17}{'rounds':>8}{'reads back':>12}")
    for order, seconds, n_rounds, reads in [
        ("one at a time", alone_s, alone_rounds, alone_reads),
        ("lockstep", together_s, together_rounds, together_reads),
    ]:
        print(f"{order:<14}{seconds:>9.2f}{1e3 * seconds / evaluations:>17.2f}{n_rounds:>8}{reads:>12}")
    print(f"lockstep / one at a time: {together_s / alone_s:.2f}; the same thetas: {same}")


if __name__ == "__main__":
    main()
