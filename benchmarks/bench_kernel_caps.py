"""What config `cpu_kernels: avx2` costs each stage, and what it changes: one real job of each stage of a
finished default run, rerun native and capped at AVX2, side by side.

    .venv/bin/python benchmarks/bench_kernel_caps.py --results results [--rounds 1] [--out FOLDER]

Run from the repository root, RESULTS as config.yaml's `results` spells it (relative to the root).

Each job (JOBS: an extraction shard, a validate and a fit job, an attention cell, a copy-task seed, a
feedback method's seeds) is rerun alone through Snakemake (`--forcerun` its rule, `--allowed-rules` that rule only, so
nothing upstream or downstream runs), one core, once with the config's `cpu_kernels: native` and once with
`avx2`, the order alternating by round so machine load hits both alike. Reported per job: its seconds
(Snakemake's benchmark file, `s`) each way and their ratio, and the sha256 of its outputs' contents (digest:
timings aside): native against the run's own outputs (the same: the study repeats on one machine) and capped
against native. With
--out, each way's outputs are kept there (`native/`, `avx2/`) for a comparison with another machine's.

It rewrites the jobs' outputs in RESULTS (the last round's native rerun restores the run's own bytes): run it
on a finished run whose tables you have kept, or on a copy.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
ATTENTION = "attention/model~residual/attention~standard/task~mqar"  # the cell ../shared measured alone
JOBS = {  # stage -> (rule, its outputs under RESULTS, its benchmark file under RESULTS)
    "extract": ("extract", ["cache/shard-0.parquet"], "benchmarks/extract-0.tsv"),
    "validate": (
        "validate",
        ["fit/job~9/validation.parquet", "fit/job~9/warm_starts.parquet"],
        "benchmarks/fit-validate-job~9.tsv",
    ),
    "fit": ("fit", ["fit/job~0/fits.parquet", "fit/job~0/dose.parquet"], "benchmarks/fit-job~0.tsv"),
    "attention_train": (
        "attention_train",
        [f"{ATTENTION}/{name}.parquet" for name in ("eval", "sweep", "curves")],
        "benchmarks/attention_train-model~residual-attention~standard-task~mqar.tsv",
    ),
    "copy_task_train": (
        "copy_task_train",
        [f"copy_task/attention~triple/seed~0/{name}.parquet" for name in ("eval", "curves")],
        "benchmarks/copy_task_train-attention~triple-seed~0.tsv",
    ),
    "feedback_train": (
        "feedback_train",
        ["feedback/method~feedback_learned/curves.parquet"],
        "benchmarks/feedback_train-method~feedback_learned.tsv",
    ),
}
WAYS = ("native", "avx2")


def digest(paths: list[Path]) -> str:
    """One sha256 over the files' contents, in order (12 hex digits): each parquet's columns but its
    timings (a name ending in `seconds`: the validate, fit and feedback jobs time their work), as CSV text
    at full precision, a column of arrays (hidden states, thetas) as their bytes."""
    sha = hashlib.sha256()
    for path in paths:
        table = pd.read_parquet(path)
        for column in (c for c in table.columns if not c.endswith("seconds")):
            values = table[column]
            if values.dtype == object and any(hasattr(value, "tobytes") for value in values):  # arrays: their bytes
                sha.update(b"".join(b"-" if value is None else value.tobytes() for value in values))
            else:
                sha.update(values.to_csv(index=False, float_format="%.17g").encode())
    return sha.hexdigest()[:12]


def rerun(results: Path, stage: str, way: str) -> float:
    """Rerun the stage's job with `cpu_kernels: way`; its seconds from its benchmark file."""
    rule, outputs, benchmark = JOBS[stage]
    command = [
        str(Path(sys.executable).with_name("snakemake")),
        *(str(results / output) for output in outputs),
        "--forcerun",
        rule,
        "--allowed-rules",
        rule,
        "--cores",
        "1",
        "--configfile",
        "config.yaml",
        "--config",
        f"results={results}",
        f"cpu_kernels={way}",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{stage} ({way}) failed:\n{done.stderr[-3000:]}")
    return float(pd.read_csv(results / benchmark, sep="\t")["s"].iloc[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stages", nargs="*", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--out", type=Path, help="keep each way's outputs here (native/, avx2/)")
    args = parser.parse_args()
    results = args.results
    rows = []
    for stage in args.stages:
        outputs = [results / output for output in JOBS[stage][1]]
        own = digest(outputs)
        seconds = {way: [] for way in WAYS}
        digests = {}
        for round_ in range(args.rounds):
            for way in WAYS if round_ % 2 else WAYS[::-1]:  # the last round ends native: the run's bytes back
                seconds[way].append(rerun(results, stage, way))
                digests[way] = digest(outputs)
                if args.out:
                    for output, path in zip(JOBS[stage][1], outputs):
                        kept = args.out / way / output
                        kept.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy(path, kept)
        native, capped = min(seconds["native"]), min(seconds["avx2"])
        rows.append(
            {
                "stage": stage,
                "native s": round(native, 1),
                "avx2 s": round(capped, 1),
                "avx2 / native": round(capped / native, 3),
                "native = the run's own bytes": digests["native"] == own,
                "avx2 = native bytes": digests["avx2"] == digests["native"],
                "sha256 own": own,
                "sha256 native": digests["native"],
                "sha256 avx2": digests["avx2"],
            }
        )
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
