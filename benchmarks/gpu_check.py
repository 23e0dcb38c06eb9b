"""`make gpu-check`: the suite's CUDA path checked against its CPU path on this machine.

After tests/test_gpu.py (the fit engine, the attention kernels and extraction on CUDA against CPU;
the Makefile runs it first), this runs the tiny study (config/test.yaml) in a fresh folder on CPU,
then again with `device: cuda`, and compares the two with `make compare`'s uph.compare (every table
and answer: NLLs within its float32 tolerance, choices identical or near ties, certificates, counts),
and the tables of branches that ran on CPU in both runs (copy task, feedback, attention) byte for byte.

Each run's wall and per-rule job-seconds (from its benchmark files) go to <out>/timings.json. Where no
CUDA device is present the CPU half runs and one line says the CUDA half was skipped; exit 0.

    .venv/bin/python benchmarks/gpu_check.py [--out gpu-check] [--cores N (default: all)]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd

from uph.compare import compare_folders

REPO = Path(__file__).resolve().parent.parent
CPU_BRANCHES = {"copy_task", "feedback", "gram_resilience", "attention", "attention_sweep", "attention_curves"}


def compare_runs(cpu_results: Path, cuda_results: Path) -> list[str]:
    """uph.compare's statistical comparison of the CUDA run against the CPU run (its tolerances: other devices
    sum in another order), and the tables of the branches that ran on CPU in both byte for byte: one line per
    problem, [] when they agree."""
    report = compare_folders(cuda_results, cpu_results, mode="statistical")
    problems = report.incomparable + report.disagreements
    for name in sorted(CPU_BRANCHES):
        paths = [folder / "tables" / f"{name}.csv" for folder in (cpu_results, cuda_results)]
        if all(path.is_file() for path in paths) and paths[0].read_bytes() != paths[1].read_bytes():
            problems.append(f"{name}: ran on CPU in both runs, yet its bytes differ")
    return problems


def rule_seconds(results: Path) -> dict[str, float]:
    """Job-seconds per rule from a run's benchmark files (results/benchmarks/<rule>[-<wildcards>].tsv)."""
    seconds = defaultdict(float)
    for path in (results / "benchmarks").glob("*.tsv"):
        seconds[path.stem.split("-")[0]] += float(pd.read_csv(path, sep="\t")["s"].iloc[0])
    return dict(sorted(seconds.items()))


def run_study(folder: Path, device: str, cores: int, config: Path) -> float:
    """The study of `config` in a fresh `folder` with `device`; its wall seconds."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [
        str(Path(sys.executable).with_name("snakemake")),
        *("-s", str(REPO / "Snakefile"), "--directory", str(folder), "--configfile", str(config)),
        *("--config", f"device={device}", "--cores", str(cores), "-q"),
    ]
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"gpu-check: the {device} run failed (log under {folder}/results/logs):\n{run.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "gpu-check")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--config", type=Path, default=REPO / "config/test.yaml")
    args = parser.parse_args()
    import torch  # the comparison above needs none

    timings = {"cpu": {"wall_s": run_study(args.out / "cpu", "cpu", args.cores, args.config)}}
    timings["cpu"]["rule_s"] = rule_seconds(args.out / "cpu/results")
    print(f"gpu-check: CPU run of {args.config.name} in {timings['cpu']['wall_s']:.0f} s")
    if torch.cuda.is_available():
        timings["gpu"] = torch.cuda.get_device_name(0)
        timings["cuda"] = {"wall_s": run_study(args.out / "cuda", "cuda", args.cores, args.config)}
        timings["cuda"]["rule_s"] = rule_seconds(args.out / "cuda/results")
    (args.out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    if "cuda" not in timings:
        print("gpu-check: no CUDA device on this machine; the CUDA half (tests/test_gpu.py, the CUDA run) was skipped")
        return
    problems = compare_runs(args.out / "cpu/results", args.out / "cuda/results")
    print(
        f"gpu-check: CUDA run on {timings['gpu']} in {timings['cuda']['wall_s']:.0f} s; timings in {args.out}/timings.json"
    )
    if problems:
        sys.exit("gpu-check: the CUDA run departs from the CPU run:\n" + "\n".join(problems))
    print("gpu-check: every table of the CUDA run agrees with the CPU run's")


if __name__ == "__main__":
    main()
