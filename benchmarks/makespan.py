"""A finished run's makespan on N cores: its jobs' measured seconds replayed on the workflow's DAG.

    .venv/bin/python benchmarks/makespan.py --results /work/base/results
    .venv/bin/python benchmarks/makespan.py --results results-slice --configfile config.yaml config/full.yaml \\
        --project-config config.yaml config/full.yaml --users results-full/corpus/users.parquet

Method. The DAG is `snakemake --dry-run --forceall --nolock` on the run's own checkout (--workflow-dir,
default the folder above --results; its `uph` first on PYTHONPATH) with `--config results=<--results>`,
parsed from the job blocks it prints (rule, jobid, input, output, benchmark, threads, priority,
wildcards); a job depends on the jobs whose outputs it takes as input. A job's seconds are the `s`
column of its benchmark file (last row), else the time from its start to its "Finished jobid" line in the
run's Snakemake log (1 s resolution), else 0 (counted). The simulation is list scheduling on N cores in the
order Snakemake's scheduler prefers: whenever cores are free, the ready jobs (every input's job done)
by priority (higher first), then jobid (lower first), each start when its cores fit, holding min(threads, N)
cores (threads as the DAG gives them at the run's --cores) for its measured seconds; wall_s is the last
finish. Among jobs of equal priority Snakemake's ILP scheduler picks any set that fills the cores, so
the jobid order is one of its choices, not its exact one. critical_path_s is the longest seconds-weighted
path through the DAG, the wall on unlimited cores. Jobs keep their measured seconds at every N: the
contention of the measured run (jobs sharing memory bandwidth on its cores) stays in them.

The check: the jobs the log lists, replayed on the log's own cores (its "Provided cores"), against its
measured wall (first to last timestamp); the jobs it did not run (a resumed run) count as done at start.

Projection (--project-config, --users): the DAG of another config (built in a temporary results folder),
each job's seconds from the measured run's jobs of the same rule, scaled by the job's work. Work is the
train tokens (users.parquet's train_end) of the users the job holds: a `shard` job those with
uph.lm.cache.shard_of(user, shards), a `job` job those of uph.lm.partition.fit_job_users(users, jobs), for
shards and jobs the count of the DAG's shard and job wildcard values; rules named cross_user* score every
user's theta on the job's held-out text: a block costs what fit_others costs on the same users (its texts'
p0 and one pass each) plus its pairs, the job's held-out tokens (n_tokens - test_start) x the number of
users, at a rate from the measured blocks less that part. Per rule, seconds = startup + rate x work: a least-squares line through the
measured jobs when their work spans at least a factor of 2 (startup and rate clipped at 0), else startup
= the run's cheapest benchmarked job (a process start-up with its imports) and rate = the rest of the
rule's measured seconds per unit of work. Rules without work are taken as measured (the job of the same
wildcards, else the rule's mean); rules the run did not measure count 0 (listed).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from heapq import heappop, heappush
from pathlib import Path

import pandas as pd

CORES = [1, 2, 4, 8, 16, 64, 256]
TIMESTAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
BLOCK = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")  # a run's log says localrule for local jobs
FIELD = re.compile(r"^    (\w+): (.*)$")
FINISHED = re.compile(r"^Finished job(?:id)?:? (\d+)")
TOP_RULES = 10


@dataclass
class Job:
    """One job of the DAG; `deps` are indices into the same job list."""

    rule: str
    wildcards: str = ""
    jobid: int = 0
    threads: int = 1
    priority: int = 0
    seconds: float = 0.0
    deps: tuple[int, ...] = ()
    source: str = ""  # where seconds came from: "benchmark file", "log", or "" (not measured)
    inputs: list[str] = field(default_factory=list, repr=False)
    outputs: list[str] = field(default_factory=list, repr=False)
    benchmark: str | None = None

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        """What identifies the job across a dry-run and a run's log (their jobids differ when the run
        was a partial one)."""
        return self.rule, tuple(sorted(self.outputs))


# ---------------------------------------------------------------------------------------------------------
# the scheduler: pure functions of the job list


def simulate(jobs: list[Job], cores: int) -> float:
    """The finish time of the last job under list scheduling on `cores` cores (see the module docstring)."""
    waiting = [len(job.deps) for job in jobs]
    dependents = [[] for _ in jobs]
    for i, job in enumerate(jobs):
        for dep in job.deps:
            dependents[dep].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    running: list[tuple[float, int]] = []  # (finish, job)
    free, now = cores, 0.0
    while ready or running:
        ready.sort(key=lambda i: (-jobs[i].priority, jobs[i].jobid))
        for i in list(ready):
            need = min(jobs[i].threads, cores)
            if need <= free:
                free -= need
                ready.remove(i)
                heappush(running, (now + jobs[i].seconds, i))
        now = running[0][0]
        while running and running[0][0] == now:  # every job finishing now frees its cores first
            _, i = heappop(running)
            free += min(jobs[i].threads, cores)
            for j in dependents[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    ready.append(j)
    return now


def topological_order(jobs: list[Job]) -> list[int]:
    done, order = set(), []
    for start in range(len(jobs)):
        stack = [(start, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                order.append(i)
            elif i not in done:
                done.add(i)
                stack.append((i, True))
                stack.extend((dep, False) for dep in jobs[i].deps if dep not in done)
    return order


def critical_path(jobs: list[Job]) -> tuple[float, list[int]]:
    """The longest seconds-weighted path through the DAG: its seconds and its jobs, first to last."""
    if not jobs:
        return 0.0, []
    longest, before = {}, {}
    for i in topological_order(jobs):
        best = max(jobs[i].deps, key=longest.__getitem__, default=None)
        longest[i] = jobs[i].seconds + (longest[best] if best is not None else 0.0)
        before[i] = best
    end = max(longest, key=longest.__getitem__)
    path = [end]
    while before[path[-1]] is not None:
        path.append(before[path[-1]])
    return longest[end], path[::-1]


def link(jobs: list[Job]) -> None:
    """Set each job's deps: the jobs that write its inputs."""
    producer = {path: i for i, job in enumerate(jobs) for path in job.outputs}
    for job in jobs:
        job.deps = tuple(sorted({producer[path] for path in job.inputs if path in producer}))


def subset(jobs: list[Job], keep: set[int]) -> list[Job]:
    """The jobs `keep` names, their deps on the others dropped (those count as done at the start)."""
    index = {old: new for new, old in enumerate(sorted(keep))}
    return [
        replace(jobs[old], deps=tuple(index[dep] for dep in jobs[old].deps if dep in index)) for old in sorted(keep)
    ]


# ---------------------------------------------------------------------------------------------------------
# reading Snakemake's dry-run, its log and the benchmark files


def parse_blocks(lines, workdir: Path) -> tuple[list[tuple[Job, datetime | None]], dict[int, datetime], list[datetime]]:
    """The job blocks of a dry-run's output or a run's log, each with the timestamp above it; the time of
    each "Finished jobid" line; every timestamp. Paths are made absolute against `workdir`."""

    def absolute(paths: str) -> list[str]:
        return [os.path.normpath(workdir / path) for path in paths.split(", ") if path]

    blocks, finished, stamps = [], {}, []
    now, job = None, None
    for line in lines:
        line = line.rstrip("\n")
        if job is not None and (match := FIELD.match(line)):
            key, value = match.groups()
            if key == "input":
                job.inputs = absolute(value)
            elif key == "output":
                job.outputs = absolute(value)
            elif key == "benchmark":
                job.benchmark = absolute(value)[0]
            elif key == "wildcards":
                job.wildcards = value
            elif key in ("jobid", "threads", "priority"):
                setattr(job, key, int(value))
            continue
        job = None
        if match := TIMESTAMP.match(line):
            now = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
            stamps.append(now)
        elif match := BLOCK.match(line):
            job = Job(match.group(1))
            blocks.append((job, now))
        elif match := FINISHED.match(line):
            finished[int(match.group(1))] = now
    return blocks, finished, stamps


def dry_run(workflow_dir: Path, configfiles: list[Path], results: Path, cores: int) -> list[Job]:
    """The DAG of every job (--forceall) as the workflow in `workflow_dir` builds it, writing to `results`."""
    command = [str(Path(sys.executable).with_name("snakemake")), "--dry-run", "--forceall", "--nolock"]
    command += ["--snakefile", str(workflow_dir / "Snakefile"), "--directory", str(workflow_dir)]
    command += ["--cores", str(cores), "--configfile", *map(str, configfiles), "--config", f"results={results}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(workflow_dir), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"the dry-run failed ({' '.join(command)}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    jobs = [job for job, _ in parse_blocks(done.stdout.splitlines(), workflow_dir)[0]]
    link(jobs)
    return jobs


@dataclass
class RunLog:
    path: Path
    cores: int | None
    wall: float  # first to last timestamp
    durations: dict  # job key -> seconds from its start to its Finished line
    keys: list  # every job key the log starts, in order


def read_log(path: Path, default_workdir: Path) -> RunLog:
    lines = path.read_text().splitlines()
    header = "\n".join(lines[:40])
    workdir = re.search(r"^\s*Working directory: (.+)$", header, re.M)
    cores = re.search(r"^Provided cores: (\d+)$", "\n".join(lines), re.M)
    blocks, finished, stamps = parse_blocks(lines, Path(workdir.group(1)) if workdir else default_workdir)
    durations = {
        job.key: (finished[job.jobid] - start).total_seconds()
        for job, start in blocks
        if start is not None and job.jobid in finished
    }
    wall = (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0
    return RunLog(path, int(cores.group(1)) if cores else None, wall, durations, [job.key for job, _ in blocks])


def newest_log(workflow_dir: Path) -> Path | None:
    logs = sorted((workflow_dir / ".snakemake" / "log").glob("*.snakemake.log"))
    return logs[-1] if logs else None


def benchmark_seconds(path: str | None) -> float | None:
    if path is None or not Path(path).is_file():
        return None
    table = pd.read_csv(path, sep="\t")
    return float(table["s"].iloc[-1]) if len(table) else None


def measure(jobs: list[Job], log: RunLog | None) -> dict[str, int]:
    """Set each job's seconds (benchmark file, else the log, else 0) and source; how many came from which."""
    for job in jobs:
        seconds = benchmark_seconds(job.benchmark)
        if seconds is not None:
            job.seconds, job.source = seconds, "benchmark file"
        elif log is not None and job.key in log.durations:
            job.seconds, job.source = log.durations[job.key], "log"
    counts = defaultdict(int)
    for job in jobs:
        counts[job.source or "neither (0 s)"] += 1
    return dict(counts)


# ---------------------------------------------------------------------------------------------------------
# projection


def held_users(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int) -> pd.DataFrame:
    """The rows of `users` whose work the job does: its shard's, its fit job's, or every user."""
    wildcards = dict(item.split("=", 1) for item in job.wildcards.split(", ") if item)
    if "shard" in wildcards:
        from uph.lm.cache import shard_of

        return users[[shard_of(user, shards) == int(wildcards["shard"]) for user in users["user_id"]]]
    if "job" in wildcards:
        from uph.lm.partition import fit_job_users

        return users[users["user_id"].isin(fit_job_users(users, fit_jobs)[int(wildcards["job"])])]
    return users


def work(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int) -> float | None:
    """The job's tokens of work (module docstring), or None for a rule that does not scale with users."""
    held = held_users(job, users, shards, fit_jobs)
    if job.rule.startswith("cross_user"):
        return float((held["n_tokens"] - held["test_start"]).sum()) * len(users)
    wildcards = dict(item.split("=", 1) for item in job.wildcards.split(", ") if item)
    return float(held["train_end"].sum()) if {"shard", "job"} & set(wildcards) else None


def texts_part(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int, models: dict) -> float:
    """What a cross-user block costs before its pairs: its texts' p0 and one scoring pass each, which is a
    fit_others job of the same users (the same start-up and texts, one theta each): the block's seconds
    are that plus a rate per (text token, theta) pair, so a slice of few users does not charge its texts'
    p0 to the pairs."""
    if not job.rule.startswith("cross_user") or "fit_others" not in models:
        return 0.0
    intercept, rate = models["fit_others"]
    return intercept + rate * float(held_users(job, users, shards, fit_jobs)["train_end"].sum())


def wildcard_count(jobs: list[Job], name: str) -> int:
    """How many values the wildcard `name` takes in the DAG (extract.shards for shard, fit.jobs for job)."""
    values = {dict(item.split("=", 1) for item in job.wildcards.split(", ") if item).get(name) for job in jobs}
    return len(values - {None}) or 1


def rule_models(measured: list[Job], users: pd.DataFrame, startup: float) -> dict[str, tuple[float, float]]:
    """Each scaling rule's (startup, rate) from the measured run's jobs of that rule."""
    shards, fit_jobs = wildcard_count(measured, "shard"), wildcard_count(measured, "job")
    points = defaultdict(list)
    for job in measured:
        if job.source and (tokens := work(job, users, shards, fit_jobs)) is not None:
            points[job.rule].append((tokens, job))
    models = {}
    for rule in sorted(points, key=lambda rule: rule.startswith("cross_user")):  # fit_others' model first
        pairs = [
            (tokens, job.seconds - texts_part(job, users, shards, fit_jobs, models)) for tokens, job in points[rule]
        ]
        x, y = pd.Series([p[0] for p in pairs]), pd.Series([p[1] for p in pairs])
        rate = intercept = None
        if x.min() > 0 and x.max() >= 2 * x.min():  # a wide enough span for a line
            rate = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
            intercept = y.mean() - rate * x.mean()
            if intercept < 0 or rate < 0:
                rate = None
        if rate is None:
            intercept = 0.0 if rule.startswith("cross_user") else min(startup, y.min())  # in texts_part
            rate = max(y.sum() - intercept * len(y), 0.0) / max(x.sum(), 1.0)
        models[rule] = (float(intercept), float(rate))
    return models


def project(
    target: list[Job],
    measured: list[Job],
    users: pd.DataFrame,
    measured_users: pd.DataFrame,
    pair_seconds: float | None = None,
    startup: float | None = None,
) -> list[str]:
    """Set the target jobs' seconds from the measured run's; the rules the run did not measure.
    `pair_seconds`: the cross-user blocks' cost per (text token, theta) pair, where a slice of few users,
    whose blocks score few thetas, cannot resolve it (benchmarks/bench_cross_user.py measures it);
    `startup`: a job's start-up where no line is fitted (default: the run's cheapest benchmarked job)."""
    if startup is None:
        startup = min((job.seconds for job in measured if job.source == "benchmark file"), default=0.0)
    models = rule_models(measured, measured_users, startup)
    if pair_seconds is not None:
        models.update({rule: (0.0, pair_seconds) for rule in models if rule.startswith("cross_user")})
    shards, fit_jobs = wildcard_count(target, "shard"), wildcard_count(target, "job")
    by_rule = defaultdict(dict)
    for job in measured:
        if job.source:
            by_rule[job.rule][job.wildcards] = job.seconds
    print(f"projection: start-up of a job without a fitted line: {startup:.1f} s")
    for rule, (intercept, rate) in sorted(models.items()):
        print(f"  {rule}: {intercept:.1f} s + {rate * 1e3:.3f} ms per unit of work")
    missing = set()
    for job in target:
        tokens = work(job, users, shards, fit_jobs)
        if job.rule in models and tokens is not None:
            intercept, rate = models[job.rule]
            job.seconds = texts_part(job, users, shards, fit_jobs, models) + intercept + rate * tokens
        elif job.rule in by_rule:
            same = by_rule[job.rule]
            job.seconds = same.get(job.wildcards, sum(same.values()) / len(same))
        else:
            job.seconds = 0.0
            missing.add(job.rule)
    return sorted(missing)


# ---------------------------------------------------------------------------------------------------------
# the report


def print_rules(jobs: list[Job], top: int | None = TOP_RULES) -> None:
    seconds, counts = defaultdict(float), defaultdict(int)
    for job in jobs:
        seconds[job.rule] += job.seconds
        counts[job.rule] += 1
    total = sum(seconds.values()) or 1.0
    ranked = sorted(seconds, key=seconds.__getitem__, reverse=True)
    print(f"rules by job-seconds ({sum(seconds.values()):,.1f} in all):")
    for rule in ranked[:top]:
        print(f"  {rule:<28} {counts[rule]:>4} jobs {seconds[rule]:>10,.1f} s {100 * seconds[rule] / total:5.1f} %")


def print_critical_path(jobs: list[Job]) -> None:
    length, path = critical_path(jobs)
    print(f"critical path ({length:,.1f} s, {len(path)} jobs):")
    for i in path:
        print(f"  {jobs[i].rule:<28} {jobs[i].wildcards:<40} {jobs[i].seconds:>8.1f} s")


def print_cores(jobs: list[Job], cores_list: list[int]) -> None:
    length = critical_path(jobs)[0]
    for cores in cores_list:
        print(f"cores={cores} wall_s={simulate(jobs, cores):.1f} critical_path_s={length:.1f}")


def check(jobs: list[Job], log: RunLog) -> None:
    """The log's jobs on the log's cores against its measured wall."""
    index = {job.key: i for i, job in enumerate(jobs)}
    ran = {index[key] for key in log.keys if key in index}
    unknown = sum(key not in index for key in log.keys)
    print(f"log: {log.path}: {len(log.keys)} jobs started ({unknown} not in the DAG), cores {log.cores}")
    print(f"measured wall (first to last timestamp): {log.wall:.1f} s")
    if unfinished := sum(key not in log.durations for key in log.keys):
        print(f"{unfinished} started jobs have no Finished line (a run still going, or stopped): not comparable")
    if log.cores is None:
        print("the log names no core count (Provided cores): no simulated wall to compare")
        return
    simulated = simulate(subset(jobs, ran), log.cores)
    error = (simulated - log.wall) / log.wall if log.wall else float("nan")
    verdict = "within" if abs(error) <= 0.15 else "NOT within"
    print(f"simulated wall at {log.cores} cores: {simulated:.1f} s, error {100 * error:+.1f} % ({verdict} 15 %)")
    timed = [i for i in ran if jobs[i].source == "benchmark file" and jobs[i].key in log.durations]
    if timed:
        gap = sum(log.durations[jobs[i].key] - jobs[i].seconds for i in timed) / len(timed)
        print(
            f"a job's log time (start to Finished) minus its benchmark seconds: {gap:+.2f} s on average ({len(timed)} jobs)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the measured run's results folder")
    parser.add_argument("--configfile", type=Path, nargs="+", help="its config files (<workflow-dir>/config.yaml)")
    parser.add_argument("--workflow-dir", type=Path, help="its checkout (default: the folder above --results)")
    parser.add_argument("--log", type=Path, help="its Snakemake log (default: the checkout's newest)")
    parser.add_argument("--dag-cores", type=int, help="--cores of the dry-runs (default: the log's, else 2)")
    parser.add_argument("--cores-list", type=int, nargs="+", default=CORES)
    parser.add_argument("--project-config", type=Path, nargs="+", help="config files of a study to project")
    parser.add_argument("--users", type=Path, help="that study's users.parquet (with --project-config)")
    parser.add_argument("--pair-us", type=float, help="cross-user cost per (text token, theta) pair, microseconds")
    parser.add_argument("--startup", type=float, help="a fit job's start-up, seconds (default: the cheapest job)")
    args = parser.parse_args()
    if bool(args.project_config) != bool(args.users):
        parser.error("--project-config and --users go together")

    results = args.results.absolute()
    workflow_dir = (args.workflow_dir or results.parent).absolute()
    configfiles = [path.absolute() for path in args.configfile or [workflow_dir / "config.yaml"]]
    log_path = args.log or newest_log(workflow_dir)
    log = read_log(log_path, workflow_dir) if log_path else None
    dag_cores = args.dag_cores or (log.cores if log and log.cores else 2)

    jobs = dry_run(workflow_dir, configfiles, results, dag_cores)
    sources = measure(jobs, log)
    print(f"run: {results} (workflow {workflow_dir}, DAG at --cores {dag_cores}): {len(jobs)} jobs")
    print("job seconds from: " + ", ".join(f"{source} {count}" for source, count in sources.items()))
    if log is None:
        print("no Snakemake log: no measured wall")
    else:
        check(jobs, log)
    if args.project_config:
        with tempfile.TemporaryDirectory(prefix="makespan-") as scratch:
            target = dry_run(workflow_dir, [path.absolute() for path in args.project_config], Path(scratch), dag_cores)
        users, measured_users = pd.read_parquet(args.users), pd.read_parquet(results / "corpus" / "users.parquet")
        pair_seconds = None if args.pair_us is None else args.pair_us * 1e-6
        missing = project(target, jobs, users, measured_users, pair_seconds, args.startup)
        print(f"projected: {len(target)} jobs, {len(users)} users (the run: {len(measured_users)})")
        if missing:
            print(f"not measured in the run (0 s): {', '.join(missing)}")
        jobs = target
    print_critical_path(jobs)
    print_rules(jobs, None if args.project_config else TOP_RULES)
    print_cores(jobs, args.cores_list)


if __name__ == "__main__":
    main()
