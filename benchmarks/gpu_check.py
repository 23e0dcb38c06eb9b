"""`make gpu-check`: the suite's CUDA path checked against its CPU path on this machine.

After tests/test_gpu.py (the fit engine, the attention kernels and extraction on CUDA against CPU;
the Makefile runs it first), this runs the tiny study (config/test.yaml) in a fresh folder on CPU,
then again with `device: cuda`, and compares every table of the two (`compare_tables`):

- the choices are identical: chosen radii and lambdas, at-edge flags, users counted, every text column;
- NLLs, their changes and intervals, KL and the fit objective within 1e-6 of the table's NLL scale
  (the largest |NLL| in it, about 5 nats: the effects the study reports are about 1e-3);
- theta norms within 1e-3 relative (an exact fit stops anywhere within its tolerance);
- certificates: the CUDA fit's no worse than the larger of fit.tol and twice the CPU fit's;
- tables of branches that ran on CPU in both runs (copy task, feedback, attention) byte for byte.

Each run's wall and per-rule job-seconds (from its benchmark files) go to <out>/timings.json. Where no
CUDA device is present the CPU half runs and one line says the CUDA half was skipped; exit 0.

    .venv/bin/python benchmarks/gpu_check.py [--out gpu-check] [--cores N (default: all)]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
NLL_LIKE = re.compile(r"nll|^kl$|fit_objective")  # columns in nats: within 1e-6 of the table's NLL scale
THETA_NORMS = {"sum_theta_norm", "theta_norm"}  # within 1e-3 relative
CERTIFICATES = {"fit_certificate_max", "certificate"}  # the CUDA fit's no worse than max(tol, 2 x the CPU fit's)
LM_TABLES = {"personalization", "capacity", "dose_response", "cross_user"}  # computed on the fit stage's device


def _rows(mask: pd.Series) -> str:
    rows = list(mask[mask].index[:3])
    return f"row(s) {', '.join(map(str, rows))}{' ...' if mask.sum() > 3 else ''}"


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def compare_tables(cpu: pd.DataFrame, cuda: pd.DataFrame, tol: float, name: str) -> list[str]:
    """Each way the table `name` of the CUDA run departs from the CPU run's beyond the tolerances
    above (module docstring), one line naming the table, column and rows; [] when they agree."""
    if list(cpu.columns) != list(cuda.columns) or len(cpu) != len(cuda):
        return [f"{name}: columns or rows differ ({len(cpu)} rows on CPU, {len(cuda)} on CUDA)"]
    nll_columns = [c for c in cpu.columns if NLL_LIKE.search(c)]
    scale = max((cpu[c].abs().max() for c in nll_columns), default=1.0)
    problems = []
    for column in cpu.columns:
        a, b = cpu[column], cuda[column]
        both_missing = a.isna() & b.isna()
        if column in CERTIFICATES:
            bad = ~both_missing & ~(b <= (2 * a).clip(lower=tol))
            what = f"certificate over max({tol:g}, 2 x CPU)"
        elif column in THETA_NORMS or NLL_LIKE.search(column):
            allowed = 1e-3 * a.abs() if column in THETA_NORMS else 1e-6 * scale
            bad = ~both_missing & ~((a - b).abs() <= allowed)
            what = "beyond 1e-3 relative" if column in THETA_NORMS else f"beyond 1e-6 x {scale:.3g}"
        else:
            bad = ~both_missing & (a.astype(str) != b.astype(str))
            what = "not identical"
        if bad.any():
            worst = bad.idxmax()
            problems.append(
                f"{name}.{column}: {what} at {_rows(bad)} (CPU {_shown(a[worst])}, CUDA {_shown(b[worst])})"
            )
    return problems


def compare_runs(cpu_results: Path, cuda_results: Path, tol: float) -> list[str]:
    """compare_tables on every results/tables/*.csv; the tables of CPU-only branches byte for byte."""
    problems = []
    for path in sorted((cpu_results / "tables").glob("*.csv")):
        other = cuda_results / "tables" / path.name
        if not other.is_file():
            problems.append(f"{path.stem}: missing in the CUDA run")
        elif path.stem in LM_TABLES:
            problems += compare_tables(pd.read_csv(path), pd.read_csv(other), tol, path.stem)
        elif path.read_bytes() != other.read_bytes():
            problems.append(f"{path.stem}: ran on CPU in both runs, yet its bytes differ")
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
    tol = json.loads((args.out / "cpu/results/provenance.json").read_text())["config"]["fit"]["tol"]
    problems = compare_runs(args.out / "cpu/results", args.out / "cuda/results", tol)
    print(
        f"gpu-check: CUDA run on {timings['gpu']} in {timings['cuda']['wall_s']:.0f} s; timings in {args.out}/timings.json"
    )
    if problems:
        sys.exit("gpu-check: the CUDA run departs from the CPU run:\n" + "\n".join(problems))
    print("gpu-check: every table of the CUDA run agrees with the CPU run's")


if __name__ == "__main__":
    main()
