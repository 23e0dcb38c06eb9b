"""Training steps of the attention study's model per kind: R runs one at a time against R runs at once.

    .venv/bin/python benchmarks/bench_attention_study.py [--config config.yaml] [--runs 8] [--steps 20]
        [--repeats 3] [--threads 1] [--device cpu] [--profile | --batches | --compiled | --lr-job TASK KIND LR]

A step is one of uph.attention.training.train_runs (uph.attention.steps.TrainSteps): each run's fresh
loud_copy batch, forward, cross-entropy, backward, per-run gradient clipping, AdamW. For each kind of
the config's attention.attentions (and its models), `runs` runs train `steps` steps one at a time (R
one-run models, the straightforward way) and as one model of R runs, and on a GPU as
one model of R runs replayed from a CUDA graph (one launch a step, as train_runs steps there); repeats
interleave the kinds and the ways, so machine load hits all alike. Printed: the median ms per step of
the R runs each way, their ratios, and ms per run-step against standard attention's.

--batches instead prints what the host pays a step to draw each run's batch (make_batch from the run's own
generator, as train_runs does before every step, then host_batch's stacking into one [R, ...] batch, not
pinned), for each of the config's tasks: microseconds a run, the median of `repeats` x `steps` steps of
`runs` runs. On a GPU this is the host's part of a replayed step, beside the device's.

--compiled instead trains each kind's R runs eagerly and with the model under torch.compile (Inductor's
fused C++ on a CPU, forward and backward; the optimizer stays eager), side by side with repeats interleaved:
ms a run-step each way, their ratio, and the compile with its first step, paid once per kind and shape.

--profile instead prints a step profile per kind, one run alone and R at once, per run-step: the wall of
`steps` steps, then the same steps op by op (OpTimes, a TorchDispatchMode: each aten op timed around its own
call, its kernel, output allocation and dispatch below autograd; torch.profiler's own cost an op made its
figures several times the unprofiled step's). The ops' seconds by kind (products, elementwise, reductions
and softmax, copies and indexing, other), what the wall holds outside them (Python, autograd's engine, the
dispatch above aten), the products' FLOPs (torch.utils.flop_counter's count; the attention kernels' own
products included) and the rate they ran at, and the elementwise ops' bytes (their tensors in and out) a
second.

--lr-job TASK KIND LR instead runs an attention_lr job's training (uph.attention.training.train_lr on the
residual model, every seed of attention.seeds) and prints where its seconds go: the training steps
(TrainSteps), the host's batch draws (make_batch), the logging steps' evaluations (log_step), the rest; its
run-steps, steps and mean runs a step (runs leave the batch as they stop); and a digest of what it returns
(curves, sweep rows, best weights), so that two checkouts run side by side show whether a change kept every bit.

Every mode runs with uph.heap.keep_freed_memory, as a workflow job does.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections import defaultdict

import torch
import yaml
from op_times import KINDS, OpTimes

import uph.attention.training as training
from uph.attention.model import build_model
from uph.attention.runs import RunAdamW
from uph.attention.steps import WARMUP, TrainSteps, host_batch
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.tasks import make_batch
from uph.config import validate
from uph.heap import keep_freed_memory


class Runs:
    """`seeds` as one model of len(seeds) runs, each with its own batch stream, lr 1e-3; its steps those of
    train_runs (uph.attention.steps.TrainSteps), on a GPU replayed from a CUDA graph if `graphs`."""

    def __init__(self, cfg: AttentionStudyConfig, model_name: str, attention: str, seeds, device, graphs=False):
        self.cfg, self.device = cfg, device
        model = build_model(model_name, attention, cfg, list(seeds)).to(device)
        self.steps = TrainSteps(
            model, RunAdamW(model, [1e-3] * len(seeds), cfg.weight_decay), cfg.grad_clip, device, graphs
        )
        self.streams = [torch.Generator().manual_seed(seed) for seed in seeds]

    def step(self) -> None:
        cfg = self.cfg
        self.steps([make_batch("loud_copy", cfg, cfg.batch_size, cfg.train_len, g) for g in self.streams], 1.0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_time(groups: list[Runs], steps: int) -> float:
    """Seconds for one step of every group, mean over `steps` after the steps before a capture and the
    capturing one (eager, whether or not the groups capture)."""
    for _ in range(WARMUP + 1):
        for group in groups:
            group.step()
    sync(groups[0].device)
    start = time.perf_counter()
    for _ in range(steps):
        for group in groups:
            group.step()
    sync(groups[0].device)
    return (time.perf_counter() - start) / steps


def profile(group: Runs, steps: int) -> dict:
    """Per step: its wall (not timed op by op), aten ops, each kind of op's seconds and bytes (OpTimes), the
    products' FLOPs."""
    for _ in range(WARMUP + 1):
        group.step()
    wall = step_time([group], steps)
    with OpTimes() as ops:
        for _ in range(steps):
            group.step()
    return {
        "wall": wall,
        "ops": ops.ops / steps,
        "flops": ops.flops / steps,
        **{kind: seconds / steps for kind, seconds in ops.seconds.items()},
        **{f"{kind} bytes": size / steps for kind, size in ops.bytes.items()},
    }


def config_section(paths: list[str], name: str = "attention") -> dict:
    """The config files merged in order (a section's keys over the earlier file's), validated: section `name`."""
    config = {}
    for path in paths:
        for key, value in yaml.safe_load(open(path)).items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return validate(config)[name]


def batch_draws(cfg: AttentionStudyConfig, task: str, runs: int, steps: int, repeats: int) -> float:
    """Microseconds a run of one step's batches: each run's make_batch from its own generator, then
    host_batch (the median over `repeats` of `steps` steps, after 5 unmeasured)."""
    streams = [torch.Generator().manual_seed(seed) for seed in range(runs)]

    def draw():
        host_batch([make_batch(task, cfg, cfg.batch_size, cfg.train_len, stream) for stream in streams], pinned=False)

    for _ in range(5):
        draw()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            draw()
        times.append((time.perf_counter() - start) / steps / runs * 1e6)
    return statistics.median(times)


def compiled_times(cfg: AttentionStudyConfig, cell: tuple[str, str], runs: int, steps: int, repeats: int, device):
    """(eager, compiled) seconds a step of `runs` runs, medians over `repeats` interleaved, and the seconds the
    compile and its first step took."""
    eager, compiled = Runs(cfg, *cell, range(runs), device), Runs(cfg, *cell, range(runs), device)
    start = time.perf_counter()
    compiled.steps.model = torch.compile(compiled.steps.model)
    compiled.step()
    compile_seconds = time.perf_counter() - start
    times = defaultdict(list)
    for _ in range(repeats):
        for way, group in (("eager", eager), ("compiled", compiled)):
            times[way].append(step_time([group], steps))
    return statistics.median(times["eager"]), statistics.median(times["compiled"]), compile_seconds


def lr_job_parts(cfg: AttentionStudyConfig, task: str, kind: str, lr: float) -> None:
    """Print where train_lr's seconds go for one lr job: each part timed around its own calls."""
    spent = defaultdict(float)

    def timed(owner, name: str, part: str) -> None:
        function = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    timed(training.TrainSteps, "__call__", "training steps")
    timed(training, "make_batch", "batch draws")
    timed(training, "log_step", "logging steps' evaluations")
    start = time.perf_counter()
    curves, sweep, weights = training.train_lr(cfg, task, "residual", kind, lr, torch.device("cpu"))
    total = time.perf_counter() - start
    digest = hashlib.sha256()
    for table in (curves, sweep):
        digest.update(table.to_csv(float_format="%.17g").encode())
    for name in sorted(weights):
        digest.update(name.encode() + weights[name].numpy().tobytes())
    steps, run_steps = sweep["steps_run"].max(), sweep["steps_run"].sum()
    print(
        f"{task} {kind} lr {lr}, {torch.get_num_threads()} thread(s), torch {torch.__version__}: {total:.1f} s, "
        f"{run_steps} run-steps in {steps} steps ({run_steps / steps:.2f} runs a step)"
    )
    print("| part | s | share |\n| --- | ---: | ---: |")
    for part, seconds in [*spent.items(), ("the rest", total - sum(spent.values()))]:
        print(f"| {part} | {seconds:.1f} | {seconds / total:.1%} |")
    print(f"outputs' sha256: {digest.hexdigest()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["config.yaml"], help="config files, merged in order")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attentions", nargs="*", help="only these kinds (default: the config's)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--batches", action="store_true", help="the host's batch draws a step, per task")
    parser.add_argument("--compiled", action="store_true", help="eager against torch.compile, side by side")
    parser.add_argument("--lr-job", nargs=3, metavar=("TASK", "KIND", "LR"), help="where an lr job's seconds go")
    args = parser.parse_args()
    keep_freed_memory()  # as every workflow job (uph.job_start)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    section = config_section(args.config)
    cfg = AttentionStudyConfig.from_config(section)
    if args.lr_job:
        task, kind, lr = args.lr_job
        lr_job_parts(AttentionStudyConfig.from_config({**section, "tasks": [task]}), task, kind, float(lr))
        return
    cells = [(model, kind) for model in section["models"] for kind in args.attentions or section["attentions"]]
    seeds = range(args.runs)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"batch {cfg.batch_size} x T {cfg.train_len}, d {cfg.d_model}, {cfg.n_head} heads, {cfg.n_layer} layers, "
        f"{args.runs} runs, {args.threads} thread(s), {name}, torch {torch.__version__}"
    )
    if args.batches:
        print(f"host's batch draws a step, {args.runs} runs, median of {args.repeats} x {args.steps} steps")
        for task in section["tasks"]:
            print(f"{task}: {batch_draws(cfg, task, args.runs, args.steps, args.repeats):.0f} us a run")
        return
    if args.compiled:
        print(f"median of {args.repeats} x {args.steps} steps of all {args.runs} runs, eager and compiled interleaved")
        print(
            "| model | attention | eager ms a run-step | compiled ms a run-step | compiled / eager | compile and first step s |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for cell in cells:
            eager, compiled, seconds = compiled_times(cfg, cell, args.runs, args.steps, args.repeats, device)
            per_run = 1e3 / args.runs
            print(
                f"| {cell[0]} | {cell[1]} | {eager * per_run:.2f} | {compiled * per_run:.2f} | {compiled / eager:.2f} | "
                f"{seconds:.1f} |"
            )
        return
    if args.profile:
        print(
            f"per run-step: the wall of {args.steps} steps, then the same steps op by op (OpTimes: each aten op's own "
            "call, its kernel and allocation; the rest of the wall is Python, autograd and dispatch above aten)"
        )
        print(
            "| model | attention | runs at once | ms a run-step | aten ops a step | "
            + " | ".join(f"{k} ms" for k in KINDS)
            + " | outside aten ms | MFLOP | products GFLOP/s | elementwise GB/s |\n| --- | --- |"
            + " ---: |" * (7 + len(KINDS))
        )
        for model, kind in cells:
            for runs in (1, args.runs):
                p = profile(Runs(cfg, model, kind, range(runs), device), args.steps)
                inside = sum(p.get(k, 0.0) for k in KINDS)
                per_run = 1e3 / runs
                print(
                    f"| {model} | {kind} | {runs} | {p['wall'] * per_run:.2f} | {p['ops']:.0f} | "
                    + " | ".join(f"{p.get(k, 0.0) * per_run:.2f}" for k in KINDS)
                    + f" | {(p['wall'] - inside) * per_run:.2f} | {p['flops'] / runs / 1e6:.0f}"
                    + f" | {p['flops'] / 1e9 / max(p.get('products', 0), 1e-12):.1f}"
                    + f" | {p.get('elementwise bytes', 0) / 1e9 / max(p.get('elementwise', 0), 1e-12):.1f} |"
                )
        return
    times = defaultdict(list)
    for _ in range(args.repeats):
        for cell in cells:
            alone = [Runs(cfg, *cell, [seed], device) for seed in seeds]
            times[cell, "alone"].append(step_time(alone, args.steps))
            times[cell, "together"].append(step_time([Runs(cfg, *cell, seeds, device)], args.steps))
            if device.type == "cuda":
                times[cell, "graphed"].append(step_time([Runs(cfg, *cell, seeds, device, graphs=True)], args.steps))
    print(f"median of {args.repeats} x {args.steps} steps of all {args.runs} runs")
    graphed = device.type == "cuda"
    print(
        "| model | attention | one at a time ms | at once ms | at once / one at a time | ms a run-step at once | x standard |"
        + (" at once, one graph launch ms | graphed / at once |" if graphed else "")
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if graphed else ""))
    for model, kind in cells:
        alone, together = (1e3 * statistics.median(times[(model, kind), way]) for way in ("alone", "together"))
        reference = times.get(((model, "standard"), "together"))
        ratio = f"{together / (1e3 * statistics.median(reference)):.2f}" if reference else "-"
        line = (
            f"| {model} | {kind} | {alone:.1f} | {together:.1f} | {together / alone:.2f} | "
            f"{together / args.runs:.2f} | {ratio} |"
        )
        if graphed:
            replayed = 1e3 * statistics.median(times[(model, kind), "graphed"])
            line += f" {replayed:.2f} | {replayed / together:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
