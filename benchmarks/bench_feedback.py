"""Cost of one training step of each learning rule, against torch autograd on the same network.

Run: .venv/bin/python benchmarks/bench_feedback.py [--steps 300] [--rounds 5]

The network and settings are the embedded default's (config.yaml's feedback section: context 16,
hidden [128, 128], batch 64, rank 32) on random text with the default's 81-character vocabulary,
one thread. Each rule runs through uph.feedback.training.train (forward, the true deltas for the
alignment measurement, the rule's deltas and feedback update, gradients, Adam); the reference is
autograd's backward with torch.optim.Adam. Besides the whole step, the part `train` times as the
rule's cost (forward pass and learning step, without the alignment measurement) is reported.
Every round runs each rule once, in a rotated order, so that load on a shared machine hits them
alike; the median over rounds is reported. Also timed: a fresh interpreter importing torch,
with and without constructing torch.optim.Adam (which imports torch._dynamo), the cost our
hand-written Adam saves every training job.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from uph.config import validate
from uph.feedback.char_lm import CharCorpus, CharMLP, sample_batch
from uph.feedback.training import METHODS, TrainConfig, train

VOCAB = 81
REPO = Path(__file__).resolve().parent.parent


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = torch.randint(VOCAB, (200_000,), generator=torch.Generator().manual_seed(0))
    corpus = CharCorpus("".join(chr(33 + i) for i in range(VOCAB)), tokens, tokens[:1000])
    section = validate(yaml.safe_load((REPO / "config.yaml").read_text()))["feedback"]
    config = dataclasses.replace(
        TrainConfig.from_config(section), steps=args.steps, log_every=args.steps, eval_windows=1
    )

    autograd_seconds(corpus, dataclasses.replace(config, steps=5))  # warm up autograd and torch.optim
    seconds = {name: [] for name in ("autograd + torch Adam", *METHODS)}
    timed = {name: [] for name in METHODS}  # the rule's own cost, as train times it (update_seconds)
    names = list(seconds)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # a new order every round
            start = time.perf_counter()
            if name in METHODS:
                timed[name].append(train(corpus, name, 0, config)["update_seconds"].iloc[-1])
            else:
                autograd_seconds(corpus, config)
            seconds[name].append(time.perf_counter() - start)

    reference = statistics.median(seconds["backprop"])
    own_reference = statistics.median(timed["backprop"])
    print(f"{'rule':<26}{'ms/step':>10}{'x backprop':>12}{'timed ms/step':>15}{'x backprop':>12}")
    for name, times in seconds.items():
        median = statistics.median(times)
        line = f"{name:<26}{1000 * median / args.steps:>10.2f}{median / reference:>12.2f}"
        if name in timed:
            own = statistics.median(timed[name])
            line += f"{1000 * own / args.steps:>15.2f}{own / own_reference:>12.2f}"
        print(line)

    plain = import_seconds("import torch")
    with_adam = import_seconds("import torch; torch.optim.Adam([torch.zeros(1, requires_grad=True)])")
    print(f"\n{'fresh interpreter':<40}{'s':>8}")
    print(f"{'import torch':<40}{plain:>8.2f}")
    print(f"{'import torch + torch.optim.Adam(...)':<40}{with_adam:>8.2f}")
    print(f"{'ratio':<40}{with_adam / plain:>8.2f}")


if __name__ == "__main__":
    main()
