"""One evaluation of the fit objective J(theta) with its gradient (uph.lm.engine.objective.Objective), per kind of head.

A synthetic model of SmolLM2-135M's size (V = 49152, H = 576; random W, hidden states and targets: the
cost depends on the sizes only), one user's tokens prepared once, then evaluations at random thetas:
a conditional head (svd_cvh: two [c, d]x[d, V] products and an exp per chunk), an unconditional one
(svd_uncond: two passes over p0) and the full-vocabulary bias (d = V). The median of --repeats.

    OMP_WAIT_POLICY=passive .venv/bin/python benchmarks/bench_objective.py [--tokens 2048] [--d 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from uph.device import resolve_device
from uph.lm.data.models import OutputLayer
from uph.lm.engine.heads import HeadSettings, full_bias_head, make_head
from uph.lm.engine.objective import Objective
from uph.lm.engine.tokens import on_device, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(args.vocab, args.hidden, generator=generator) / args.hidden**0.5
    hidden = torch.randn(args.tokens, args.hidden, generator=generator) * 3
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)

    def wait():
        if device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    tokens = prepare(hidden, targets, on_device(OutputLayer(W), device), device=device)
    wait()
    print(
        f"V {args.vocab}, H {args.hidden}, {args.tokens} tokens in {len(tokens.chunks)} chunks on {device}, "
        f"{torch.get_num_threads()} thread(s); prepare {time.perf_counter() - start:.2f} s"
    )
    svd = torch.linalg.svd(W, full_matrices=False)
    settings = HeadSettings.defaults()
    heads = {
        name: make_head(name, W, d=args.d, alpha=0.5, settings=settings, svd=svd) for name in ("svd_cvh", "svd_uncond")
    }
    heads["full_bias"] = full_bias_head(W)
    for name, head in heads.items():
        objective = Objective(tokens, head, beta=0.05, lam=1e-4)
        thetas = 0.5 * torch.randn(args.repeats + 1, head.d, dtype=torch.float64, generator=generator)
        objective(thetas[0])  # warm-up
        seconds = []
        for theta in thetas[1:]:
            start = time.perf_counter()
            objective(theta)
            seconds.append(time.perf_counter() - start)
        print(f"{name:<12} d={head.d:<6} {1e3 * statistics.median(seconds):8.1f} ms per evaluation (median)")


if __name__ == "__main__":
    main()
