"""The finished study as the aggregate stage reads it: the contract tables and the per-job
training curves, nothing else (no model, no cache), so figures and summary can be rebuilt from them.

`headline_solver` picks the solver whose numbers the figures and the summary quote: `exact`, the
certified optimum of the convex fit objective, when it ran for the heads; else the configured one.
"""

from __future__ import annotations

from dataclasses import make_dataclass

import pandas as pd

from uph.artifacts import COPY_TASK_RUN, FEEDBACK_RUN
from uph.attention.study_config import SOLVED
from uph.io import read_table
from uph.stats import t_interval
from uph.tables import TABLES

MILLI = 1e3  # nats -> 10^-3 nats, the unit the figures and the summary quote NLL changes in


# A Study holds every table of uph.tables.TABLES as the field of its name (results/tables/<name>.csv; None in
# a hand-made study that lacks it), then the curves and the copy task's vocabulary, which no table holds.
Study = make_dataclass(
    "Study",
    [
        *((name, pd.DataFrame | None) for name in TABLES),
        ("copy_task_curves", pd.DataFrame),  # every results/copy_task/attention~*/seed~*/curves.parquet
        ("feedback_curves", pd.DataFrame),  # every results/feedback/method~*/curves.parquet (each seed)
        ("copy_task_vocab", int),  # chance accuracy on the copy task is 1 / vocab
    ],
    frozen=True,
    namespace={"__module__": __name__},  # pickled by name for the figures' worker processes
)


def load_study(tables: dict, copy_task_curves: list, feedback_curves: list, copy_task_vocab: int) -> Study:
    """`tables`: name -> CSV path for each of uph.tables.TABLES; the curves: lists of parquet paths."""
    frames = {name: read_table(path) for name, path in tables.items()}
    return Study(
        **frames,
        copy_task_vocab=copy_task_vocab,
        copy_task_curves=pd.concat(COPY_TASK_RUN.read_all(copy_task_curves), ignore_index=True),
        feedback_curves=pd.concat(FEEDBACK_RUN.read_all(feedback_curves), ignore_index=True),
    )


def split_baselines(personalization: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(head rows, baseline rows) of personalization.csv: the baselines (unigram, full_bias) have no alpha, d."""
    baseline = personalization["d"].isna()
    return personalization[~baseline], personalization[baseline]


def headline_solver(personalization: pd.DataFrame) -> str:
    solvers = set(split_baselines(personalization)[0]["solver"])
    return "exact" if "exact" in solvers else sorted(solvers)[0]


def heads_at_headline(personalization: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """(headline solver, the heads' personalization rows at it)."""
    solver = headline_solver(personalization)
    heads, _ = split_baselines(personalization)
    return solver, heads[heads["solver"] == solver]


def best_beyond_global(personalization: pd.DataFrame) -> tuple[pd.Series, int]:
    """The headline point: the headline solver's best personal-gain row, and the K points it is the best
    of. The personal gain is the own residual against the others control ('own vs others'); a study of
    one user has no others, and its gain is the residual against the global theta ('global+personal').
    The fit stage picks it too, to compute the cross-user matrix where the summary reports."""
    _, table = heads_at_headline(personalization)
    control = "own vs others" if (table["control"] == "own vs others").any() else "global+personal"
    gains = table[table["control"] == control]
    return gains.loc[gains["delta_nll"].idxmin()], len(gains)


def baselines_at(personalization: pd.DataFrame, solver: str, control: str = "personal") -> pd.DataFrame:
    """One row per baseline to quote beside `solver`'s heads, in the arm `control`: its row at that
    solver, else its only one (the unigram fits no theta: it has one row per arm whatever fit.solvers says)."""
    baselines = split_baselines(personalization)[1]
    baselines = baselines[baselines["control"] == control]
    return baselines.sort_values("solver", key=lambda solvers: solvers != solver, kind="stable").drop_duplicates("head")


def seed_counts(table: pd.DataFrame) -> str:
    """'5 seeds', or '5 to 10 seeds' where the kinds (attention, method, per model) ran different numbers
    of them (attention.seeds_if_split)."""
    keys = [key for key in ("model", "attention", "method") if key in table]
    counts = table.groupby(keys)["seed"].nunique() if keys else pd.Series([table["seed"].nunique()])
    low, high = int(counts.min()), int(counts.max())
    return f"{low if low == high else f'{low} to {high}'} seed{'s' if high != 1 else ''}"


def over_seeds(table: pd.DataFrame, keys: list, metric: str) -> pd.DataFrame:
    """Per group of `keys`: the mean of `metric` over seeds (each seed's rows averaged first), its 95 %
    Student-t interval over seeds (uph.stats.t_interval; NaN with one seed), the seeds counted and
    diverged (a diverged run's metric is NaN and is left out), and how many of them reach SOLVED (an
    accuracy metric: a kind whose seeds split between solving and stalling reads as that share, not as
    its mean alone)."""
    per_seed = table.groupby([*keys, "seed"], dropna=False)[metric].mean().reset_index()
    rows = []
    for group, runs in per_seed.groupby(keys, sort=True):
        values = runs[metric].dropna()
        low, high = t_interval(values)
        rows.append(
            {
                **dict(zip(keys, group)),
                "mean": values.mean(),
                "ci_low": low,
                "ci_high": high,
                "seeds": len(values),
                "diverged": len(runs) - len(values),
                "solved": int((values >= SOLVED).sum()),
            }
        )
    return pd.DataFrame(rows)


def ordered(values, order) -> list:
    """The distinct `values`, in the order of the known names `order`, unknown ones after them."""
    present = list(dict.fromkeys(values))
    return [v for v in order if v in present] + sorted(v for v in present if v not in order)
