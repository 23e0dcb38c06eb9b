"""The copy task's training step (uph.attention.copy_task.train_step) per attention kind, op by op.

    .venv/bin/python benchmarks/bench_copy_task.py [--config config.yaml] [--steps 50] [--repeats 3] [--threads 1]

For each kind of copy_task.attentions, seed 004's one-layer model trains on its batches as a copy_task_train
job does (one run, torch.optim.AdamW, the config's sizes): the median ms a step of `repeats` x `steps`
steps, then the same steps op by op (benchmarks/op_times.py): each kind of op's ms, what the step holds
outside aten (Python, autograd's engine, torch.optim's loop, the dispatch above aten), the products' MFLOP
and the rate they ran at, and the step against its floor at --peak GFLOP/s (a core's float32 product rate:
84 on the AMD EPYC, docs/performance.md). Then a job's parts besides its steps: one evaluation of a
logged step (curve_row) and the final evaluation (final_rows), in ms.
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
from uph.heap import keep_freed_memory


def train_steps(model, optimizer, batches: torch.Generator, cfg: CopyTaskConfig, autocast: dict, steps: int) -> None:
    """`steps` of a copy_task_train job's steps: a batch from `batches`, then train_step."""
    for _ in range(steps):
        inputs, targets = copy_batch(cfg.batch_size, cfg.train_len, cfg.vocab, batches)
        train_step(model, optimizer, inputs, targets, autocast)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["config.yaml"], help="config files, merged in order")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak", type=float, default=84.0, help="a core's float32 product rate, GFLOP/s")
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
