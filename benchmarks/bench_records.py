"""The DAG build's check of job records (uph.records) on a folder shaped like config/full.yaml's: how long
reading every record and checking every job takes, against reading the records alone (the floor: one JSON
parse per job, one stat per file).

    python benchmarks/bench_records.py [--jobs 516] [--files 1500] [--inputs 12]

config/full.yaml plans 516 jobs (`snakemake -n --configfile config/full.yaml` on an empty folder). Each
synthetic job reads `inputs` files of the folder and writes 3; every file is 64 KiB. Nothing is hashed in
the common case (each output's size and mtime match its record); `--touched` dates every file anew, so
every file is read once more (a folder copied without its dates: `cp -r`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from uph.records import Records, record_path, write_record


def synthetic_folder(root: Path, jobs: int, files: int, inputs: int) -> list[tuple[str, dict]]:
    """`files` files and `jobs` jobs' records, each job reading `inputs` earlier files and writing 3."""
    rng = random.Random(0)
    paths = [root / f"stage{i % 7}" / f"file{i}.parquet" for i in range(files)]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(64 * 1024))
    made = []
    for job in range(jobs):
        outputs = [str(paths[(3 * job + k) % files]) for k in range(3)]
        read = [str(path) for path in rng.sample(paths, inputs)]
        settings = {"fit": {"radii": [0.5, 5.0, 50.0], "job": job}}
        write_record(root, "rule", {"job": job}, settings, read, outputs)
        made.append((outputs, settings))
    return made


def check(root: Path, made) -> float:
    start = time.perf_counter()
    records = Records(root)
    stale = sum(
        records.needs_rerun("rule", {"job": job}, settings, outputs) for job, (outputs, settings) in enumerate(made)
    )
    seconds = time.perf_counter() - start
    assert stale == 0
    return seconds


def floor(root: Path, jobs: int) -> float:
    """Reading every record and stat-ing every file it names, nothing compared."""
    start = time.perf_counter()
    for job in range(jobs):
        record = json.loads(record_path(root, "rule", {"job": job}).read_text())
        for path in [*record["inputs"], *record["outputs"]]:
            os.stat(root / path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=516)
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--inputs", type=int, default=12)
    parser.add_argument("--touched", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        made = synthetic_folder(root, args.jobs, args.files, args.inputs)
        if args.touched:
            for path in root.glob("stage*/*"):
                os.utime(path)
        seconds = min(check(root, made) for _ in range(3))
        base = min(floor(root, args.jobs) for _ in range(3))
    print(
        f"{args.jobs} jobs, {args.files} files of 64 KiB, {args.inputs} inputs each{', every file re-dated' if args.touched else ''}: "
        f"check {seconds:.3f} s, floor (read and stat only) {base:.3f} s, ratio {seconds / base:.2f}"
    )


if __name__ == "__main__":
    main()
