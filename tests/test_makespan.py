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
