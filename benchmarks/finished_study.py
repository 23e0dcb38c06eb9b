"""What the fit-stage benchmarks share: the command line and a finished study's shard 0 as a fit job."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from uph.config import EXTRACT_KEYS, job_params, validate
from uph.lm.jobs.fit_job import FitConfig, FitJob, load_methods


def arguments(description: str, users: int) -> argparse.Namespace:
    """--results (a finished study's folder), --users, --threads (set for torch here)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--results", default="results", help="a finished study's results folder")
    parser.add_argument("--users", type=int, default=users)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def shard_zero(results: str | Path) -> tuple[FitConfig, FitJob]:
    """config.yaml's fit section and the fit job of the study's shard 0 (every method, on the CPU)."""
    results = Path(results)
    config = validate(yaml.safe_load(Path("config.yaml").read_text()))
    fit = FitConfig.from_config(config["fit"])
    inputs = SimpleNamespace(
        model=results / "model" / "identity.json",
        users=results / "corpus" / "users.parquet",
        basis=results / "basis" / "svd.safetensors",
        shards=[results / "cache" / "shard-0.parquet"],
    )
    return fit, load_methods(inputs, fit, job_params(config["extract"], EXTRACT_KEYS), "cpu")
