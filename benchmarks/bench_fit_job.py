"""One validate job's and one fit job's work, checkout against checkout, on a finished study's files.

A fit-stage job's time is its evaluations of J (uph.lm.engine.objective): this runs the work of the default's
validate and fit jobs (uph.lm.jobs.validate.validate_users, uph.lm.jobs.refit.fit_users) for one job's users
of a finished study (its cache, global thetas, capacity choices and warm starts, read and never written),
for each checkout named (each imported from its own folder, in fresh processes, interleaved), and prints
each run's CPU seconds (user and system, the job's work without its start-up) and whether every checkout's
tables are the same to the byte as the first's (all columns but the seconds). `--profile` adds the
first repeat's time per torch operation (torch.profiler), the split of the job's work.

    .venv/bin/python benchmarks/bench_fit_job.py --results <study>/results [--job 9] [--kinds validate fit]
        [--checkouts . /tmp/before] [--repeats 2] [--profile] [--keep <folder>]

A checkout is a folder holding a uph package (git worktree, or `git archive <commit> | tar -x -C <folder>`).
The study's config is config.yaml of the first checkout; its results must come from code whose cache and fit
files the checkouts read (the records are not checked).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, pickle, resource, sys, time
from pathlib import Path
from types import SimpleNamespace
import pandas as pd, torch, yaml
torch.set_num_threads(1)
from uph.artifacts import FIT_FILE
from uph.config import EXTRACT_KEYS, job_params, validate
from uph.lm.engine.neural_cache import NeuralCache
from uph.lm.jobs.fit_job import CacheBaselines, FitConfig, global_thetas, job_users, load_methods

results, config, kind, job_number, out, profile = sys.argv[1:]
results, read = Path(results), FIT_FILE.read_parquet
config = validate(yaml.safe_load(Path(config).read_text()))
fit = FitConfig.from_config(config["fit"])
users = job_users(results / "corpus/users.parquet", job_number, config["fit"]["jobs"])
inputs = SimpleNamespace(
    model=results / "model/identity.json",
    users=results / "corpus/users.parquet",
    basis=results / "basis/svd.safetensors",
    shards=sorted(map(str, (results / "cache").glob("shard-*.parquet"))),
)
job = load_methods(inputs, fit, job_params(config["extract"], EXTRACT_KEYS), "cpu", users)
table = pd.concat([read(p) for p in sorted((results / "fit/global").glob("method~*/thetas.parquet"))], ignore_index=True)
global_dir = results / "fit/global"
neural = NeuralCache.from_tables(
    read(global_dir / "neural_cache/neural_cache.parquet"), read(global_dir / "neural_cache/datastore.parquet"), job.device
)
caches = CacheBaselines(read(global_dir / "unigram/unigram.parquet"), neural)


def work():
    if kind == "validate":
        from uph.lm.jobs.validate import validate_users

        return validate_users(job, global_thetas(table, "theta_fit"), caches, fit)
    from uph.lm.jobs.refit import fit_users
    from uph.lm.jobs.validate import warm_starts

    starts = warm_starts(read(results / f"fit/job~{job_number}/warm_starts.parquet"))
    return fit_users(job, global_thetas(table), read(results / "fit/capacity.parquet"), caches, fit, starts)


usage, clock = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if profile == "1":
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU]) as prof:
        tables = work()
    ops = sorted(prof.key_averages(), key=lambda op: -op.self_cpu_time_total)
    ops = [(op.key, op.self_cpu_time_total / 1e6, op.count) for op in ops[:14]]
else:
    tables, ops = work(), []
wall, after = time.perf_counter() - clock, resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
pickle.dump(tables, open(out, "wb"))
import uph
print(json.dumps({"cpu": cpu, "wall": wall, "users": users, "ops": ops, "uph": uph.__file__}))
"""


def same_tables(found: tuple, first: tuple) -> str:
    """'the same to the byte' where every table equals the first checkout's but for the seconds, else the
    columns that differ and by how much."""
    differences = []
    for table, reference in zip(found, first):
        columns = [column for column in reference.columns if not column.endswith("seconds")]
        table, reference = table[columns].reset_index(drop=True), reference[columns].reset_index(drop=True)
        for column in columns:
            if table[column].equals(reference[column]):
                continue
            try:
                apart = (table[column] - reference[column]).abs() / reference[column].abs().clip(lower=1e-300)
                differences.append(f"{column} ({int((apart > 0).sum())} rows, up to {apart.max():.1e} relative)")
            except TypeError:
                differences.append(f"{column} ({int((table[column] != reference[column]).sum())} rows)")
    return "the same to the byte" if not differences else "differs: " + ", ".join(differences)


def cpu_seconds(runs: list[dict], profiled: bool) -> list[float]:
    """The runs' CPU seconds, less the profiled first run's where others ran without the profiler."""
    return [run["cpu"] for run in (runs[1:] if profiled and len(runs) > 1 else runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="a finished study's results folder (read only)")
    parser.add_argument("--job", default="9", help="the fit job whose users run (fit.jobs of config.yaml)")
    parser.add_argument("--kinds", nargs="+", default=["validate", "fit"], choices=["validate", "fit"])
    parser.add_argument("--checkouts", nargs="+", default=["."])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="the first repeat under torch.profiler")
    parser.add_argument("--keep", help="a folder to keep each checkout's tables in (<kind>-<i>.pickle, i its place)")
    args = parser.parse_args()
    results = str(Path(args.results).resolve())
    config = str(Path(args.checkouts[0]).resolve() / "config.yaml")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = args.keep or scratch
        for kind in args.kinds:
            runs = {checkout: [] for checkout in args.checkouts}
            for repeat in range(args.repeats):
                for i, checkout in enumerate(args.checkouts):
                    folder = str(Path(checkout).resolve())
                    out = str(Path(scratch) / f"{kind}-{i}.pickle")
                    profile = "1" if args.profile and repeat == 0 else "0"
                    env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": "1"}
                    child = [sys.executable, "-c", CHILD, results, config, kind, args.job, out, profile]
                    done = subprocess.run(child, env=env, cwd=folder, capture_output=True, text=True)
                    if done.returncode:
                        sys.exit(f"{checkout}: {kind} failed:\n{done.stderr[-3000:]}")
                    found = json.loads(done.stdout.splitlines()[-1])
                    assert found["uph"].startswith(folder), (found["uph"], folder)
                    found["tables"] = pickle.load(open(out, "rb"))
                    runs[checkout].append(found)
            first = runs[args.checkouts[0]]
            print(f"{kind} job {args.job} ({', '.join(first[0]['users'])}), {args.repeats} runs a checkout, 1 thread")
            base = min(cpu_seconds(first, args.profile))
            for checkout, found in runs.items():
                cpu = cpu_seconds(found, args.profile)
                print(
                    f"  {checkout:<28} CPU {min(cpu):7.1f} s (min; median {statistics.median(cpu):.1f}), "
                    f"{base / min(cpu):4.2f}x the first; tables {same_tables(found[0]['tables'], first[0]['tables'])}"
                )
                for name, seconds, count in found[0]["ops"]:
                    print(f"      {name:<28} {seconds:8.2f} s {count:8d} calls")


if __name__ == "__main__":
    main()
