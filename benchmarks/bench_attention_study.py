"""One training step of the attention study's model per kind, side by side, at a config's sizes.

    .venv/bin/python benchmarks/bench_attention_study.py [--config config.yaml] [--steps 50] [--repeats 3]

A step is what uph.attention.training.train_run does between evaluations: a fresh loud_copy batch,
forward, cross-entropy, backward, gradient clipping, AdamW. Each kind of the config's
attention.attentions (and its models) runs `steps` steps per repeat; repeats interleave the kinds, so
machine load hits all alike; the median over repeats is printed in ms a step, with its ratio to
standard attention's. Times a run of the study: steps_run x this, plus the evaluations.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import yaml

from uph.attention.model import build_model
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.tasks import IGNORE, make_batch
from uph.config import validate


def step_time(cfg: AttentionStudyConfig, model_name: str, attention: str, steps: int) -> float:
    """Seconds a training step takes, mean over `steps` after one warm-up step."""
    torch.manual_seed(0)
    model = build_model(model_name, attention, cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=cfg.weight_decay)
    batches = torch.Generator().manual_seed(0)

    def step():
        batch = make_batch("loud_copy", cfg, cfg.batch_size, cfg.train_len, batches)
        logits = model(batch.inputs, batch.loud)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["config.yaml"], help="config files, merged in order")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = {}
    for path in args.config:
        for key, value in yaml.safe_load(open(path)).items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    validate(config)
    section = config["attention"]
    cfg = AttentionStudyConfig.from_config(section)
    cells = [(model, attention) for model in section["models"] for attention in section["attentions"]]
    times = {cell: [] for cell in cells}
    for _ in range(args.repeats):
        for cell in cells:
            times[cell].append(step_time(cfg, *cell, args.steps))
    print(
        f"batch {cfg.batch_size} x T {cfg.train_len}, d {cfg.d_model}, {cfg.n_head} heads, {cfg.n_layer} layers, "
        f"{args.threads} thread(s); median of {args.repeats} x {args.steps} steps"
    )
    print("| model | attention | ms a step | x standard |\n| --- | --- | ---: | ---: |")
    for model, attention in cells:
        ms = 1e3 * statistics.median(times[model, attention])
        reference = times.get((model, "standard"))
        ratio = f"{ms / (1e3 * statistics.median(reference)):.2f}" if reference else "-"
        print(f"| {model} | {attention} | {ms:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
