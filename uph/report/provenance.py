"""results/provenance.json: what produced a run, so a reader can tell two runs' numbers apart.

The resolved config (defaults filled in), the code's git commit and whether tracked files differed
from it, Python, platform and package versions, the model's identity (source, sizes, weight and
tokenizer hashes), every seed in the config, the host and its device, and the wall time per rule
summed over that rule's jobs from the `benchmark:` files present, each file attributed to the rule
whose benchmark pattern (wildcards and their constraints, as Snakemake matches them) it matches.
"""

from __future__ import annotations

import datetime
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pandas as pd
import torch
from snakemake.io import regex_from_filepattern

from uph.config import key_path

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "gguf",
    "snakemake",
    "pandas",
    "numpy",
    "pyarrow",
    "matplotlib",
)


def git_state(repo: str | Path) -> dict:
    """{'commit': HEAD, 'dirty': tracked files changed}; both None outside a git checkout or without git."""

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    try:
        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip()),
        }
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def package_versions(names=PACKAGES) -> dict:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def config_seeds(config: dict, path: tuple = ()) -> dict:
    """Every config key named `seed`, `seeds` or `*_seed`, by its dotted path."""
    seeds = {}
    for key, value in config.items():
        if isinstance(value, dict):
            seeds.update(config_seeds(value, (*path, key)))
        elif key in ("seed", "seeds") or key.endswith("_seed"):
            seeds[key_path((*path, key))] = value
    return seeds


def device_name() -> str:
    """The GPU's name when CUDA is available, else the CPU model."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def rule_wall_times(benchmark_patterns: dict, exclude_rule: str | None = None) -> dict:
    """rule -> {'jobs': n, 'seconds': wall seconds summed over its jobs}. `benchmark_patterns`: rule ->
    its `benchmark:` file pattern, e.g. 'results/benchmarks/extract-{shard}.tsv'; every file present
    in those patterns' folders counts for the first rule whose pattern it matches."""
    regexes = {
        rule: re.compile(regex_from_filepattern(pattern))
        for rule, pattern in benchmark_patterns.items()
        if rule != exclude_rule
    }
    folders = sorted({Path(pattern).parent for pattern in benchmark_patterns.values()})
    times = {}
    for path in (path for folder in folders for path in sorted(folder.glob("*.tsv"))):
        rule = next((rule for rule, regex in regexes.items() if regex.fullmatch(path.as_posix())), None)
        if rule is not None:
            jobs, seconds = times.get(rule, (0, 0.0))
            times[rule] = (jobs + 1, seconds + float(pd.read_csv(path, sep="\t")["s"].sum()))
    return {rule: {"jobs": jobs, "seconds": round(seconds, 2)} for rule, (jobs, seconds) in sorted(times.items())}


def provenance(
    config: dict, model_identity: dict, repo: str | Path, benchmark_patterns: dict, exclude_rule: str | None = None
) -> dict:
    """The record; `exclude_rule`: the rule writing it, whose benchmark file is not written yet."""
    return {
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "git": git_state(repo),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "model": model_identity,
        "seeds": config_seeds(config),
        "host": socket.gethostname(),
        "device": device_name(),
        "wall_seconds_per_rule": rule_wall_times(benchmark_patterns, exclude_rule),
    }
