"""Forward + backward time and memory of causal attention kernels, side by side in one run.

    .venv/bin/python benchmarks/bench_attention.py [--threads 1] [--device cpu] [--lengths 64 128 256 512]

Kernels on the same q, k, r, v [batch, heads, T, D] (RoPE left out: it is the same for all):
  triple          the project's triple-product attention (uph.attention.self_attention.triple_product_attention)
  triple_literal  seed 004's formulation: five materialized T×T terms, autograd through them
  simplicial      the project's 2-simplicial attention (uph.attention.self_attention.simplicial_attention)
  simplicial_literal  the T×T×T score tensor by einsum, masked softmax over key pairs, autograd
                  (only up to --literal-max T: its memory grows as T³)
  standard_seed   seed 004's standard attention: materialized scores, tril mask, softmax
  sdpa            torch's scaled_dot_product_attention(is_causal=True), for reference
Time: median over interleaved repeats (each repeat runs every kernel once, so machine load hits
all alike). Memory: peak allocated bytes above the inputs during forward + backward, from the
allocation and free events that torch.profiler(profile_memory=True) records on CPU (on CUDA,
torch.cuda.max_memory_allocated); and the bytes the forward keeps for backward (unique storages
seen by torch.autograd.graph.saved_tensors_hooks).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from uph.attention.self_attention import simplicial_attention, triple_product_attention


def _causal_mask(T, device):
    return torch.tril(torch.ones(T, T, device=device)).view(1, 1, T, T)


def triple_literal(q, k, r, v):
    """Seed 004's TripleProductAttention after the projections and RoPE, as the seed writes it."""
    T = q.shape[-2]
    d_qq = (q * q).sum(dim=-1, keepdim=True)
    d_rr = (r * r).sum(dim=-1, keepdim=True)
    d_rq = (r * q).sum(dim=-1, keepdim=True)
    d_kk = (k * k).sum(dim=-1, keepdim=True).transpose(-2, -1)
    d_qk = q @ k.transpose(-2, -1)
    d_rk = r @ k.transpose(-2, -1)
    gram_det = d_qq * d_kk * d_rr + 2.0 * d_qk * d_rk * d_rq - d_qq * d_rk**2 - d_kk * d_rq**2 - d_rr * d_qk**2
    scores = -gram_det / q.shape[-1] ** 1.5
    scores = scores.masked_fill(_causal_mask(T, q.device) == 0, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def standard_seed(q, k, r, v):
    """Seed 004's StandardAttention after the projections and RoPE (r unused)."""
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(_causal_mask(T, q.device)[0, 0] == 0, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def sdpa(q, k, r, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def simplicial_literal(q, k, r, v):
    """softmax over key pairs (j, l <= i) of Σ_d q_id k_jd r_ld / sqrt(D), values v_j, from the whole cube."""
    T, D = q.shape[-2:]
    scores = torch.einsum("...id,...jd,...ld->...ijl", q, k, r) / math.sqrt(D)
    i = torch.arange(T, device=q.device)
    future = (i[None, :, None] > i[:, None, None]) | (i[None, None, :] > i[:, None, None])
    weights = F.softmax(scores.masked_fill(future, float("-inf")).flatten(-2), dim=-1).view(scores.shape)
    return torch.einsum("...ijl,...jd->...id", weights, v)


KERNELS = {
    "triple": lambda q, k, r, v: triple_product_attention(q, k, r, v),
    "triple_literal": triple_literal,
    "simplicial": lambda q, k, r, v: simplicial_attention(q, k, r, v),
    "simplicial_literal": simplicial_literal,
    "standard_seed": standard_seed,
    "sdpa": sdpa,
}


def forward_backward(kernel, inputs, weights):
    out = kernel(*inputs)
    torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)


def seconds(kernel, inputs, weights) -> float:
    sync = torch.cuda.synchronize if inputs[0].is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    forward_backward(kernel, inputs, weights)
    sync()
    return time.perf_counter() - start


def peak_bytes(kernel, inputs, weights) -> int:
    """Peak allocated bytes above the starting point during one forward + backward."""
    if inputs[0].is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward_backward(kernel, inputs, weights)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward_backward(kernel, inputs, weights)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def saved_bytes(kernel, inputs) -> int:
    """Bytes of the distinct storages the forward saves for backward (inputs included)."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        kernel(*inputs)
    return sum(storages.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timing per length")
    parser.add_argument("--literal-max", type=int, default=128, help="largest T of simplicial_literal")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"# torch {torch.__version__}, {device}, {torch.get_num_threads()} thread(s), "
        f"batch {args.batch} x heads {args.heads} x T x D {args.head_dim}, float32; "
        f"ratios are to standard_seed at the same T"
    )
    print(
        f"{'T':>4} {'kernel':<18} {'ms':>9} {'x time':>7} {'peak MiB':>9} {'x peak':>7} {'saved MiB':>9} {'x saved':>7}"
    )
    for T in args.lengths:
        generator = torch.Generator(device=device).manual_seed(T)
        inputs = [
            torch.randn(args.batch, args.heads, T, args.head_dim, device=device, generator=generator).requires_grad_()
            for _ in range(4)
        ]
        weights = torch.randn(args.batch, args.heads, T, args.head_dim, device=device, generator=generator)
        kernels = {
            name: kernel for name, kernel in KERNELS.items() if name != "simplicial_literal" or T <= args.literal_max
        }
        for kernel in kernels.values():  # warm up
            forward_backward(kernel, inputs, weights)
        times = {name: [] for name in kernels}
        start = time.perf_counter()
        while time.perf_counter() - start < args.budget or len(times["triple"]) < 3:
            for name, kernel in kernels.items():
                times[name].append(seconds(kernel, inputs, weights))
        rows = {
            name: (statistics.median(times[name]), peak_bytes(kernel, inputs, weights), saved_bytes(kernel, inputs))
            for name, kernel in kernels.items()
        }
        base = rows["standard_seed"]
        for name, (t, peak, saved) in rows.items():
            print(
                f"{T:>4} {name:<18} {t * 1e3:>9.2f} {t / base[0]:>7.2f} {peak / 2**20:>9.1f} "
                f"{peak / base[1]:>7.2f} {saved / 2**20:>9.1f} {saved / base[2]:>7.2f}"
            )
        t_triple, t_literal = rows["triple"][0], rows["triple_literal"][0]
        print(
            f"{T:>4} triple vs literal: {t_literal / t_triple:.2f}x faster, "
            f"{rows['triple_literal'][1] / rows['triple'][1]:.2f}x less peak memory "
            f"({len(times['triple'])} repeats)"
        )
        if "simplicial_literal" in rows:
            fast, literal = rows["simplicial"], rows["simplicial_literal"]
            print(
                f"{T:>4} simplicial vs literal: {literal[0] / fast[0]:.2f}x faster, "
                f"{literal[1] / fast[1]:.2f}x less peak memory"
            )


if __name__ == "__main__":
    main()
