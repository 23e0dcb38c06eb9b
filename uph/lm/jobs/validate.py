"""The fit stage's validate job (rules/fit.smk).

`validate_users` walks the personal and residual paths (and the dose-response's, on each prefix's own
tail, and the cache arms') of a job's users.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
import torch

from uph.errors import ConfigError
from uph.lm.engine.baselines import hidden_of, targets_of
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import WarmStart, fit_path_steps
from uph.lm.engine.heads import Head
from uph.lm.engine.lockstep import run_lockstep, user_groups
from uph.lm.engine.objective import HeadOnTokens
from uph.lm.engine.tokens import Tokens, validation_split
from uph.lm.jobs.choices import Point, choice_columns
from uph.lm.jobs.fit_job import CACHES, CacheBaselines, FitConfig, FitJob, group_trains, scored_path

log = logging.getLogger(__name__)


def _dose_split(train: Tokens, k: int, fraction: float, gap: int) -> tuple[Tokens, Tokens]:
    try:
        return validation_split(train.prefix(k), fraction, gap)
    except ValueError as error:
        raise ConfigError(
            f"config key 'fit.dose_response.train_tokens': {k} is too few to validate on: {error}"
        ) from None


def validate_user_steps(
    user: str,
    train: Tokens,
    heads: dict[Point, Head],
    thetas_g_fit: dict,
    caches: CacheBaselines,
    fit: FitConfig,
    gap: int,
) -> tuple[list[dict], list[dict]]:
    """One user's validation rows: the personal and residual paths of every method and solver on the fit
    part, scored on the validation part; the dose-response's residual paths on each prefix k's own fit
    part and tail; the paths of fit.on_cache's heads on their cache's mixture (the residual arm's, from
    the fit part: CacheBaselines.on_cache). Returns (validation rows,
    warm-start rows: every ball's theta and BFGS model, for the refit at the radius chosen, _warm_rows).
    A fit's steps (uph.lm.engine.lockstep): a generator of the paths' evaluation requests."""
    fit_part, held = validation_split(train, fit.capacity.validation_fraction, gap)
    scored = []  # each path's (validation rows, warm-start rows), in the order fitted
    for point, head in heads.items():
        held_out = HeldOut(held, head)
        for solver in fit.solvers:
            theta_g = thetas_g_fit[(point, solver)]
            paths = _point_paths_steps(user, train, fit_part, held_out, head, point, solver, theta_g, fit, gap)
            scored += yield from paths
    for cache in dict.fromkeys(cache for _, _, cache in fit.on_cache):  # each cache's mixture once
        on_cache = caches.on_cache(cache, user, hidden_of(fit_part), targets_of(fit_part), True, gap)
        fit_cache, held_cache = on_cache(fit_part, own=True), on_cache(held)
        for point, solver in [(point, solver) for point, solver, name in fit.on_cache if name == cache]:
            path = yield from fit_path_steps(
                fit_cache, heads[point], solver, fit.solver, fit.capacity.radii, user=user, label=point.label
            )
            columns = {**choice_columns(point, solver, CACHES[cache]), "user": user}
            scored.append(_scored(HeldOut(held_cache, heads[point]), path, None, columns))
    return [row for rows, _ in scored for row in rows], [row for _, warm in scored for row in warm]


def _point_paths_steps(
    user: str,
    train: Tokens,
    fit_part: Tokens,
    held_out: HeldOut,
    head: Head,
    point: Point,
    solver: str,
    theta_g: torch.Tensor,
    fit: FitConfig,
    gap: int,
) -> list[tuple[list[dict], list[dict]]]:
    """The personal and residual paths at one point and solver on the fit part, and where the point and
    solver are the dose-response's, each prefix k's residual path on its own fit part: each path's
    (validation rows, warm-start rows)."""
    radii, label = fit.capacity.radii, point.label
    shared = HeadOnTokens(fit_part, head)
    personal = yield from fit_path_steps(fit_part, head, solver, fit.solver, radii, None, user, label, shared)
    residual = yield from fit_path_steps(fit_part, head, solver, fit.solver, radii, theta_g, user, label, shared)
    scored = [
        _scored(held_out, personal, None, {**choice_columns(point, solver, "personal"), "user": user}),
        _scored(held_out, residual, theta_g, {**choice_columns(point, solver, "residual"), "user": user}),
    ]
    if dict(fit.dose_response.points).get(point) != solver:
        return scored
    for k in [k for k in fit.dose_response.train_tokens if k < train.n]:
        fit_k, held_k = _dose_split(train, k, fit.capacity.validation_fraction, gap)
        path = yield from fit_path_steps(fit_k, head, solver, fit.solver, radii, theta_g, user, label)
        columns = {**choice_columns(point, solver, "residual", k), "user": user}
        scored.append(_scored(HeldOut(held_k, head), path, theta_g, columns))
    return scored


def _scored(held_out: HeldOut, path, offset, columns: dict) -> tuple[list[dict], list[dict]]:
    """A path's validation rows (scored_path) and warm-start rows (_warm_rows), each with `columns`."""
    return scored_path(held_out, path, offset, columns), _warm_rows(path, columns)


WARM_MAX_D = 128  # a warm start's BFGS model is d² doubles: 128 KB at d = 128, 2.6 MB at d = 576 (cold there)


def _warm_rows(path, columns: dict) -> list[dict]:
    """Each ball's warm start (uph.lm.engine.fit.WarmStart) for a refit at its radius: its theta and the exact
    solver's dense BFGS model, up to d = WARM_MAX_D (beyond, and for adam, the refit starts cold)."""
    return [
        {
            **columns,
            "capacity": result.radius,
            "theta": theta.double().tolist(),
            "model": result.model.flatten().tolist(),
        }
        for theta, result in path
        if result.model is not None and result.model.dim() == 2 and len(theta) <= WARM_MAX_D
    ]


def warm_starts(table: pd.DataFrame) -> dict[tuple, WarmStart]:
    """(point, solver, arm, train_tokens, user, radius) -> WarmStart, from a validate job's warm-start rows
    (train_tokens None: all of the user's train tokens)."""
    starts = {}
    for row in table.itertuples():
        theta = torch.as_tensor(np.asarray(row.theta), dtype=torch.float64)
        model = torch.as_tensor(np.asarray(row.model), dtype=torch.float64).view(len(theta), len(theta))
        k = None if math.isnan(row.train_tokens) else int(row.train_tokens)
        key = (Point.of(row.head, row.alpha, row.d), row.solver, row.arm, k, row.user, float(row.capacity))
        starts[key] = WarmStart(theta, model)
    return starts


def validate_users(
    job: FitJob,
    thetas_g_fit: dict,
    caches: CacheBaselines,
    fit: FitConfig,
    lockstep: bool | None = None,
    stacked: bool | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every user of one fit job: (the validation rows that capacity_choices chooses from, the warm starts
    the fit job's refits read at the radii chosen) (validate_user_steps). With `lockstep` (default: on a
    GPU) the users' paths advance together, as many users at a time as uph.lm.engine.lockstep's memory budget
    holds; each user's rows are the same either way. `stacked` (default: on a GPU; implies lockstep) puts
    a group's train tokens side by side (group_trains): its rounds are batched passes, whose values are
    each user's to float32 rounding."""
    train_tokens = {user: len(states.train_targets) for user, states in job.users.items()}
    rows, warm = [], []
    for group in user_groups(train_tokens, job.layer.W.shape[0], job.device, True if stacked else lockstep):
        trains = group_trains(job, group, stacked)
        steps = [
            validate_user_steps(user, train, job.heads, thetas_g_fit, caches, fit, job.gap)
            for user, train in trains.items()
        ]
        for (user, train), (user_rows, user_warm) in zip(trains.items(), run_lockstep(steps)):
            rows += user_rows
            warm += user_warm
            log.info("%s: validated %d train tokens", user, train.n)
    return pd.DataFrame(rows), pd.DataFrame(warm)
