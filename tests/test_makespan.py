"""benchmarks/makespan.py: list scheduling and the critical path on tiny DAGs worked out by hand, and the
parsing of Snakemake's job blocks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

SPEC = importlib.util.spec_from_file_location(
    "makespan", Path(__file__).resolve().parent.parent / "benchmarks" / "makespan.py"
)
makespan = sys.modules["makespan"] = importlib.util.module_from_spec(SPEC)  # dataclasses look it up
SPEC.loader.exec_module(makespan)
Job = makespan.Job


def diamond() -> list[Job]:
    """a (1 s) -> b (4 s), c (2 s) -> d (1 s)."""
    return [
        Job("a", jobid=0, seconds=1),
        Job("b", jobid=1, seconds=4, deps=(0,)),
        Job("c", jobid=2, seconds=2, deps=(0,)),
        Job("d", jobid=3, seconds=1, deps=(1, 2)),
    ]


@pytest.mark.parametrize(("cores", "wall"), [(1, 8), (2, 6), (64, 6)])
def test_diamond(cores, wall):
    assert makespan.simulate(diamond(), cores) == wall


def test_diamond_critical_path():
    assert makespan.critical_path(diamond()) == (6, [0, 1, 3])


def test_priority_then_jobid_order():
    # on 1 core the order is fixed by priority, then jobid; on 2 cores the order decides the pairs:
    # x (priority 1) and y start, y's 1 s frees a core for z (3 s), x ends at 2: wall 4
    jobs = [Job("y", jobid=0, seconds=1), Job("z", jobid=1, seconds=3), Job("x", jobid=2, seconds=2, priority=1)]
    assert makespan.simulate(jobs, 1) == 6
    assert makespan.simulate(jobs, 2) == 4
    jobs[1].priority = 2  # z first, then x beside it; y after x: wall 3
    assert makespan.simulate(jobs, 2) == 3


def test_two_thread_job():
    # a 2-thread job holds both cores of 2 (the 1-thread job waits), and 1 core of 1 (min(threads, N))
    jobs = [Job("wide", jobid=0, seconds=3, threads=2), Job("narrow", jobid=1, seconds=1)]
    assert makespan.simulate(jobs, 2) == 4
    assert makespan.simulate(jobs, 3) == 3
    assert makespan.simulate(jobs, 1) == 4
    # a free core left by a job that does not fit is taken by a later one (the scheduler backfills)
    jobs = [
        Job("one", jobid=0, seconds=2),
        Job("wide", jobid=1, seconds=3, threads=2),
        Job("small", jobid=2, seconds=1),
    ]
    assert makespan.simulate(jobs, 2) == 5  # one + small at 0, wide at 2


def test_subset_drops_deps_on_jobs_done():
    jobs = makespan.subset(diamond(), {1, 2, 3})
    assert [job.rule for job in jobs] == ["b", "c", "d"]
    assert jobs[2].deps == (0, 1)
    assert makespan.simulate(jobs, 2) == 5


def test_parse_blocks_and_link(tmp_path):
    text = """\
[Wed Nov 25 16:10:21 2026]
localrule make:
    output: results/a.txt
    jobid: 7
    benchmark: results/benchmarks/make.tsv
    priority: 10
    resources: tmpdir=/tmp
[Wed Nov 25 16:10:45 2026]
Finished jobid: 7 (Rule: make)
[Wed Nov 25 16:10:45 2026]
rule use:
    input: results/a.txt, data/raw.txt
    output: results/b-1.txt
    jobid: 3
    wildcards: shard=1, seed=0
    threads: 4
Select jobs to execute...
"""
    blocks, finished, stamps = makespan.parse_blocks(text.splitlines(), tmp_path)
    (make, start), (use, _) = blocks
    assert (make.rule, make.jobid, make.priority, make.threads) == ("make", 7, 10, 1)
    assert make.benchmark == str(tmp_path / "results/benchmarks/make.tsv")
    assert (finished[7] - start).total_seconds() == 24
    assert (use.wildcards, use.threads, use.inputs[1]) == ("shard=1, seed=0", 4, str(tmp_path / "data/raw.txt"))
    assert len(stamps) == 3
    jobs = [make, use]
    makespan.link(jobs)
    assert jobs[1].deps == (0,)


def test_work_of_fit_job_and_cross_user():
    users = pd.DataFrame(
        {"user_id": ["a", "b", "c"], "n_tokens": [100, 60, 50], "train_end": [80, 48, 40], "test_start": [90, 50, 45]}
    )
    # fit_job_users on 2 jobs: a (80) to job 0, then b (48) and c (40) to job 1
    assert makespan.work(Job("validate", wildcards="job=1"), users, shards=1, fit_jobs=2) == 88
    assert makespan.work(Job("cross_user_headline"), users, shards=1, fit_jobs=2) == (10 + 10 + 5) * 3
    assert makespan.work(Job("corpus"), users, shards=1, fit_jobs=2) is None


def test_gpu_slots_bind():
    # 4 GPU jobs of 10 s on 16 cores: one slot runs them one after another, four at once
    jobs = [Job(f"g{i}", jobid=i, seconds=10, gpus=1) for i in range(4)]
    assert makespan.simulate(jobs, 16, 1) == 40
    assert makespan.simulate(jobs, 16, 2) == 20
    assert makespan.simulate(jobs, 16, 4) == 10
    # a CPU job beside them is not held back by the slots; a job asking 2 slots of 1 holds the one
    jobs.append(Job("cpu", jobid=4, seconds=25))
    jobs.append(Job("wide", jobid=5, seconds=5, gpus=2))
    assert makespan.schedule(jobs, 16, 1)[4] == (0, 25)
    assert makespan.simulate(jobs, 16, 1) == 45
    # the slots bind with the cores: 2 cores, 2 slots, a 2-thread GPU job waits for both cores
    jobs = [Job("a", jobid=0, seconds=4), Job("b", jobid=1, seconds=3, threads=2, gpus=1)]
    assert makespan.schedule(jobs, 2, 2) == [(0, 4), (4, 7)]


def test_job_asking_more_threads_than_free_waits():
    # the measured H100 run's extraction: corpus (5 s) then extract (priority 10, 8 threads of 16) while 12
    # one-thread training jobs (10 s) hold 12 cores: it waits for them (4 free at 5 s), where at 2 threads
    # it starts when the corpus is done; a later job that fits the free cores starts meanwhile
    corpus = Job("corpus", jobid=0, seconds=5, priority=10)
    extract = Job("extract", jobid=1, seconds=3, threads=8, priority=10, gpus=1, deps=(0,))
    training = [Job("train", jobid=2 + i, seconds=10) for i in range(12)]
    late = Job("late", jobid=14, seconds=1, deps=(0,))
    times = makespan.schedule([corpus, extract, *training, late], 16, 1)
    assert times[1] == (10, 13)
    assert times[14] == (5, 6)
    extract.threads = 2
    assert makespan.schedule([corpus, extract, *training, late], 16, 1)[1] == (5, 8)


@pytest.mark.parametrize("cores", [1, 2, 3, 64])
def test_no_gpu_slots_is_the_cpu_schedule(cores):
    # G absent or 0: the slots are not counted, the schedule is the one without any GPU jobs
    def jobs(gpus):
        return [
            Job("a", jobid=0, seconds=1, gpus=gpus),
            Job("b", jobid=1, seconds=4, threads=2, gpus=gpus, deps=(0,)),
            Job("c", jobid=2, seconds=2, gpus=gpus, deps=(0,)),
            Job("d", jobid=3, seconds=1, priority=1),
            Job("e", jobid=4, seconds=1, deps=(1, 2)),
        ]

    cpu = makespan.schedule(jobs(0), cores)
    assert makespan.schedule(jobs(1), cores) == cpu
    assert makespan.schedule(jobs(1), cores, 0) == cpu
    assert makespan.schedule(jobs(0), cores, 1) == cpu  # no job asks for a GPU
    assert makespan.simulate(jobs(1), cores) == max(end for _, end in cpu)


def test_chain_wall():
    jobs = [Job("model", jobid=0, seconds=3), Job("corpus", jobid=1, seconds=2, deps=(0,))]
    jobs.append(Job("personalization_table", jobid=2, seconds=1, deps=(1,)))
    assert makespan.chain_wall(jobs, makespan.schedule(jobs, 2)) == 3
    assert makespan.chain_wall(jobs[:2], makespan.schedule(jobs[:2], 2)) is None


def test_resources_line_and_threads_at_other_cores(tmp_path):
    text = """\
rule extract:
    output: results/cache/shard-0.parquet
    jobid: 3
    wildcards: shard=0
    threads: 8
    resources: tmpdir=/tmp, gpu=1, mem_mb=8000, mem=8 GB, mem_mib=7630
rule train:
    output: results/t.parquet
    jobid: 4
    resources: tmpdir=/tmp, gpu=0
"""
    (extract, _), (train, _) = makespan.parse_blocks(text.splitlines(), tmp_path)[0]
    assert (extract.gpus, extract.threads, train.gpus) == (1, 8, 0)
    # the same jobs as a DAG built at 2 cores asks them (extract: workflow.cores // shards = 1)
    at_two = [Job("extract", wildcards="shard=0", threads=1, gpus=1), Job("train", threads=1)]
    extract.seconds = 7
    jobs = makespan.with_resources([extract, train], at_two)
    assert [(job.threads, job.gpus, job.seconds) for job in jobs] == [(1, 1, 7), (1, 0, 0)]
    assert makespan.with_resources([extract, train], at_two, {"extract": 2})[0].threads == 2
    assert makespan.nested({"device": "cuda", "fit.gpu_jobs": 2}) == {"device": "cuda", "fit": {"gpu_jobs": 2}}


def test_project_from_a_gpu_run():
    # 4 users of 100 train tokens; the GPU run's fit stage in 2 jobs of 2 users (12 s each); the projection
    # in 1 job of 4: start-up 2 s (given) + rate (24 - 2 x 2) / 400 = 0.05 s a token, x 400 x the work scale
    users = pd.DataFrame(
        {"user_id": list("abcd"), "n_tokens": [120] * 4, "train_end": [100] * 4, "test_start": [110] * 4}
    )
    measured = [Job("fit", wildcards=f"job={j}", gpus=1, seconds=12, source="benchmark file") for j in (0, 1)]
    measured.append(Job("corpus", seconds=5, source="benchmark file"))
    target = [
        Job("fit", wildcards="job=0", gpus=1),
        Job("fit_others", wildcards="job=0", gpus=1),  # not finished in the GPU run: as a fit job
        Job("headline_point"),  # nor this CPU job: --cpu-seconds
        Job("corpus"),
        Job("all"),
    ]
    costs = makespan.GpuCosts(startup=2, work_scale=0.5, cpu_seconds={"headline_point": 3})
    missing = makespan.project(target, measured, users, users, gpu=costs)
    assert [job.seconds for job in target] == [12, 12, 3, 5, 0]
    assert missing == ["all"]
    makespan.project(target, measured, users, users, gpu=makespan.GpuCosts(startup=2, unfinished="startup"))
    assert [job.seconds for job in target[:2]] == [22, 2]


def test_runs_stopped_and_resumed(tmp_path, capsys):
    # two logs of one run: the first stopped 10 s after its last Finished line, the second resumed
    header = 'Provided cores: 2\nProvided resources: gpu=Resource("gpu", 1)\n'
    first = (
        header
        + """\
[Wed Nov 25 16:00:00 2026]
localrule a:
    output: a.txt
    jobid: 1
[Wed Nov 25 16:00:04 2026]
Finished jobid: 1 (Rule: a)
[Wed Nov 25 16:00:04 2026]
localrule b:
    output: b.txt
    input: a.txt
    jobid: 2
[Wed Nov 25 16:00:14 2026]
Error in rule b:
"""
    )
    second = (
        header
        + """\
[Wed Nov 25 16:01:00 2026]
localrule b:
    output: b.txt
    input: a.txt
    jobid: 1
[Wed Nov 25 16:01:06 2026]
Finished jobid: 1 (Rule: b)
"""
    )
    (tmp_path / "1.log").write_text(first)
    (tmp_path / "2.log").write_text(second)
    logs = [makespan.read_log(tmp_path / name, tmp_path) for name in ("1.log", "2.log")]
    assert (logs[0].cores, logs[0].gpus, logs[0].running, logs[1].running) == (2, 1, 4, 6)
    jobs = [Job("a", seconds=4, outputs=[str(tmp_path / "a.txt")])]
    jobs.append(Job("b", jobid=1, seconds=6, inputs=[str(tmp_path / "a.txt")], outputs=[str(tmp_path / "b.txt")]))
    makespan.link(jobs)
    makespan.check_runs(jobs, logs, 2, 1)
    out = capsys.readouterr().out
    assert "measured running time (each log's first timestamp to its last Finished line): 10.0 s (4 + 6)" in out
    assert "simulated wall: 10.0 s, error +0.0 %" in out
