"""The cross-user matrix's scoring: every theta on one text in one pass over its p0 (HeldOut.many)
against one theta at a time (HeldOut per theta, the landed cross_user job), side by side in one
process on the same tokens, head and thetas; max |Δ NLL| between the two is printed too.

Per theta and token the work is the same, two [d] x [d, V] products and V exps (the FLOP floor:
2 d V per theta and token, plus V exp2), so the gain is in how it runs: one [V_block, d] x [d, G c]
product per vocabulary block instead of K small ones, and one pass over p0 instead of K.

    .venv/bin/python benchmarks/bench_cross_user.py [--vocab 49152] [--hidden 576] [--tokens 512]
        [--thetas 64] [--d 32] [--threads 1]

The default sizes are SmolLM2-135M's lm_head with a held-out split of about the default study's size;
W, the hidden states and the thetas are random (timing only depends on the shapes).
"""

from __future__ import annotations

import argparse
import time

import torch

from uph.lm.data.models import OutputLayer
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.heads import HeadSettings, make_head
from uph.lm.engine.tokens import prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--thetas", type=int, default=64)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(args.vocab, args.hidden, generator=generator) / args.hidden**0.5
    hidden = torch.randn(args.tokens, args.hidden, generator=generator) * 3
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    tokens = prepare(hidden, targets, OutputLayer(W))
    svd = torch.linalg.svd(W, full_matrices=False)
    thetas = torch.randn(args.thetas, args.d, dtype=torch.float64, generator=generator)
    print(f"V {args.vocab}, H {args.hidden}, {args.tokens} tokens, {args.thetas} thetas, {args.threads} thread(s)")
    for name in ("svd_cvh", "svd_uncond"):
        head = make_head(name, W, d=args.d, alpha=0.1, settings=HeadSettings.defaults(), svd=svd)
        held_out = HeldOut(tokens, head)
        start = time.perf_counter()
        one = [held_out(theta)["nll"] for theta in thetas]
        one_seconds = time.perf_counter() - start
        start = time.perf_counter()
        many = [score["nll"] for score in held_out.many(thetas)]
        many_seconds = time.perf_counter() - start
        difference = max(abs(a - b) for a, b in zip(one, many))
        print(
            f"{name}: one at a time {one_seconds / args.thetas * 1e3:.2f} ms/theta, all in one pass "
            f"{many_seconds / args.thetas * 1e3:.2f} ms/theta: x{one_seconds / many_seconds:.2f}; "
            f"max |Δ NLL| {difference:.1e}"
        )


if __name__ == "__main__":
    main()
