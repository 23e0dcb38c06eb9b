"""A finished run's makespan on N cores: its jobs' measured seconds replayed on the workflow's DAG.

    .venv/bin/python benchmarks/makespan.py --results /work/base/results
    .venv/bin/python benchmarks/makespan.py --results results-slice --configfile config.yaml config/full.yaml \\
        --project-config config.yaml config/full.yaml --users results-full/corpus/users.parquet
    m=benchmarks/measured/2026-11-26-h100
    .venv/bin/python benchmarks/makespan.py --workflow-dir <checkout of f5a67cd> --gpu-benchmarks $m/benchmarks \\
        --gpu-logs $m/snakemake-run1.log $m/snakemake-run2-resumed.log --users $m/users.tsv --cores-list 16 --gpus 1 4

Method. The DAG is `snakemake --dry-run --forceall --nolock` on the run's own checkout (--workflow-dir,
default the folder above --results; its `uph` first on PYTHONPATH) with `--config results=<--results>`,
parsed from the job blocks it prints (rule, jobid, input, output, benchmark, threads, priority,
wildcards, and the resource `gpu` of its resources line); a job depends on the jobs whose outputs it takes
as input. A job's seconds are the `s` column of its benchmark file (last row), else the time from its start
to its "Finished jobid" line in the run's Snakemake log (1 s resolution), else 0 (counted). The simulation
is list scheduling on N cores in the order Snakemake's scheduler prefers: whenever cores are free, the ready
jobs (every input's job done) by priority (higher first), then jobid (lower first), each start when its
cores fit, holding min(threads, N) cores for its measured seconds; wall_s is the last finish. The threads
are those of the DAG built at N cores (a dry-run at each N): a rule's threads may depend on the cores
(extraction on a cluster asks workflow.cores // shards), and a job that asks more cores than are free
waits while later jobs that fit start (Snakemake reserves no cores either). Among jobs of equal
priority Snakemake's ILP scheduler picks any set that fills the cores, so the jobid order is one of its
choices, not its exact one. critical_path_s is the longest seconds-weighted path through the DAG, the wall
on unlimited cores. Jobs keep their measured seconds at every N: the contention of the measured run (jobs
sharing memory bandwidth on its cores) stays in them, and a job given more threads is not made faster.

GPU slots (--gpus G ...): a job that asks for resource `gpu` holds min(gpu, G) slots besides its cores
while it runs, and starts only when both fit (Snakemake's --resources gpu=G; profiles/default grants 4).
G 0 or absent: slots are not counted, the CPU behaviour (the output is then the same as before slots
existed). With --gpus each line adds lm_chain_s, the language-model chain's wall: from the corpus job's
start to the personalization table's finish.

The check: the jobs the log lists, replayed on the log's own cores (its "Provided cores"), against its
measured wall (first to last timestamp); the jobs it did not run (a resumed run) count as done at start.

Projection (--project-config, --users): the DAG of another config (built in a temporary results folder),
each job's seconds from the measured run's jobs of the same rule, scaled by the job's work. Work is the
train tokens (users.parquet's train_end) of the users the job holds: a `shard` job those with
uph.lm.data.cache.shard_of(user, shards), a `job` job those of uph.lm.jobs.partition.fit_job_users(users, jobs), for
shards and jobs the count of the DAG's shard and job wildcard values; rules named cross_user* score every
user's theta on the job's held-out text: a block costs what fit_others costs on the same users (its texts'
p0 and one pass each) plus its pairs, the job's held-out tokens (n_tokens - test_start) x the number of
users, at a rate from the measured blocks less that part. Per rule, seconds = startup + rate x work: a
least-squares line through the measured jobs when their work spans at least a factor of 2 (startup and
rate clipped at 0), else startup = the run's cheapest benchmarked job (a process start-up with its imports)
and rate = the rest of the rule's measured seconds per unit of work. Rules without work are taken as
measured (the job of the same wildcards, else the rule's mean); rules the run did not measure count 0
(listed). --dag-set KEY=VALUE sets config keys (dotted: fit.gpu_jobs=2) in the projected DAG's dry-runs and
--rule-threads RULE=N a rule's threads, to project a layout before the workflow has it.

A run measured on a GPU machine (--gpu-benchmarks DIR, its benchmark files copied there; --gpu-logs its
Snakemake logs, in order; --users its users table, e.g. benchmarks/measured/2026-11-26-h100/). Its DAG is
its checkout's (--workflow-dir, default this one) built with device=cuda, as a GPU machine builds it (device
auto sees the GPU there), at the logs' cores; each job's seconds from DIR/<its benchmark file's name>, else
the logs. The training branches ran on that machine's CPU cores beside the GPU jobs: their files are
theirs. The check: the jobs the logs finished, on the logs' cores and GPU slots (their "Provided
resources"), against the time the runs ran (each log from its first timestamp to its last Finished line,
summed: a run stopped and resumed loses the pause and the killed job's part), with each rule's first start
and last finish on both clocks. The projected DAG is --project-dir's (default this checkout), with
device=cuda and --dag-set, at each N; its seconds as in the projection above, where:
- a GPU rule's start-up without a fitted line (its jobs' work spans less than 2x: the default's per-user
  jobs are balanced) is --gpu-startup, default the run's cheapest benchmarked GPU job (a process with CUDA
  and its reads; the measured logs put a validate or fit job's start-up before its first user at 12-13 s);
- --gpu-work-scale X multiplies GPU jobs' work part (rate x work), not their start-up: a faster fit
  engine (the lockstep jobs of fit.gpu_jobs) projected before it is measured; printed;
- a GPU rule with work that the run did not finish (2026-11-26's stopped in fit_others: no fit_others,
  cross_user* blocks) costs, per job, what a fit job of the same users costs on the GPU (fit's line): the
  nearest GPU rule, reading the same model, shards and thetas for the same users. On the CPU a fit_others
  job of 2 users took 3.8 s against a fit job's 27 s (docs/performance.md), nearly all start-up, so
  this is an upper bound by at most fit's work part; --unfinished-as startup gives the lower bound, the
  GPU start-up alone;
- the other rules it did not finish (headline_point, the tables, aggregate, provenance: CPU jobs) take a
  CPU run's benchmark file of the same name (--cpu-results) or --cpu-seconds RULE=S, else 0 (listed).
GPU jobs sharing one GPU (G > 1) keep the seconds they took alone: the GPU's own contention is not modelled.
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
import yaml

CORES = [1, 2, 4, 8, 16, 64, 256]
TIMESTAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
BLOCK = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")  # a run's log says localrule for local jobs
FIELD = re.compile(r"^    (\w+): (.*)$")
FINISHED = re.compile(r"^Finished job(?:id)?:? (\d+)")
GPU = re.compile(r"(?:^|, )gpu=(\d+)")  # in a job block's resources line
PROVIDED_GPUS = re.compile(r'^Provided resources: .*\bgpu=Resource\("gpu", (\d+)\)', re.M)
CHAIN = ("corpus", "personalization_table")  # the language-model chain's wall: the first's start to the last's finish
TOP_RULES = 10


@dataclass
class Job:
    """One job of the DAG; `deps` are indices into the same job list."""

    rule: str
    wildcards: str = ""
    jobid: int = 0
    threads: int = 1
    priority: int = 0
    gpus: int = 0  # resource gpu: the GPU slots it holds while it runs
    seconds: float = 0.0
    deps: tuple[int, ...] = ()
    source: str = ""  # where seconds came from: "benchmark file", "log", or "" (not measured)
    inputs: list[str] = field(default_factory=list, repr=False)
    outputs: list[str] = field(default_factory=list, repr=False)
    benchmark: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the job across dry-runs and a run's logs: its rule and wildcards (their jobids
        differ when a run was a partial one, their paths when the DAG is built in another results folder)."""
        return self.rule, self.wildcards


# ---------------------------------------------------------------------------------------------------------
# the scheduler: pure functions of the job list


def schedule(jobs: list[Job], cores: int, gpus: int | None = None) -> list[tuple[float, float]]:
    """Each job's (start, finish) under list scheduling on `cores` cores and, where `gpus` is given and not
    0, that many GPU slots (see the module docstring); `gpus` 0 or None leaves the GPU slots out."""
    waiting = [len(job.deps) for job in jobs]
    dependents = [[] for _ in jobs]
    for i, job in enumerate(jobs):
        for dep in job.deps:
            dependents[dep].append(i)

    def held(i: int) -> tuple[int, int]:  # (cores, GPU slots), each at most what the machine has
        return min(jobs[i].threads, cores), min(jobs[i].gpus, gpus) if gpus else 0

    ready = [i for i, count in enumerate(waiting) if count == 0]
    running: list[tuple[float, int]] = []  # (finish, job)
    times = [(0.0, 0.0)] * len(jobs)
    free, free_gpus, now = cores, gpus or 0, 0.0
    while ready or running:
        ready.sort(key=lambda i: (-jobs[i].priority, jobs[i].jobid))
        for i in list(ready):
            need, need_gpus = held(i)
            if need <= free and need_gpus <= free_gpus:
                free, free_gpus = free - need, free_gpus - need_gpus
                ready.remove(i)
                times[i] = (now, now + jobs[i].seconds)
                heappush(running, (now + jobs[i].seconds, i))
        now = running[0][0]
        while running and running[0][0] == now:  # every job finishing now frees its cores and slots first
            _, i = heappop(running)
            need, need_gpus = held(i)
            free, free_gpus = free + need, free_gpus + need_gpus
            for j in dependents[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    ready.append(j)
    return times


def simulate(jobs: list[Job], cores: int, gpus: int | None = None) -> float:
    """The finish time of the last job under list scheduling on `cores` cores (and `gpus` GPU slots)."""
    return max((finish for _, finish in schedule(jobs, cores, gpus)), default=0.0)


def chain_wall(jobs: list[Job], times: list[tuple[float, float]], chain: tuple[str, str] = CHAIN) -> float | None:
    """From the first start of a job of rule chain[0] to the last finish of one of chain[1] (None without)."""
    starts = [times[i][0] for i, job in enumerate(jobs) if job.rule == chain[0]]
    ends = [times[i][1] for i, job in enumerate(jobs) if job.rule == chain[1]]
    return max(ends) - min(starts) if starts and ends else None


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
            elif key == "resources" and (gpu := GPU.search(value)):
                job.gpus = int(gpu.group(1))
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


def nested(settings: dict[str, object]) -> dict:
    """{"fit.jobs": 2} -> {"fit": {"jobs": 2}}."""
    tree: dict = {}
    for key, value in settings.items():
        *parents, last = key.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[last] = value
    return tree


def dry_run(
    workflow_dir: Path, configfiles: list[Path], results: Path, cores: int, settings: dict | None = None
) -> list[Job]:
    """The DAG of every job (--forceall) as the workflow in `workflow_dir` builds it at `cores` cores, writing
    to `results`; `settings` (dotted config keys -> values) in a config file after `configfiles`."""
    with tempfile.TemporaryDirectory(prefix="makespan-settings-") as folder:
        if settings:
            (Path(folder) / "settings.yaml").write_text(yaml.safe_dump(nested(settings)))
            configfiles = [*configfiles, Path(folder) / "settings.yaml"]
        command = [str(Path(sys.executable).with_name("snakemake")), "--dry-run", "--forceall", "--nolock"]
        command += ["--snakefile", str(workflow_dir / "Snakefile"), "--directory", str(workflow_dir)]
        command += ["--cores", str(cores), "--configfile", *map(str, configfiles), "--config", f"results={results}"]
        path = os.pathsep.join(filter(None, [str(workflow_dir), os.environ.get("PYTHONPATH")]))
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        sys.exit(f"the dry-run failed ({' '.join(command)}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    jobs = [job for job, _ in parse_blocks(done.stdout.splitlines(), workflow_dir)[0]]
    link(jobs)
    return jobs


def with_resources(jobs: list[Job], dag: list[Job], threads: dict[str, int] | None = None) -> list[Job]:
    """`jobs` asking what the same jobs (rule and wildcards) of `dag` ask, threads and GPUs: `dag` is the
    workflow's DAG built at the cores of a projection (a rule's threads may depend on them: extraction on a
    cluster asks workflow.cores // shards). `threads`: a rule's threads set by hand, before a layout lands."""
    asked = {job.key: (job.threads, job.gpus) for job in dag}
    if missing := [job.key for job in jobs if job.key not in asked]:
        sys.exit(f"{len(missing)} jobs are not in the DAG built at other cores, e.g. {missing[0]}")
    threads = threads or {}
    return [replace(job, threads=threads.get(job.rule, asked[job.key][0]), gpus=asked[job.key][1]) for job in jobs]


@dataclass
class RunLog:
    path: Path
    cores: int | None
    wall: float  # first to last timestamp
    durations: dict  # job key -> seconds from its start to its Finished line
    keys: list  # every job key the log starts, in order
    gpus: int | None = None  # its Provided resources: gpu
    first: datetime | None = None  # its first timestamp
    ran: dict = field(default_factory=dict)  # job key -> (start, finish) of the jobs it finished

    @property
    def running(self) -> float:
        """From its first timestamp to its last Finished line: the time it ran jobs that finished."""
        return max(((finish - self.first).total_seconds() for _, finish in self.ran.values()), default=0.0)


def read_log(path: Path, default_workdir: Path) -> RunLog:
    lines = path.read_text().splitlines()
    header = "\n".join(lines[:40])
    workdir = re.search(r"^\s*Working directory: (.+)$", header, re.M)
    cores = re.search(r"^Provided cores: (\d+)$", "\n".join(lines), re.M)
    gpus = PROVIDED_GPUS.search("\n".join(lines))
    blocks, finished, stamps = parse_blocks(lines, Path(workdir.group(1)) if workdir else default_workdir)
    ran = {
        job.key: (start, finished[job.jobid]) for job, start in blocks if start is not None and job.jobid in finished
    }
    durations = {key: (finish - start).total_seconds() for key, (start, finish) in ran.items()}
    wall = (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0
    return RunLog(
        path,
        int(cores.group(1)) if cores else None,
        wall,
        durations,
        [job.key for job, _ in blocks],
        int(gpus.group(1)) if gpus else None,
        stamps[0] if stamps else None,
        ran,
    )


def newest_log(workflow_dir: Path) -> Path | None:
    logs = sorted((workflow_dir / ".snakemake" / "log").glob("*.snakemake.log"))
    return logs[-1] if logs else None


def benchmark_seconds(path: str | None) -> float | None:
    if path is None or not Path(path).is_file():
        return None
    table = pd.read_csv(path, sep="\t")
    return float(table["s"].iloc[-1]) if len(table) else None


def measure(jobs: list[Job], logs: list[RunLog], folder: Path | None = None) -> dict[str, int]:
    """Set each job's seconds (benchmark file, else the logs, else 0) and source; how many came from which.
    `folder`: the run's benchmark files copied there (a job's is the file of its benchmark's name)."""
    durations = {key: seconds for log in logs for key, seconds in log.durations.items()}
    for job in jobs:
        path = job.benchmark if folder is None or job.benchmark is None else str(folder / Path(job.benchmark).name)
        seconds = benchmark_seconds(path)
        if seconds is not None:
            job.seconds, job.source = seconds, "benchmark file"
        elif job.key in durations:
            job.seconds, job.source = durations[job.key], "log"
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
        from uph.lm.data.cache import shard_of

        return users[[shard_of(user, shards) == int(wildcards["shard"]) for user in users["user_id"]]]
    if "job" in wildcards:
        from uph.lm.jobs.partition import fit_job_users

        return users[users["user_id"].isin(fit_job_users(users, fit_jobs)[int(wildcards["job"])])]
    return users


def work(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int) -> float | None:
    """The job's tokens of work (module docstring), or None for a rule that does not scale with users."""
    held = held_users(job, users, shards, fit_jobs)
    if job.rule.startswith("cross_user"):
        return float((held["n_tokens"] - held["test_start"]).sum()) * len(users)
    wildcards = dict(item.split("=", 1) for item in job.wildcards.split(", ") if item)
    return float(held["train_end"].sum()) if {"shard", "job"} & set(wildcards) else None


def texts_part(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int, models: dict, scale: float = 1.0) -> float:
    """What a cross-user block costs before its pairs: its texts' p0 and one scoring pass each, which is a
    fit_others job of the same users (the same start-up and texts, one theta each): the block's seconds
    are that plus a rate per (text token, theta) pair, so a slice of few users does not charge its texts'
    p0 to the pairs. `scale`: a factor on the work part (--gpu-work-scale)."""
    if not job.rule.startswith("cross_user") or "fit_others" not in models:
        return 0.0
    intercept, rate = models["fit_others"]
    return intercept + scale * rate * train_tokens(job, users, shards, fit_jobs)


def train_tokens(job: Job, users: pd.DataFrame, shards: int, fit_jobs: int) -> float:
    """The train tokens of the users the job holds."""
    return float(held_users(job, users, shards, fit_jobs)["train_end"].sum())


def wildcard_count(jobs: list[Job], name: str) -> int:
    """How many values the wildcard `name` takes in the DAG (extract.shards for shard, fit.jobs for job)."""
    values = {dict(item.split("=", 1) for item in job.wildcards.split(", ") if item).get(name) for job in jobs}
    return len(values - {None}) or 1


def rule_models(
    measured: list[Job], users: pd.DataFrame, startup: float, gpu_startup: float | None = None
) -> dict[str, tuple[float, float]]:
    """Each scaling rule's (startup, rate) from the measured run's jobs of that rule; `gpu_startup`: the
    start-up of a rule whose jobs hold a GPU, where no line is fitted (default: `startup`)."""
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
            start = gpu_startup if gpu_startup is not None and any(job.gpus for _, job in points[rule]) else startup
            intercept = 0.0 if rule.startswith("cross_user") else min(start, y.min())  # in texts_part
            rate = max(y.sum() - intercept * len(y), 0.0) / max(x.sum(), 1.0)
        models[rule] = (float(intercept), float(rate))
    return models


@dataclass
class GpuCosts:
    """How a run measured on a GPU machine projects (--gpu-benchmarks; the module docstring).

    startup: a GPU rule's start-up where no line is fitted (None: the run's cheapest benchmarked GPU job);
    work_scale: the factor on GPU jobs' work part (--gpu-work-scale; start-ups stay);
    unfinished: how a GPU rule with work that the run did not finish costs: "fit", as a fit job of the same
    users; "startup", the GPU start-up alone;
    cpu_seconds, cpu_benchmarks: the seconds of the other rules it did not finish, by rule (--cpu-seconds)
    or from a CPU run's benchmark files of the same names (--cpu-results)."""

    startup: float | None = None
    work_scale: float = 1.0
    unfinished: str = "fit"
    cpu_seconds: dict = field(default_factory=dict)
    cpu_benchmarks: Path | None = None

    def cpu_cost(self, job: Job) -> float | None:
        if self.cpu_benchmarks is not None and job.benchmark is not None:
            seconds = benchmark_seconds(str(self.cpu_benchmarks / Path(job.benchmark).name))
            if seconds is not None:
                return seconds
        return self.cpu_seconds.get(job.rule)


def project(
    target: list[Job],
    measured: list[Job],
    users: pd.DataFrame,
    measured_users: pd.DataFrame,
    pair_seconds: float | None = None,
    startup: float | None = None,
    gpu: GpuCosts | None = None,
) -> list[str]:
    """Set the target jobs' seconds from the measured run's; the rules the run did not measure.
    `pair_seconds`: the cross-user blocks' cost per (text token, theta) pair, where a slice of few users,
    whose blocks score few thetas, cannot resolve it (benchmarks/bench_cross_user.py measures it);
    `startup`: a job's start-up where no line is fitted (default: the run's cheapest benchmarked job);
    `gpu`: a run measured on a GPU machine (GpuCosts), the target's jobs holding a GPU where `gpus` says."""
    if startup is None:
        startup = min((job.seconds for job in measured if job.source == "benchmark file"), default=0.0)
    gpu_startup = None
    if gpu is not None:
        cheapest = (job.seconds for job in measured if job.source == "benchmark file" and job.gpus)
        gpu_startup = gpu.startup if gpu.startup is not None else min(cheapest, default=startup)
    models = rule_models(measured, measured_users, startup, gpu_startup)
    if pair_seconds is not None:
        models.update({rule: (0.0, pair_seconds) for rule in models if rule.startswith("cross_user")})
    shards, fit_jobs = wildcard_count(target, "shard"), wildcard_count(target, "job")
    by_rule = defaultdict(dict)
    for job in measured:
        if job.source:
            by_rule[job.rule][job.wildcards] = job.seconds
    print(f"projection: start-up of a job without a fitted line: {startup:.1f} s")
    if gpu is not None:
        print(f"  of a GPU job (holding resource gpu): {gpu_startup:.1f} s")
        print(f"  --gpu-work-scale {gpu.work_scale:g}: GPU jobs' work part (rate x work) times {gpu.work_scale:g}")
    for rule, (intercept, rate) in sorted(models.items()):
        print(f"  {rule}: {intercept:.1f} s + {rate * 1e3:.3f} ms per unit of work")
    missing, unfinished, from_cpu = set(), set(), set()
    for job in target:
        tokens = work(job, users, shards, fit_jobs)
        scale = gpu.work_scale if gpu is not None and job.gpus else 1.0
        if job.rule in models and tokens is not None:
            intercept, rate = models[job.rule]
            job.seconds = texts_part(job, users, shards, fit_jobs, models, scale) + intercept + scale * rate * tokens
        elif gpu is not None and job.gpus and tokens is not None:  # a GPU rule the run did not finish
            intercept, rate = models.get("fit", (gpu_startup, 0.0)) if gpu.unfinished == "fit" else (gpu_startup, 0.0)
            job.seconds = intercept + scale * rate * train_tokens(job, users, shards, fit_jobs)
            unfinished.add(job.rule)
        elif job.rule in by_rule:
            same = by_rule[job.rule]
            job.seconds = same.get(job.wildcards, sum(same.values()) / len(same))
        elif gpu is not None and (seconds := gpu.cpu_cost(job)) is not None:
            job.seconds = seconds
            from_cpu.add(job.rule)
        else:
            job.seconds = 0.0
            missing.add(job.rule)
    if unfinished:
        how = "as a fit job of the same users" if gpu.unfinished == "fit" and "fit" in models else "its start-up"
        print(f"GPU rules the run did not finish, each job {how}: {', '.join(sorted(unfinished))}")
    if from_cpu:
        print(f"rules the run did not finish, from the CPU figures: {', '.join(sorted(from_cpu))}")
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


def print_cores(jobs_at, cores_list: list[int], gpus_list: list[int] | None = None) -> None:
    """The wall at each N of `cores_list` and its critical path; `jobs_at(N)`: the jobs holding the threads
    the DAG built at N cores asks. With `gpus_list`, at each G of it too (0: slots not counted), and the
    language-model chain's wall (CHAIN)."""
    for cores in cores_list:
        jobs = jobs_at(cores)
        length = critical_path(jobs)[0]
        if not gpus_list:
            print(f"cores={cores} wall_s={simulate(jobs, cores):.1f} critical_path_s={length:.1f}")
        for gpus in gpus_list or []:
            times = schedule(jobs, cores, gpus)
            wall, chain = max((finish for _, finish in times), default=0.0), chain_wall(jobs, times)
            print(
                f"cores={cores} gpus={gpus or 'unlimited'} wall_s={wall:.1f} critical_path_s={length:.1f} "
                f"lm_chain_s={'-' if chain is None else f'{chain:.1f}'}"
            )


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


def check_runs(jobs: list[Job], logs: list[RunLog], cores: int, gpus: int | None) -> None:
    """The jobs the logs finished, replayed on `cores` cores and `gpus` GPU slots, against the time the runs
    ran: each log from its first timestamp to its last Finished line, summed (a run stopped and resumed:
    the pause and the work of the jobs killed when it stopped are left out); each rule's first start and
    last finish on that clock, measured and simulated."""
    index = {job.key: i for i, job in enumerate(jobs)}
    measured, offset = {}, 0.0
    for log in logs:
        for key, (start, finish) in log.ran.items():
            measured[key] = tuple(offset + (at - log.first).total_seconds() for at in (start, finish))
        offset += log.running
    keep = sorted(index[key] for key in measured if key in index)
    ran = subset(jobs, set(keep))
    times = schedule(ran, cores, gpus)
    simulated = max((finish for _, finish in times), default=0.0)
    unknown = sum(key not in index for key in measured)
    print(f"logs: {', '.join(str(log.path) for log in logs)}")
    print(f"  {len(measured)} jobs finished ({unknown} not in the DAG), replayed at {cores} cores, {gpus} GPU slots")
    spans = " + ".join(f"{log.running:.0f}" for log in logs)
    print(f"measured running time (each log's first timestamp to its last Finished line): {offset:.1f} s ({spans})")
    error = (simulated - offset) / offset if offset else float("nan")
    verdict = "within" if abs(error) <= 0.15 else "NOT within"
    print(f"simulated wall: {simulated:.1f} s, error {100 * error:+.1f} % ({verdict} 15 %)")
    rules = defaultdict(lambda: [[], []])
    for k, i in enumerate(keep):
        rules[jobs[i].rule][0].append(measured[jobs[i].key])
        rules[jobs[i].rule][1].append(times[k])
    print("rule: first start and last finish (s), measured | simulated")
    for rule, (real, replay) in sorted(rules.items(), key=lambda item: min(item[1][0])):
        first, last = min(real)[0], max(end for _, end in real)
        print(
            f"  {rule:<28} {len(real):>3} jobs {first:>6.0f} {last:>6.0f} | "
            f"{min(replay)[0]:>6.0f} {max(end for _, end in replay):>6.0f}"
        )


def dags(workflow_dir: Path, configfiles: list[Path], results: Path, settings: dict | None = None, built=None):
    """cores -> the DAG the workflow builds at those cores (a dry-run each, once); `built`: {cores: DAG}."""
    cache = dict(built or {})

    def at(cores: int) -> list[Job]:
        if cores not in cache:
            cache[cores] = dry_run(workflow_dir, configfiles, results, cores, settings)
        return cache[cores]

    return at


def read_users(path: Path) -> pd.DataFrame:
    """A users table: users.parquet, or a .tsv of its columns (benchmarks/measured/*/users.tsv)."""
    return pd.read_csv(path, sep="\t") if path.suffix == ".tsv" else pd.read_parquet(path)


def assignments(items: list[str] | None, convert) -> dict:
    """["KEY=VALUE", ...] -> {KEY: convert(VALUE)}."""
    pairs = [item.split("=", 1) for item in items or []]
    if bad := [item for item, pair in zip(items or [], pairs) if len(pair) != 2]:
        sys.exit(f"not KEY=VALUE: {bad[0]}")
    return {key: convert(value) for key, value in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the measured run's results folder")
    parser.add_argument("--configfile", type=Path, nargs="+", help="its config files (<workflow-dir>/config.yaml)")
    parser.add_argument("--workflow-dir", type=Path, help="its checkout (default: the folder above --results)")
    parser.add_argument("--log", type=Path, help="its Snakemake log (default: the checkout's newest)")
    parser.add_argument("--dag-cores", type=int, help="--cores of the run's dry-run (default: the log's, else 2)")
    parser.add_argument("--cores-list", type=int, nargs="+", default=CORES)
    parser.add_argument("--gpus", type=int, nargs="+", help="GPU slots (resource gpu) at each N; 0: not counted")
    parser.add_argument("--project-config", type=Path, nargs="+", help="config files of a study to project")
    parser.add_argument("--users", type=Path, help="that study's users.parquet (with --project-config)")
    parser.add_argument("--pair-us", type=float, help="cross-user cost per (text token, theta) pair, microseconds")
    parser.add_argument("--startup", type=float, help="a fit job's start-up, seconds (default: the cheapest job)")
    gpu = parser.add_argument_group("a run measured on a GPU machine (module docstring)")
    gpu.add_argument("--gpu-benchmarks", type=Path, help="its benchmark files' folder (the DAG: --workflow-dir's)")
    gpu.add_argument("--gpu-logs", type=Path, nargs="+", help="its Snakemake logs, in order (stopped, resumed)")
    gpu.add_argument("--project-dir", type=Path, help="the checkout whose DAG is projected (default: this one)")
    gpu.add_argument("--run-users", type=Path, help="its users table (default: --users)")
    gpu.add_argument("--gpu-startup", type=float, help="a GPU job's start-up (default: the cheapest GPU job)")
    gpu.add_argument("--gpu-work-scale", type=float, default=1.0, help="factor on GPU jobs' work part (default 1)")
    gpu.add_argument("--unfinished-as", choices=["fit", "startup"], default="fit", help="GPU rules it did not finish")
    gpu.add_argument("--cpu-results", type=Path, help="a CPU run's results folder, for the rules it did not finish")
    gpu.add_argument("--cpu-seconds", nargs="+", metavar="RULE=S", help="a job's seconds of a rule it did not finish")
    parser.add_argument("--dag-set", nargs="+", metavar="KEY=VALUE", help="config keys set in the projected DAG")
    parser.add_argument("--rule-threads", nargs="+", metavar="RULE=N", help="a rule's threads, set by hand")
    args = parser.parse_args()
    if args.gpu_benchmarks is None and bool(args.project_config) != bool(args.users):
        parser.error("--project-config and --users go together")
    if args.gpu_benchmarks is not None and args.users is None:
        parser.error("--gpu-benchmarks needs --users")
    if args.dag_set and not (args.project_config or args.gpu_benchmarks):
        parser.error("--dag-set sets keys of a projected DAG (--project-config or --gpu-benchmarks)")
    settings = assignments(args.dag_set, yaml.safe_load)
    threads = assignments(args.rule_threads, int)
    if args.gpu_benchmarks is not None:
        gpu_main(args, settings, threads)
        return

    results = args.results.absolute()
    workflow_dir = (args.workflow_dir or results.parent).absolute()
    configfiles = [path.absolute() for path in args.configfile or [workflow_dir / "config.yaml"]]
    log_path = args.log or newest_log(workflow_dir)
    log = read_log(log_path, workflow_dir) if log_path else None
    dag_cores = args.dag_cores or (log.cores if log and log.cores else 2)

    jobs = dry_run(workflow_dir, configfiles, results, dag_cores)
    sources = measure(jobs, [log] if log else [])
    print(f"run: {results} (workflow {workflow_dir}, DAG at --cores {dag_cores}): {len(jobs)} jobs")
    print("job seconds from: " + ", ".join(f"{source} {count}" for source, count in sources.items()))
    if log is None:
        print("no Snakemake log: no measured wall")
    else:
        check(jobs, log)
    with tempfile.TemporaryDirectory(prefix="makespan-") as scratch:
        build = dags(workflow_dir, configfiles, results, built={dag_cores: jobs})
        if args.project_config:
            configs = [path.absolute() for path in args.project_config]
            build = dags(workflow_dir, configs, Path(scratch), settings)
            target = build(dag_cores)
            users, measured_users = read_users(args.users), pd.read_parquet(results / "corpus" / "users.parquet")
            pair_seconds = None if args.pair_us is None else args.pair_us * 1e-6
            missing = project(target, jobs, users, measured_users, pair_seconds, args.startup)
            print(f"projected: {len(target)} jobs, {len(users)} users (the run: {len(measured_users)})")
            if missing:
                print(f"not measured in the run (0 s): {', '.join(missing)}")
            jobs = target
        print_critical_path(jobs)
        print_rules(jobs, None if args.project_config else TOP_RULES)
        print_cores(lambda cores: with_resources(jobs, build(cores), threads), args.cores_list, args.gpus)


def gpu_main(args: argparse.Namespace, settings: dict, threads: dict[str, int]) -> None:
    """--gpu-benchmarks: the run's DAG is --workflow-dir's (the run's checkout; default this one) with device
    cuda (as a GPU machine builds it) at the logs' cores; its jobs' seconds from the benchmark files, else
    the logs; checked against the logs; then the projected DAG: --project-dir's (default this checkout)
    with --project-config (default its config.yaml) and --dag-set, at each N of --cores-list."""
    here = Path(__file__).resolve().parent.parent
    workflow_dir = (args.workflow_dir or here).absolute()
    project_dir = (args.project_dir or here).absolute()
    configfiles = [path.absolute() for path in args.configfile or [workflow_dir / "config.yaml"]]
    logs = [read_log(path, workflow_dir) for path in args.gpu_logs or []]
    cores = args.dag_cores or next((log.cores for log in logs if log.cores), 16)
    slots = next((log.gpus for log in logs if log.gpus), 1)
    users = read_users(args.users)
    run_users = read_users(args.run_users) if args.run_users else users
    costs = GpuCosts(
        args.gpu_startup,
        args.gpu_work_scale,
        args.unfinished_as,
        assignments(args.cpu_seconds, float),
        args.cpu_results.absolute() / "benchmarks" if args.cpu_results else None,
    )
    with tempfile.TemporaryDirectory(prefix="makespan-") as scratch:
        measured = dry_run(workflow_dir, configfiles, Path(scratch) / "run", cores, {"device": "cuda"})
        sources = measure(measured, logs, args.gpu_benchmarks.absolute())
        print(f"run: {args.gpu_benchmarks} (DAG: {workflow_dir}, device cuda, --cores {cores}): {len(measured)} jobs")
        print("job seconds from: " + ", ".join(f"{source} {count}" for source, count in sources.items()))
        named = {Path(job.benchmark).name for job in measured if job.benchmark}
        if unused := sorted(path.name for path in args.gpu_benchmarks.glob("*.tsv") if path.name not in named):
            print(f"WARNING: {len(unused)} benchmark files name no job of this DAG (e.g. {unused[0]}): is")
            print("  --workflow-dir the run's checkout, at its commit?")
        if logs:
            check_runs(measured, logs, cores, slots)
        configs = [path.absolute() for path in args.project_config or [project_dir / "config.yaml"]]
        shown = ", ".join(f"{key}={value}" for key, value in {"device": "cuda", **settings}.items())
        print(f"projected DAG: {project_dir}, {' '.join(map(str, configs))} with {shown}")
        if threads:
            print("threads set by hand: " + ", ".join(f"{rule} {count}" for rule, count in threads.items()))
        build = dags(project_dir, configs, Path(scratch) / "target", {"device": "cuda", **settings})
        target = build(args.cores_list[0])
        missing = project(target, measured, users, run_users, None, args.startup, costs)
        print(f"projected: {len(target)} jobs, {len(users)} users (the run: {len(run_users)})")
        if missing:
            print(f"not measured in the run (0 s): {', '.join(missing)}")
        print_critical_path(target)
        print_rules(target, None)
        print_cores(lambda n: with_resources(target, build(n), threads), args.cores_list, args.gpus or [slots])


if __name__ == "__main__":
    main()
