"""The fit stage's cut: users over fit.jobs jobs, balanced by train tokens (uph.lm.jobs.partition)."""

import pandas as pd
import pytest

from uph.lm.jobs.partition import fit_job_users, users_of_job


def users_table(tokens: dict[str, int]) -> pd.DataFrame:
    return pd.DataFrame({"user_id": list(tokens), "train_end": list(tokens.values())})


def test_the_longest_first_cut_gives_the_largest_user_its_own_job():
    """Hamlet's 14 k tokens fill one job; the five others go to the other until it passes Hamlet's, and the
    last one (a tie at 14 k each) to the lowest job."""
    tokens = {"hamlet": 14_000, "iago": 4_000, "lear": 4_000, "a": 3_000, "b": 3_000, "c": 2_000}
    assert fit_job_users(users_table(tokens), 2) == [["c", "hamlet"], ["a", "b", "iago", "lear"]]


def test_the_cut_does_not_depend_on_the_table_order_and_holds_every_user_once():
    tokens = {f"user{i:02d}": 1_000 + 37 * (i % 7) for i in range(24)}
    table = users_table(tokens)
    cut = fit_job_users(table, 5)
    assert cut == fit_job_users(table.sample(frac=1, random_state=0), 5)
    assert sorted(user for job in cut for user in job) == sorted(tokens)
    loads = [sum(tokens[user] for user in job) for job in cut]
    assert max(loads) - min(loads) <= max(tokens.values())  # a greedy cut is within one user of level
    assert [users_of_job(table, job, 5) for job in range(5)] == cut


def test_more_jobs_than_users_leaves_jobs_empty_and_no_jobs_is_refused():
    assert fit_job_users(users_table({"a": 5, "b": 7}), 4) == [["b"], ["a"], [], []]
    with pytest.raises(ValueError, match="fit.jobs must be at least 1"):
        fit_job_users(users_table({"a": 5}), 0)
