"""Cost of the feedback branch's training: each learning rule's step against torch autograd, the step's floor,
a job's start-up, and a method's seeds batched as one model against one after another.

    .venv/bin/python benchmarks/bench_feedback.py [--steps 300] [--rounds 5]
    .venv/bin/python benchmarks/bench_feedback.py --profile [--roles results/corpus/roles.parquet]
    .venv/bin/python benchmarks/bench_feedback.py --batched [--seeds 10] [--steps 300] [--rounds 3]

The network and settings are the embedded default's (config.yaml's feedback section: context 16, hidden
[128, 128], batch 64, rank 32) on random text with the default's 81-character vocabulary, one thread.

Default: each rule runs through uph.feedback.training.train (forward, the true deltas for the alignment
measurement, the rule's deltas and feedback update, gradients, Adam); the reference is autograd's backward
with torch.optim.Adam. Besides the whole step, the part `train` times as the rule's cost (forward pass and
learning step, without the alignment measurement) is reported. Every round runs each rule once, in a rotated
order, so that load on a shared machine hits them alike; the median over rounds is reported. Also timed: a
fresh interpreter importing torch, with and without constructing torch.optim.Adam (which imports
torch._dynamo), the cost our hand-written Adam saves every training job.

--profile: what a step computes and what it costs at least. Per rule, one step's matrix products in FLOP
(torch's FlopCounterMode: mm, addmm, bmm) and its aten operations (a TorchDispatchMode counting every call),
for the part `train` times and for the whole step (with the alignment reference, the batch draw and the
metrics), beside the measured milliseconds of each (median of --rounds runs of --steps steps). Then the
floor's parts, each timed alone: the step's products replayed on tensors of their shapes (the rate these
small shapes reach); Adam over the 192,977 parameters as uph.optim.Adam does it (seven elementwise passes)
and one pass over them (p += g: a fused Adam moves 7 / 3 of its bytes); one trivial operation (what each
of the step's operations costs at least, its dispatch); E's rows read and written as the network does it
(index_select, index_add_) and as pair-indexing did (E[t, x], index_put_); one evaluation of the held-out
windows. The floor of a step is its products plus a fused Adam; of a run, its steps' floor. Last, a job's
start-up in fresh interpreters: Python alone, `import uph.job_start` and torch, and, with --roles (a
corpus_roles output), the feedback_train script's preamble: its imports, the roles file read and joined,
the text encoded (uph.feedback.char_lm.char_corpus).

--batched: --seeds seeds of backprop as one model, every weight with a leading seed axis and the products
batched (bmm), against the same seeds trained one after another by `train` as a job does; each seed's
initial network and batches are its own either way, so only the summation order of the products differs.
Two variants: one Adam over the stacked weights, and one Adam per seed over its slices (the stacked E
outgrows the cache). Reported: milliseconds per seed and step of each (median over rounds, rotated
order) and their ratio to one after another, and how far the batched training losses and held-out
losses of a short run move from `train`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from uph.config import validate
from uph.feedback.char_lm import CharCorpus, CharMLP, evenly_spaced_windows, output_error, rows, sample_batch
from uph.feedback.training import METHODS, Batch, TrainConfig, evaluate, learn, make_method, step_metrics, train
from uph.optim import Adam

VOCAB = 81
REPO = Path(__file__).resolve().parent.parent
PRODUCTS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


def autograd_seconds(corpus: CharCorpus, config: TrainConfig) -> float:
    """Wall time of `config.steps` autograd steps with torch.optim.Adam."""
    model = CharMLP(VOCAB, config.context, list(config.hidden), torch.Generator().manual_seed(0))
    params = [p.requires_grad_() for p in model.params]
    optimizer = torch.optim.Adam(params, lr=config.lr)
    batches = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for _ in range(config.steps):
        x, y = sample_batch(corpus.train, config.context, config.batch_size, batches)
        optimizer.zero_grad()
        F.cross_entropy(model.forward(x)[1], y).backward()
        optimizer.step()
    return time.perf_counter() - start


def import_seconds(code: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def rotated(names: list, round_: int) -> list:
    """`names` starting at a new one every round, so that load on a shared machine hits them alike."""
    return names[round_ % len(names) :] + names[: round_ % len(names)]


def timed(fn, repeats: int, rounds: int = 5) -> float:
    """Median over rounds of fn's seconds a call, after a warm-up."""
    for _ in range(max(repeats // 10, 3)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats)
    return statistics.median(times)


def rules_against_autograd(corpus: CharCorpus, config: TrainConfig, args) -> None:
    autograd_seconds(corpus, dataclasses.replace(config, steps=5))  # warm up autograd and torch.optim
    seconds = {name: [] for name in ("autograd + torch Adam", *METHODS)}
    timed_part = {name: [] for name in METHODS}  # the rule's own cost, as train times it (update_seconds)
    for round_ in range(args.rounds):
        for name in rotated(list(seconds), round_):
            start = time.perf_counter()
            if name in METHODS:
                timed_part[name].append(train(corpus, name, 0, config)["update_seconds"].iloc[-1])
            else:
                autograd_seconds(corpus, config)
            seconds[name].append(time.perf_counter() - start)

    reference = statistics.median(seconds["backprop"])
    own_reference = statistics.median(timed_part["backprop"])
    print(f"{'rule':<26}{'ms/step':>10}{'x backprop':>12}{'timed ms/step':>15}{'x backprop':>12}")
    for name, times in seconds.items():
        median = statistics.median(times)
        line = f"{name:<26}{1000 * median / args.steps:>10.2f}{median / reference:>12.2f}"
        if name in timed_part:
            own = statistics.median(timed_part[name])
            line += f"{1000 * own / args.steps:>15.2f}{own / own_reference:>12.2f}"
        print(line)

    plain = import_seconds("import torch")
    with_adam = import_seconds("import torch; torch.optim.Adam([torch.zeros(1, requires_grad=True)])")
    print(f"\n{'fresh interpreter':<40}{'s':>8}")
    print(f"{'import torch':<40}{plain:>8.2f}")
    print(f"{'import torch + torch.optim.Adam(...)':<40}{with_adam:>8.2f}")
    print(f"{'ratio':<40}{with_adam / plain:>8.2f}")


# --- --profile: the floor ------------------------------------------------------------------------------


class Operations(TorchDispatchMode):
    """Counts the aten operations run under it, and records the products' operand shapes."""

    def __init__(self):
        super().__init__()
        self.count, self.products = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        if str(func.overloadpacket) in PRODUCTS:
            self.products.append((func, [a.shape if isinstance(a, torch.Tensor) else a for a in args]))
        return func(*args, **(kwargs or {}))


class Part:
    """The operations and products' FLOP of the code run under it, added over its uses."""

    def __init__(self):
        self.count, self.products, self.flop = 0, [], 0

    def __call__(self, fn):
        with Operations() as operations, FlopCounterMode(display=False) as flops:
            result = fn()
        self.count, self.products = self.count + operations.count, self.products + operations.products
        self.flop += flops.get_total_flops()
        return result


def one_step(model, rule, optimizer, corpus, config, batches) -> tuple[Part, Part]:
    """One training step as `train` runs it, in two parts: the one it times (forward pass, learning step) and
    the rest (the batch's draw, the alignment reference, the metrics)."""
    timed_part, rest = Part(), Part()
    x, y = rest(lambda: sample_batch(corpus.train, config.context, config.batch_size, batches))
    hs, z = timed_part(lambda: model.forward(x))
    batch = timed_part(lambda: Batch(x, y, hs, z, output_error(z, y)))
    true = rest(lambda: model.backprop_deltas(hs, batch.e))
    deltas, diagnostics = timed_part(lambda: learn(model, rule, optimizer, batch))
    rest(lambda: step_metrics(F.cross_entropy(batch.z, y).item(), batch, deltas, true, diagnostics))
    return timed_part, rest


def replay_seconds(products: list) -> float:
    """Seconds a call of the recorded products, on random tensors of their shapes."""
    calls = [
        (func, [torch.randn(a) if isinstance(a, torch.Size) else a for a in operands]) for func, operands in products
    ]

    def run():
        for func, operands in calls:
            func(*operands)

    return timed(run, 500)


def fresh_seconds(code: str, repeats: int = 3) -> dict:
    """Median over fresh interpreters of the seconds `code` reports (a JSON dict it prints last), and of the
    whole process."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
        runs.append({"process": time.perf_counter() - start, **json.loads(out.stdout.splitlines()[-1])})
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


STARTUP = """
import json, time
start = time.perf_counter()
import uph.job_start
import torch
imported = time.perf_counter()
times = {"import uph.job_start, torch": imported - start}
ROLES = ROLES_PATH
if ROLES:
    from uph.artifacts import ROLES_FILE
    from uph.device import job_device, resolve_device
    from uph.feedback.char_lm import char_corpus
    from uph.feedback.training import TrainConfig, train_seeds
    from uph.io import write_parquet
    from uph.logs import rule_logging
    scripts = time.perf_counter()
    text = "\\n".join(ROLES_FILE.read_parquet(ROLES)["text"])
    read = time.perf_counter()
    corpus = char_corpus(text, 0.1, 16)
    times.update({"the script's other imports": scripts - imported, "roles read and joined": read - scripts,
                  "text encoded": time.perf_counter() - read, "characters": len(text)})
print(json.dumps(times))
"""


def profile(corpus: CharCorpus, config: TrainConfig, eval_windows: int, args) -> None:
    print(f"one step at the default's sizes, one thread ({torch.__version__})")
    print(
        f"{'rule':<26}{'products MFLOP':>16}{'aten ops':>14}{'ms/step':>16}{'products alone':>18}"
        f"\n{'':<26}{'timed / step':>16}{'timed / step':>14}{'timed / step':>16}{'us, GFLOP/s':>18}"
    )
    measured = {name: [] for name in METHODS}
    for round_ in range(args.rounds):
        for name in rotated(list(METHODS), round_):
            run = train(corpus, name, 0, config)
            measured[name].append((run["update_seconds"].iloc[-1], run["seconds"].iloc[-1]))
    for name in METHODS:
        model = CharMLP(VOCAB, config.context, list(config.hidden), torch.Generator().manual_seed(0))
        rule = make_method(name, VOCAB, config, torch.Generator().manual_seed(1))
        optimizer, batches = Adam(model.params, lr=config.lr), torch.Generator().manual_seed(2)
        for _ in range(3):
            one_step(model, rule, optimizer, corpus, config, batches)
        timed_part, rest = one_step(model, rule, optimizer, corpus, config, batches)
        seconds = replay_seconds(timed_part.products)
        timed_ms, step_ms = (1000 * statistics.median(m[i] for m in measured[name]) / config.steps for i in (0, 1))
        print(
            f"{name:<26}{timed_part.flop / 1e6:>8.2f} / {(timed_part.flop + rest.flop) / 1e6:>5.2f}"
            f"{timed_part.count:>8} / {timed_part.count + rest.count:>3}"
            f"{timed_ms:>9.2f} / {step_ms:>4.2f}{1e6 * seconds:>10.0f}, {timed_part.flop / seconds / 1e9:>5.1f}"
        )

    model = CharMLP(VOCAB, config.context, list(config.hidden), torch.Generator().manual_seed(0))
    params = model.params
    grads = [torch.randn_like(p) for p in params]
    adam = Adam(params, lr=config.lr)
    adam_s = timed(lambda: adam.step(grads), 300)
    one_pass_s = timed(lambda: [p.add_(g, alpha=1e-9) for p, g in zip(params, grads)], 300)
    tiny = torch.zeros(4)
    op_s = timed(lambda: tiny.add(1.0), 20000)
    n, context, (d_1, *_) = config.batch_size, config.context, config.hidden
    x = sample_batch(corpus.train, context, n, torch.Generator().manual_seed(3))[0]
    E, da = params[0], torch.randn(n, d_1)
    positions = torch.arange(context)
    reads = {
        "rows (index_select)": lambda: E.view(-1, d_1).index_select(0, rows(x, VOCAB)),
        "pairs (E[t, x])": lambda: E[positions, x],
    }

    def by_rows():
        per_row = (da / n)[:, None, :].expand(n, context, d_1).reshape(n * context, d_1)
        torch.zeros_like(E).view(-1, d_1).index_add_(0, rows(x, VOCAB), per_row)

    def by_pairs():
        dE = torch.zeros_like(E)
        dE.index_put_((positions.expand(n, context), x), da[:, None, :].expand(n, context, -1) / n, accumulate=True)

    writes = {"rows (index_add_)": by_rows, "pairs (index_put_)": by_pairs}
    windows = evenly_spaced_windows(corpus.test, context, eval_windows)
    eval_s = timed(lambda: evaluate(model, *windows), 5, rounds=3)
    print(f"\n{'the floor, one thread':<58}{'us':>8}")
    print(f"{'Adam, uph.optim.Adam (7 passes over 192,977 parameters)':<58}{1e6 * adam_s:>8.0f}")
    print(f"{'one pass over them (p += g); a fused Adam: 7/3 of it':<58}{1e6 * one_pass_s:>8.0f}")
    print(f"{'one trivial operation (4 floats + 1): per-op cost':<58}{1e6 * op_s:>8.1f}")
    for name, fn in {
        **{f"E read by {k}": v for k, v in reads.items()},
        **{f"dE by {k}": v for k, v in writes.items()},
    }.items():
        print(f"{name:<58}{1e6 * timed(fn, 500):>8.0f}")
    print(f"{f'one evaluation of {len(windows[1])} held-out windows':<58}{1e6 * eval_s:>8.0f}")

    roles = str(Path(args.roles).resolve()) if args.roles and Path(args.roles).exists() else ""
    code = STARTUP.replace("ROLES_PATH", repr(roles))
    python = fresh_seconds("import json; print(json.dumps({}))")
    startup = fresh_seconds(code)
    print(f"\n{'start-up, fresh interpreters (median of 3)':<58}{'s':>8}")
    print(f"{'python -c (nothing)':<58}{python['process']:>8.2f}")
    for key, value in startup.items():
        if key == "characters":
            print(f"{'(the roles text, characters)':<58}{value:>8.0f}")
        elif key != "process":
            print(f"{key:<58}{value:>8.2f}")
    print(f"{'the whole process':<58}{startup['process']:>8.2f}")
    if not args.roles or not Path(args.roles).exists():
        print(f"(no roles file at {args.roles}: the script's preamble is not timed)")


# --- --batched: a method's seeds as one model -------------------------------------------------------------


def batched_backprop(corpus: CharCorpus, config: TrainConfig, seeds: list[int], per_seed_adam: bool) -> dict:
    """`seeds` trained with backprop as one model: each weight stacked over the seeds, products batched (bmm),
    each seed's initial network and batches its own (as `train` draws them). Returns the per-step mean
    training loss of each seed (a list per seed) and its held-out loss at the end."""
    context, hidden, n, vocab = config.context, list(config.hidden), config.batch_size, VOCAB
    count = len(seeds)
    models = [CharMLP(vocab, context, hidden, torch.Generator().manual_seed(seed)) for seed in seeds]
    params = [torch.stack(ps).contiguous() for ps in zip(*(m.params for m in models))]
    if per_seed_adam:
        optimizers = [Adam([p[s] for p in params], lr=config.lr) for s in range(count)]
    else:
        optimizers = [Adam(params, lr=config.lr)]
    draws = [torch.Generator().manual_seed(seed + 2_000_000) for seed in seeds]
    offsets = (torch.arange(count) * context * vocab)[:, None]
    losses = []
    E, b_1 = params[0], params[1]
    layers = list(zip(params[2:-2:2], params[3:-2:2]))
    W_out, b_out = params[-2:]
    d_1 = hidden[0]

    def forward(x):  # x (S, N, T)
        index = (x.reshape(count, -1) + (vocab * torch.arange(context)).repeat(x.shape[1]) + offsets).reshape(-1)
        h = torch.tanh(E.view(-1, d_1).index_select(0, index).view(*x.shape, d_1).sum(2) + b_1[:, None])
        hs = [h]
        for W, b in layers:
            h = torch.tanh(torch.baddbmm(b[:, None], h, W.transpose(1, 2)))
            hs.append(h)
        return hs, torch.baddbmm(b_out[:, None], h, W_out.transpose(1, 2)), index

    for _ in range(config.steps):
        x, y = (torch.stack(t) for t in zip(*(sample_batch(corpus.train, context, n, g) for g in draws)))
        hs, z, index = forward(x)
        e = torch.softmax(z, -1)
        e.view(-1, vocab)[torch.arange(count * n), y.reshape(-1)] -= 1
        g = torch.bmm(e, W_out)
        deltas = [g]
        for (W, _), h in zip(reversed(layers), reversed(hs[1:])):
            g = torch.bmm(g * (1 - h * h), W)
            deltas.append(g)
        deltas = deltas[::-1]
        true = [d.clone() for d in deltas]  # the alignment reference: backprop's own deltas
        da = [delta * (1 - h * h) for delta, h in zip(deltas, hs)]
        dE = torch.zeros_like(E)
        per_row = (da[0] / n)[:, :, None, :].expand(count, n, context, d_1).reshape(-1, d_1)
        dE.view(-1, d_1).index_add_(0, index, per_row)
        grads = [dE, da[0].mean(1)]
        for da_l, h_below in zip(da[1:], hs):
            grads += [torch.bmm(da_l.transpose(1, 2), h_below) / n, da_l.mean(1)]
        grads += [torch.bmm(e.transpose(1, 2), hs[-1]) / n, e.mean(1)]
        if per_seed_adam:
            for s, optimizer in enumerate(optimizers):
                optimizer.step([grad[s] for grad in grads])
        else:
            optimizers[0].step(grads)
        loss = F.cross_entropy(z.reshape(-1, vocab), y.reshape(-1), reduction="none").view(count, n).mean(1)
        accuracy = (z.argmax(-1) == y).float().mean(1)
        alignment = [F.cosine_similarity(d, t, dim=2, eps=1e-12).mean(1) for d, t in zip(deltas, true)]
        losses.append(torch.stack([loss, accuracy, *alignment], 1).tolist())  # one read a step, as train's rows
    x_test, y_test = evenly_spaced_windows(corpus.test, context, config.eval_windows)
    with torch.no_grad():
        _, z, _ = forward(x_test.expand(count, *x_test.shape))
        test = F.cross_entropy(z.reshape(-1, vocab), y_test.repeat(count), reduction="none").view(count, -1).mean(1)
    return {"train_loss": [[step[s][0] for step in losses] for s in range(count)], "test_loss": test.tolist()}


def batched(corpus: CharCorpus, config: TrainConfig, args) -> None:
    seeds = list(range(args.seeds))
    ways = {
        "one after another (train)": lambda: [train(corpus, "backprop", seed, config) for seed in seeds],
        "batched, one Adam": lambda: batched_backprop(corpus, config, seeds, per_seed_adam=False),
        "batched, an Adam per seed": lambda: batched_backprop(corpus, config, seeds, per_seed_adam=True),
    }
    warm = dataclasses.replace(config, steps=5, log_every=5)
    train(corpus, "backprop", 0, warm)
    batched_backprop(corpus, warm, seeds, per_seed_adam=False)
    seconds = {name: [] for name in ways}
    for round_ in range(args.rounds):
        for name in rotated(list(ways), round_):
            start = time.perf_counter()
            ways[name]()
            seconds[name].append(time.perf_counter() - start)
    reference = statistics.median(seconds["one after another (train)"])
    print(f"backprop, {args.seeds} seeds x {config.steps} steps, one thread ({torch.__version__})")
    print(f"{'':<30}{'ms per seed-step':>18}{'x one after another':>22}")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"{name:<30}{1000 * median / config.steps / args.seeds:>18.3f}{median / reference:>22.2f}")

    short = dataclasses.replace(config, steps=min(config.steps, 200), log_every=1, eval_windows=256)
    alone = [train(corpus, "backprop", seed, short) for seed in seeds]
    together = batched_backprop(corpus, short, seeds, per_seed_adam=True)
    train_moves = max(
        abs(a - b) / abs(a)
        for run, losses in zip(alone, together["train_loss"])
        for a, b in zip(run["train_loss"], losses)
    )
    test_moves = max(
        abs(run["test_loss"].iloc[-1] - b) / run["test_loss"].iloc[-1] for run, b in zip(alone, together["test_loss"])
    )
    print(
        f"\nafter {short.steps} steps, batched against train (each seed): training loss moves by at most "
        f"{train_moves:.1e} (relative, any step), the final held-out loss by {test_moves:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="the step's floor and a job's start-up")
    parser.add_argument("--roles", default="results/corpus/roles.parquet", help="--profile: a corpus_roles output")
    parser.add_argument("--batched", action="store_true", help="backprop's seeds as one model, against one by one")
    parser.add_argument("--seeds", type=int, default=10, help="--batched: seeds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = torch.randint(VOCAB, (200_000,), generator=torch.Generator().manual_seed(0))
    corpus = CharCorpus("".join(chr(33 + i) for i in range(VOCAB)), tokens, tokens[:10_000])
    section = validate(yaml.safe_load((REPO / "config.yaml").read_text()))["feedback"]
    config = dataclasses.replace(
        TrainConfig.from_config(section), steps=args.steps, log_every=args.steps, eval_windows=1
    )
    if args.profile:
        profile(corpus, config, section["eval_windows"], args)
        print(f"(a run: {section['steps']} steps, a curve row every {section['log_every']} with an evaluation)")
    elif args.batched:
        batched(corpus, dataclasses.replace(config, eval_windows=section["eval_windows"]), args)
    else:
        rules_against_autograd(corpus, config, args)


if __name__ == "__main__":
    main()
