"""The fit stage's jobs: users spread over `fit.jobs` jobs, balanced by their train tokens.

The cache shards are the unit of extraction and storage; the per-user work of the fit stage (validation
paths, refits, the others control, the cross-user blocks) costs about a user's train tokens, so it runs in
`fit.jobs` jobs cut from the users table, independent of the shards and of the cores a run is given
(a change of --cores or of the cluster reruns nothing). The cut is the longest-processing-time rule: users
by train tokens, most first (ties by user id), each to the job with the fewest tokens so far (ties to the
lowest job), so the largest job is at most 4/3 of the best possible. A job's users are in user order.
Torch-free: the DAG build and the benchmarks import it.
"""

from __future__ import annotations

import heapq

import pandas as pd


def fit_job_users(users: pd.DataFrame, jobs: int) -> list[list[str]]:
    """For each of `jobs` jobs, the user ids it holds (`users`: the users table, with user_id and
    train_end, the user's train tokens); a job is empty when there are fewer users than jobs."""
    if jobs < 1:
        raise ValueError(f"fit.jobs must be at least 1, not {jobs}")
    order = sorted(zip(users["train_end"].astype(int), users["user_id"]), key=lambda row: (-row[0], row[1]))
    loads = [(0, job) for job in range(jobs)]  # (tokens so far, job): the heap's smallest is the next to fill
    held: list[list[str]] = [[] for _ in range(jobs)]
    for tokens, user in order:
        load, job = heapq.heappop(loads)
        held[job].append(user)
        heapq.heappush(loads, (load + tokens, job))
    return [sorted(job) for job in held]


def users_of_job(users: pd.DataFrame, job: int, jobs: int) -> list[str]:
    """The user ids of fit job `job` of `jobs` (fit_job_users)."""
    return fit_job_users(users, jobs)[job]
