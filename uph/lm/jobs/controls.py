"""The fit stage's controls (rules/fit.smk): the fit_others and cross_user jobs.

`others` and `cross_user` score the
residual thetas on a job's users' held-out text (no fits), `others` the neural cache's control too.
"""

from __future__ import annotations

import logging

import pandas as pd
import torch
from tqdm import tqdm

from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.tokens import prepare
from uph.lm.jobs.choices import Point
from uph.lm.jobs.fit_job import CACHES, NEURAL_CACHE_METHOD, CacheBaselines, FitJob

log = logging.getLogger(__name__)


def residual_thetas(
    fits: pd.DataFrame, column: str = "theta_residual"
) -> dict[tuple[Point, str], dict[str, torch.Tensor]]:
    """(point, solver) -> user -> residual theta_r, from the fit jobs' rows (`theta_<prefix>`: the heads
    fitted on a cache, CACHES, for the points of fit.on_cache)."""
    thetas: dict[tuple[Point, str], dict[str, torch.Tensor]] = {}
    if column not in fits:
        return thetas
    rows = fits[~fits["head"].isin(CACHES) & fits[column].notna()].sort_values("user", kind="stable")
    for row in rows.itertuples():  # in user order, whatever the fit jobs' cut: sums over users add alike
        key = (Point.of(row.head, row.alpha, row.d), row.solver)
        thetas.setdefault(key, {})[row.user] = torch.tensor(getattr(row, column), dtype=torch.float64)
    return thetas


def cross_user(job: FitJob, point: Point, theta_g: torch.Tensor, residuals: dict[str, torch.Tensor]) -> pd.DataFrame:
    """One row per (theta user u, text user v) at `point`: theta_g + u's residual theta on v's held-out
    text, against theta_g alone; one text's held-out p0 in memory at a time, all thetas scored on it in
    one pass (HeldOut.many)."""
    head, rows = job.heads[point], []
    for text_user, states in tqdm(job.users.items(), desc="cross_user", unit="text", mininterval=5):
        test = prepare(states.test_hidden, states.test_targets, job.layer, device=job.device)
        held_out = HeldOut(test, head)
        global_nll = held_out(theta_g)["nll"]
        scores = held_out.many(torch.stack([theta_g + theta_r for theta_r in residuals.values()]))
        for theta_user, score in zip(residuals, scores):
            nll = score["nll"]
            rows.append(
                {
                    "theta_user": theta_user,
                    "text_user": text_user,
                    "base_nll": held_out.base_nll,
                    "global_nll": global_nll,
                    "nll": nll,
                    "delta_nll": nll - global_nll,
                }
            )
    return pd.DataFrame(rows)


def _others_mean(thetas: dict[str, torch.Tensor], total: torch.Tensor, user: str) -> torch.Tensor:
    """The leave-one-out mean of the other users' thetas: (Σ_v theta(v) - theta(user)) / (N - 1)."""
    return (total - thetas[user]) / (len(thetas) - 1)


def others(
    job: FitJob,
    thetas_g: dict,
    residuals: dict[tuple[Point, str], dict[str, torch.Tensor]],
    cache_thetas: dict[str, dict[tuple[Point, str], dict[str, torch.Tensor]]] | None = None,
    caches: CacheBaselines = CacheBaselines(None, None),  # noqa: B008 (a frozen dataclass, from uph.lm.jobs.fit_job)
) -> pd.DataFrame:
    """The control with a residual's capacity that is not the user's own: per (point, solver, user u) the
    global theta plus the mean of the other users' residual thetas, scored on u's held-out text,

        theta_others(u) = theta_g + (Σ_v theta_r(v) - theta_r(u)) / (N - 1)      (others_nll)

    A personal gain is the own residual beating it; a residual that only extends a direction every user
    shares does as well in others' hands. The heads on a cache (`cache_thetas`: cache -> their thetas,
    fit.on_cache) have the same control: the mean of the other users' thetas on that cache, on u's
    held-out text over u's own mixture (`caches`), <prefix>_others_nll. The neural cache's own control
    is its residual arm with a store of the same size drawn from the other users' (NeuralCache), its
    others_nll. One text's held-out p0 in memory at a time; the texts are the job's users', the thetas
    every user's; no rows for N < 2."""
    cache_thetas = {cache: thetas for cache, thetas in (cache_thetas or {}).items() if thetas}
    columns = ["head", "alpha", "d", "solver", "user", "others_nll", *(f"{p}_others_nll" for p in CACHES.values())]
    n_users = max((len(thetas) for thetas in residuals.values()), default=0)
    if n_users < 2:
        log.info("the 'others' control needs 2 users or more; this study has %d", n_users)
        return pd.DataFrame(columns=columns)
    totals = {key: sum(thetas.values()) for key, thetas in residuals.items()}
    cache_totals = {
        (cache, key): sum(thetas.values()) for cache, by_key in cache_thetas.items() for key, thetas in by_key.items()
    }
    rows = []
    for user, states in tqdm(job.users.items(), desc="others", unit="text", mininterval=5):
        test = prepare(states.test_hidden, states.test_targets, job.layer, device=job.device)
        held_out = {point: HeldOut(test, head) for point, head in job.heads.items()}
        on_mixture = {
            cache: caches.on_cache(cache, user, states.train_hidden, states.train_targets, False, job.gap)(test)
            for cache in cache_thetas
        }
        for (point, solver), thetas in residuals.items():
            theta = thetas_g[(point, solver)] + _others_mean(thetas, totals[point, solver], user)
            row = {**point.columns, "solver": solver, "user": user, "others_nll": held_out[point](theta)["nll"]}
            for cache, by_key in cache_thetas.items():
                if (point, solver) in by_key:
                    theta = _others_mean(by_key[point, solver], cache_totals[cache, (point, solver)], user)
                    row[f"{CACHES[cache]}_others_nll"] = HeldOut(on_mixture[cache], job.heads[point])(theta)["nll"]
            rows.append(row)
        if caches.neural is not None:
            control = caches.neural.others(user, len(states.train_targets))
            rows.append(
                {**NEURAL_CACHE_METHOD, "user": user, "others_nll": caches.neural.arm_nlls(test, control)["residual"]}
            )
    return pd.DataFrame(rows, columns=columns)
