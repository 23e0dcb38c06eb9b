"""The finished study as the aggregate stage reads it: the five contract tables and the per-job
training curves, nothing else (no model, no cache), so figures and summary can be rebuilt from them.

`headline_solver` picks the solver whose numbers the figures and the summary quote: `exact`, the
certified optimum of the convex fit objective, when it ran; else the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Study:
    personalization: pd.DataFrame  # results/tables/personalization.csv
    cross_user: pd.DataFrame  # results/tables/cross_user.csv
    copy_task: pd.DataFrame  # results/tables/copy_task.csv
    gram_resilience: pd.DataFrame  # results/tables/gram_resilience.csv
    feedback: pd.DataFrame  # results/tables/feedback.csv
    copy_task_curves: pd.DataFrame  # every results/copy_task/attention~*/seed~*/curves.parquet
    feedback_curves: pd.DataFrame  # every results/feedback/method~*/seed~*/curves.parquet
    copy_task_vocab: int  # chance accuracy on the copy task is 1 / vocab


def load_study(tables: dict, copy_task_curves: list, feedback_curves: list, copy_task_vocab: int) -> Study:
    """`tables`: name -> CSV path for each of uph.report.catalog.TABLES; the curves: lists of parquet paths."""
    frames = {name: pd.read_csv(path) for name, path in tables.items()}
    return Study(
        **frames,
        copy_task_vocab=copy_task_vocab,
        copy_task_curves=pd.concat(map(pd.read_parquet, copy_task_curves), ignore_index=True),
        feedback_curves=pd.concat(map(pd.read_parquet, feedback_curves), ignore_index=True),
    )


def headline_solver(personalization: pd.DataFrame) -> str:
    solvers = set(personalization["solver"])
    return "exact" if "exact" in solvers else sorted(solvers)[0]


def ordered(values, order) -> list:
    """The distinct `values`, in the order of the known names `order`, unknown ones after them."""
    present = list(dict.fromkeys(values))
    return [v for v in order if v in present] + sorted(v for v in present if v not in order)
