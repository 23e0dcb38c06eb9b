"""The copy task's training step (uph.attention.copy_task.train_step) per attention kind, op by op.

    .venv/bin/python benchmarks/bench_copy_task.py [--config config.yaml] [--steps 50] [--repeats 3] [--threads 1]
        [--together R]

For each kind of copy_task.attentions, seed 004's one-layer model trains on its batches as a copy_task_train
job does (one run, torch.optim.AdamW, the config's sizes): the median ms a step of `repeats` x `steps`
steps, then the same steps op by op (benchmarks/op_times.py): each kind of op's ms, what the step holds
outside aten (Python, autograd's engine, torch.optim's loop, the dispatch above aten), the products' MFLOP
and the rate they ran at, and the step against its floor at --peak GFLOP/s (a core's float32 product rate:
84 on the AMD EPYC, docs/performance.md). Then a job's parts besides its steps: one evaluation of a
logged step (curve_row) and the final evaluation (final_rows), in ms.

--together R instead weighs training R seeds as one model of R runs (uph.attention.runs: RunAdamW, each
run's own batches and mean loss, as the attention study trains its runs) against R one-run models one
after another, as the jobs train them today: ms a step of all R each way, repeats interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_attention_study import config_section
from op_times import KINDS, OpTimes

from uph.attention.copy_task import (
    CopyTaskConfig,
    copy_batch,
    copy_eval_sets,
    curve_row,
    final_rows,
    train_step,
)
from uph.attention.model import OneLayerModel
from uph.attention.runs import RunAdamW, init_runs
from uph.attention.steps import run_losses
from uph.heap import keep_freed_memory


def train_steps(model, optimizer, batches: torch.Generator, cfg: CopyTaskConfig, autocast: dict, steps: int) -> None:
    """`steps` of a copy_task_train job's steps: a batch from `batches`, then train_step."""
    for _ in range(steps):
        inputs, targets = copy_batch(cfg.batch_size, cfg.train_len, cfg.vocab, batches)
        train_step(model, optimizer, inputs, targets, autocast)


def steps_together(model, optimizer: RunAdamW, streams, cfg: CopyTaskConfig, autocast: dict, steps: int) -> None:
    """`steps` steps of one model of R runs: each run's batch from its own stream, the sum of the runs' mean
    losses backward (run r's weights get run r's gradient), RunAdamW's step."""
    for _ in range(steps):
        batches = [copy_batch(cfg.batch_size, cfg.train_len, cfg.vocab, stream) for stream in streams]
        inputs, targets = (torch.stack(part) for part in zip(*batches))
        with torch.autocast(**autocast):
            logits = model(inputs)
        losses = run_losses(logits, targets)
        optimizer.zero_grad()
        losses.sum().backward()
        optimizer.step()


def ways_to_train(cfg: CopyTaskConfig, attention: str, runs: int, autocast: dict) -> dict:
    """way -> steps(n): n steps of `runs` seeds, "alone" as `runs` one-run models (torch.optim.AdamW) one after
    another, as copy_task_train jobs train them, or "together" as one model of `runs` runs."""
    alone = []
    for seed in range(runs):
        torch.manual_seed(seed)
        model = OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        alone.append((model, optimizer, torch.Generator().manual_seed(seed), cfg, autocast))
    model = OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention, runs)
    init_runs(model, list(range(runs)))
    optimizer = RunAdamW(model, [cfg.lr] * runs, cfg.weight_decay)
    streams = [torch.Generator().manual_seed(seed) for seed in range(runs)]
    return {
        "alone": lambda n: [train_steps(*run, n) for run in alone],
        "together": lambda n: steps_together(model, optimizer, streams, cfg, autocast, n),
    }


def together(cfg: CopyTaskConfig, attentions, runs: int, steps: int, repeats: int, autocast: dict) -> None:
    """Print ms a step of `runs` seeds one at a time (copy_task_train's way) and as one model, side by side."""
    print(f"median of {repeats} x {steps} steps of all {runs} seeds, the two ways interleaved")
    print("| attention | one at a time ms | one model of R runs ms | one model / one at a time |")
    print("| --- | ---: | ---: | ---: |")
    for attention in attentions:
        ways = ways_to_train(cfg, attention, runs, autocast)
        times = {way: [] for way in ways}
        for way in ways.values():
            way(5)
        for _ in range(repeats):
            for name, way in ways.items():
                start = time.perf_counter()
                way(steps)
                times[name].append((time.perf_counter() - start) / steps)
        one, many = (statistics.median(times[way]) * 1e3 for way in ways)
        print(f"| {attention} | {one:.2f} | {many:.2f} | {many / one:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["config.yaml"], help="config files, merged in order")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak", type=float, default=84.0, help="a core's float32 product rate, GFLOP/s")
    parser.add_argument("--together", type=int, metavar="R", help="R seeds as one model against one at a time")
    args = parser.parse_args()
    keep_freed_memory()  # as every workflow job (uph.job_start)
    torch.set_num_threads(args.threads)
    section = config_section(args.config, "copy_task")
    cfg = CopyTaskConfig.from_config(section)
    autocast = {"device_type": "cpu", "dtype": getattr(torch, cfg.dtype), "enabled": cfg.dtype != "float32"}
    print(
        f"batch {cfg.batch_size} x L {cfg.train_len}, d {cfg.d_model}, {cfg.n_head} heads, vocab {cfg.vocab}, "
        f"{args.threads} thread(s), torch {torch.__version__}; ms a step, median of {args.repeats} x {args.steps}"
    )
    if args.together:
        together(cfg, section["attentions"], args.together, args.steps, args.repeats, autocast)
        return
    print(
        "| attention | ms a step | aten ops | "
        + " | ".join(f"{kind} ms" for kind in KINDS)
        + " | outside aten ms | MFLOP | products GFLOP/s | step / floor | a logged step's evaluation ms |"
        + " final evaluation ms |\n| --- |"
        + " ---: |" * (8 + len(KINDS))
    )
    for attention in section["attentions"]:
        torch.manual_seed(0)
        model = OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        batches = torch.Generator().manual_seed(0)
        run = (model, optimizer, batches, cfg, autocast)
        train_steps(*run, 5)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            train_steps(*run, args.steps)
            times.append((time.perf_counter() - start) / args.steps)
        wall = statistics.median(times)
        with OpTimes() as ops:
            train_steps(*run, args.steps)
        inside = {kind: ops.seconds.get(kind, 0.0) / args.steps for kind in KINDS}
        flops = ops.flops / args.steps
        eval_sets = copy_eval_sets(cfg, 0, torch.device("cpu"))
        start = time.perf_counter()
        curve_row(model, eval_sets[cfg.train_len], cfg.batch_size, autocast, 1, 0.0)
        logged = time.perf_counter() - start
        start = time.perf_counter()
        final_rows(model, eval_sets, cfg, autocast, {})
        final = time.perf_counter() - start
        print(
            f"| {attention} | {wall * 1e3:.2f} | {ops.ops / args.steps:.0f} | "
            + " | ".join(f"{seconds * 1e3:.2f}" for seconds in inside.values())
            + f" | {(wall - sum(inside.values())) * 1e3:.2f} | {flops / 1e6:.0f}"
            + f" | {flops / 1e9 / max(inside['products'], 1e-12):.1f} | {wall / (flops / 1e9 / args.peak):.1f}"
            + f" | {logged * 1e3:.0f} | {final * 1e3:.0f} |"
        )


if __name__ == "__main__":
    main()
