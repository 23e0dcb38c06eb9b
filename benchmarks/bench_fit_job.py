"""One validate job's and one fit job's work, checkout against checkout, on a finished study's files.

A fit-stage job's time is its evaluations of J (uph.lm.engine.objective): this runs the work of the default's
validate and fit jobs (uph.lm.jobs.validate.validate_users, uph.lm.jobs.refit.fit_users) for one job's users
of a finished study (its cache, global thetas, capacity choices and warm starts, read and never written),
for each checkout named (each imported from its own folder, in fresh processes, interleaved), and prints
each run's CPU seconds (user and system, the job's work without its start-up), the process's peak resident
memory (start-up and inputs included) and whether every checkout's tables are the same to the byte as the
first's (all columns but the seconds). `--profile` adds the first repeat's time per torch operation
(torch.profiler), the split of the job's work; `--work` first runs the first checkout once counting its work
(every matrix product torch dispatches, and the bytes of p0 its unconditional heads' passes read) and prints
the job's floor at a core's rates: its products at `--product-rate` and one read of p0 an unconditional
evaluation at `--bandwidth` (docs/performance.md, "Stages": 84 GFLOP/s and 15 GB/s on an AMD EPYC core).

    .venv/bin/python benchmarks/bench_fit_job.py --results <study>/results [--job 9] [--kinds validate fit]
        [--checkouts . /tmp/before] [--repeats 2] [--profile] [--work] [--keep <folder>]

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
from torch.utils._python_dispatch import TorchDispatchMode
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


class Work(TorchDispatchMode):
    # Counts, as the job runs: matrix products (2 m k n FLOPs each, every one torch dispatches: @, mm, addmm,
    # addmm_, bmm), matrix-vector products (2 m n), and the bytes of p0 that an unconditional head's passes
    # read: the partition sums' p_v e_v into the work block (a [B, c] block times a [B, 1] column) and the
    # gradient's sum of p0_t w_t (a [V, c] matrix-vector product, or a [B, c] block times a [c] row).

    def __init__(self):
        super().__init__()
        self.counts = dict.fromkeys(["products", "matrix-vector", "partition bytes", "gradient bytes"], 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, kwargs = func.__name__.split(".")[0], kwargs or {}
        if name in ("mm", "addmm", "addmm_", "bmm"):
            a, b = args[-2:]
            self.counts["products"] += 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        elif name in ("mv", "addmv", "addmv_"):
            a = args[-2]
            self.counts["matrix-vector"] += 2 * a.numel()
            if a.shape[0] > 10_000:
                self.counts["gradient bytes"] += a.numel() * a.element_size()
        elif name == "mul" and "out" in kwargs and args[0].dim() == 2:
            a, b = args[:2]
            if b.dim() == 2 and b.shape == (a.shape[0], 1):
                self.counts["partition bytes"] += a.numel() * a.element_size()
            elif b.dim() == 1 and b.shape[0] == a.shape[1]:
                self.counts["gradient bytes"] += a.numel() * a.element_size()
        return func(*args, **kwargs)


usage, clock = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
work_counts = None
if profile == "work":
    with Work() as counter:
        tables = work()
    work_counts, ops = counter.counts, []
elif profile == "1":
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
peak = after.ru_maxrss / 2**20  # GiB (Linux counts KiB)
print(json.dumps({"cpu": cpu, "wall": wall, "peak": peak, "users": users, "ops": ops, "work": work_counts, "uph": uph.__file__}))
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


def run(checkout: str, kind: str, mode: str, out: str, results: str, config: str, job: str) -> dict:
    """One run of a job's work in a fresh process importing `checkout`'s uph; `mode`: "0", "1" (profiled)
    or "work" (counted, Work)."""
    folder = str(Path(checkout).resolve())
    env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, results, config, kind, job, out, mode],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"{checkout}: {kind} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["uph"].startswith(folder), (found["uph"], folder)
    found["tables"] = pickle.load(open(out, "rb"))
    return found


def print_floor(work: dict, product_rate: float, bandwidth: float) -> None:
    """The job's work (Work's counts) and its floor: the products at `product_rate` and one read of p0 an
    unconditional evaluation (its partition sums' pass; the gradient's pass reads p0 a second time) at
    `bandwidth`."""
    products, partition = work["products"] / product_rate, work["partition bytes"] / bandwidth
    print(
        f"  work: {work['products'] / 1e12:.3f} TFLOP of matrix products, {work['matrix-vector'] / 1e9:.1f} GFLOP "
        f"of matrix-vector products; p0 read {work['partition bytes'] / 1e9:.1f} GB by the partition sums' passes, "
        f"{work['gradient bytes'] / 1e9:.1f} GB by the gradient's"
    )
    print(
        f"  floor: {products:.1f} s of products at {product_rate / 1e9:g} GFLOP/s + {partition:.1f} s for one read "
        f"of p0 at {bandwidth / 1e9:g} GB/s = {products + partition:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="a finished study's results folder (read only)")
    parser.add_argument("--job", default="9", help="the fit job whose users run (fit.jobs of config.yaml)")
    parser.add_argument("--kinds", nargs="+", default=["validate", "fit"], choices=["validate", "fit"])
    parser.add_argument("--checkouts", nargs="+", default=["."])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="the first repeat under torch.profiler")
    parser.add_argument("--work", action="store_true", help="first count the first checkout's work and floor")
    parser.add_argument("--product-rate", type=float, default=84e9, help="FLOP/s of a core's float32 products")
    parser.add_argument("--bandwidth", type=float, default=15e9, help="bytes/s of a core's stream from memory")
    parser.add_argument("--keep", help="a folder to keep each checkout's tables in (<kind>-<i>.pickle, i its place)")
    args = parser.parse_args()
    results = str(Path(args.results).resolve())
    config = str(Path(args.checkouts[0]).resolve() / "config.yaml")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = args.keep or scratch
        for kind in args.kinds:
            print(f"{kind} job {args.job}, 1 thread")
            if args.work:
                counted = run(
                    args.checkouts[0], kind, "work", str(Path(scratch) / "work.pickle"), results, config, args.job
                )
                print(f"  {args.checkouts[0]}, {', '.join(counted['users'])}")
                print_floor(counted["work"], args.product_rate, args.bandwidth)
            runs = {checkout: [] for checkout in args.checkouts}
            for repeat in range(args.repeats):
                for i, checkout in enumerate(args.checkouts):
                    mode = "1" if args.profile and repeat == 0 else "0"
                    out = str(Path(scratch) / f"{kind}-{i}.pickle")
                    runs[checkout].append(run(checkout, kind, mode, out, results, config, args.job))
            if not args.repeats:
                continue
            first = runs[args.checkouts[0]]
            base = min(cpu_seconds(first, args.profile))
            for checkout, found in runs.items():
                cpu = cpu_seconds(found, args.profile)
                print(
                    f"  {checkout:<28} CPU {min(cpu):7.1f} s (min of {len(cpu)}; median {statistics.median(cpu):.1f}), "
                    f"{base / min(cpu):4.2f}x the first; peak memory {max(run['peak'] for run in found):.2f} GiB; "
                    f"tables {same_tables(found[0]['tables'], first[0]['tables'])}"
                )
                for name, seconds, count in found[0]["ops"]:
                    print(f"      {name:<28} {seconds:8.2f} s {count:8d} calls")


if __name__ == "__main__":
    main()
