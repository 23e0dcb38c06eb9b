"""The fit stage's fit job (rules/fit.smk).

`fit_users` refits each arm at
its choice (`fit_arms_steps`, `fit_on_cache_steps`), the dose-response (`fit_dose_response_steps`) and the caches' arms
(`unigram_arms`, `neural_cache_arms`) and scores them on test.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pandas as pd
import torch

from uph.lm.engine.baselines import counts_of, hidden_of, log_unigram, targets_of, unigram_nll
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import WarmStart, fit_theta_steps
from uph.lm.engine.heads import Head
from uph.lm.engine.lockstep import run_lockstep, user_groups
from uph.lm.engine.neural_cache import NeuralCache
from uph.lm.engine.objective import HeadOnTokens
from uph.lm.engine.tokens import Tokens, prepare
from uph.lm.jobs.choices import ALL_TOKENS, Point, chosen_radius
from uph.lm.jobs.fit_job import (
    ARMS,
    CACHES,
    NEURAL_CACHE_METHOD,
    UNIGRAM_METHOD,
    CacheBaselines,
    FitConfig,
    FitJob,
    fit_columns,
    group_trains,
)

log = logging.getLogger(__name__)


def fit_arms_steps(
    train: Tokens,
    held_out: HeldOut,
    head: Head,
    theta_g: torch.Tensor,
    radii: tuple[float, float],
    solver: str,
    fit: FitConfig,
    user: str,
    label: str,
    starts: tuple[WarmStart | None, WarmStart | None] = (None, None),
) -> tuple[dict, torch.Tensor]:
    """One user's three arms at one point and solver, scored on the held-out text: the global theta_g,
    the personal theta from zero and the residual theta_r on top of theta_g, each at its chosen radius
    (`radii`: personal, residual), each refit from its validation path's ball there when `starts` has it.
    Returns the row's columns and theta_r."""
    shared = HeadOnTokens(train, head)
    theta_p, personal = yield from fit_theta_steps(
        train, head, solver, fit.solver, radii[0], None, user, label, shared, starts[0]
    )
    theta_r, residual = yield from fit_theta_steps(
        train, head, solver, fit.solver, radii[1], theta_g, user, label, shared, starts[1]
    )
    global_, personal_, residual_ = held_out.many(torch.stack([theta_g, theta_p.double(), theta_g + theta_r.double()]))
    columns = {
        "base_nll": held_out.base_nll,
        "global_nll": global_["nll"],
        "personal_nll": personal_["nll"],
        "residual_nll": residual_["nll"],
        "global_kl": global_["kl"],
        "personal_kl": personal_["kl"],
        "residual_kl": residual_["kl"],
        **fit_columns("personal", personal),
        **fit_columns("residual", residual),
        "sum_theta_norm": float((theta_g + theta_r.double()).norm()),
        "theta_personal": theta_p.double().tolist(),
        "theta_residual": theta_r.double().tolist(),
    }
    return columns, theta_r


def fit_dose_response_steps(
    train: Tokens,
    held_out: HeldOut,
    head: Head,
    theta_g: torch.Tensor,
    theta_r: torch.Tensor,
    global_nll: float,
    radii: dict[int, float],
    solver: str,
    fit: FitConfig,
    starts: dict[int, WarmStart | None] | None = None,
) -> list[dict]:
    """The residual arm refitted on the user's first k train tokens at the radius chosen for k, for each k
    of `radii` (k -> radius: fit.dose_response's sizes below the user's count, then all of them, whose
    theta_r is already fitted): the held-out NLL of each, beside the global theta's (`global_nll`, from
    the arms); `starts`: k -> the warm start of k's refit."""
    rows, starts = [], starts or {}
    for k, radius in sorted(radii.items()):
        theta_k = theta_r
        if k < train.n:
            start = starts.get(k)
            theta_k = (
                yield from fit_theta_steps(
                    train.prefix(k), head, solver, fit.solver, radius, offset=theta_g, start=start
                )
            )[0]
        rows.append(
            {
                "train_tokens": k,
                "all_train_tokens": k == train.n,
                "radius": radius,
                "global_nll": global_nll,
                "residual_nll": held_out(theta_g + theta_k)["nll"],
            }
        )
    return rows


def neural_cache_arms(user: str, train: Tokens, test: Tokens, cache: NeuralCache) -> dict:
    """One user's neural cache mixtures in the three arms at their chosen (T, lambda), scored on test: the
    columns of a fits row (uph.lm.engine.neural_cache)."""
    nlls = cache.arm_nlls(test, cache.own(user, hidden_of(train), targets_of(train)))
    return {"base_nll": test.base_nll, **{f"{arm}_nll": nll for arm, nll in nlls.items()}}


def unigram_arms(train: Tokens, test: Tokens, unigram: pd.DataFrame) -> dict:
    """One user's unigram mixtures in the three arms at their chosen lambdas, scored on test: the columns
    of a fits row (uph.lm.engine.baselines)."""
    pooled = log_unigram(torch.tensor(unigram["counts"].iloc[0], dtype=torch.float64))
    own = log_unigram(counts_of(train, len(pooled)))
    lams = {arm: float(unigram[f"lambda_{arm}"].iloc[0]) for arm in ARMS}
    return {
        "base_nll": test.base_nll,
        "global_nll": unigram_nll("global", lams["global"], test, pooled, own),
        "personal_nll": unigram_nll("personal", lams["personal"], test, pooled, own),
        "residual_nll": unigram_nll("residual", lams["residual"], test, pooled, own, lams["global"]),
        "personal_lambda": lams["personal"],
        "residual_lambda": lams["residual"],
    }


def fit_on_cache_steps(
    train: Tokens,
    test: Tokens,
    head: Head,
    radius: float,
    solver: str,
    fit: FitConfig,
    user: str,
    label: str,
    start: WarmStart | None = None,
    prefix: str = "cache",
) -> dict:
    """A head fitted on a cache (`train` and `test` on its residual arm's mixture, Tokens.mixed) at its
    chosen radius, scored on test against the mixture alone: the columns <prefix>_nll, <prefix>_head_nll,
    the fit's and theta_<prefix> (`prefix`: the cache's, CACHES)."""
    theta, result = yield from fit_theta_steps(
        train, head, solver, fit.solver, radius, user=user, label=label, start=start
    )
    held_out = HeldOut(test, head)
    return {
        f"{prefix}_nll": held_out.base_nll,
        f"{prefix}_head_nll": held_out(theta)["nll"],
        **fit_columns(prefix, result),
        f"theta_{prefix}": theta.double().tolist(),
    }


@dataclass(frozen=True)
class UserRefits:
    """What one user's refits read: its train and test tokens, the radii chosen on validation (`choices`),
    the validate job's warm starts and each cache's (train, test) on its residual arm's mixture."""

    user: str
    train: Tokens
    test: Tokens
    choices: pd.DataFrame
    fit: FitConfig
    starts: dict[tuple, WarmStart]
    on_mixture: dict[str, tuple[Tokens, Tokens]]

    def radius(self, point: Point, solver: str, arm: str, k=ALL_TOKENS) -> float:
        return chosen_radius(self.choices, point, solver, arm, k)

    def start(self, point: Point, solver: str, arm: str, radius: float, k: int | None = None) -> WarmStart | None:
        return self.starts.get((point, solver, arm, k, self.user, float(radius)))


def fit_user_steps(
    user: str,
    train: Tokens,
    test: Tokens,
    heads: dict[Point, Head],
    thetas_g: dict,
    choices: pd.DataFrame,
    caches: CacheBaselines,
    fit: FitConfig,
    gap: int,
    starts: dict[tuple, WarmStart] | None = None,
) -> tuple[list[dict], list[dict]]:
    """One user's rows: (every method x solver with its three arms, and the cache baselines'; dose-response).
    The heads of fit.on_cache are also fitted on their cache's residual-arm mixture (fit_on_cache_steps).
    `starts`: the validate job's warm starts (warm_starts); a refit without one starts cold. A fit's steps
    (uph.lm.engine.lockstep): a generator of the refits' evaluation requests."""
    on_mixture = cache_mixtures(user, train, test, caches, fit, gap)
    refits = UserRefits(user, train, test, choices, fit, starts or {}, on_mixture)
    fits, dose = [], []
    user_columns = {"user": user, "train_tokens": train.n, "test_tokens": test.n}
    for point, head in heads.items():
        held_out = HeldOut(test, head)
        for solver in fit.solvers:
            theta_g = thetas_g[(point, solver)]
            arms, theta_r = yield from point_arms_steps(refits, point, head, held_out, solver, theta_g)
            fits.append({**point.columns, "solver": solver, **user_columns, "params_per_user": point.d, **arms})
            if dict(fit.dose_response.points).get(point) == solver:
                rows = yield from point_dose_steps(refits, point, head, held_out, solver, theta_g, theta_r, arms)
                dose += [{**point.columns, "solver": solver, "user": user, **row} for row in rows]
        log.info(
            "%s %s: beyond global %+.4f, personal %+.4f",
            user,
            point.label,
            fits[-1]["residual_nll"] - fits[-1]["global_nll"],
            fits[-1]["personal_nll"] - fits[-1]["base_nll"],
        )
    return fits + cache_rows(user, train, test, caches, user_columns), dose


def cache_mixtures(
    user: str, train: Tokens, test: Tokens, caches: CacheBaselines, fit: FitConfig, gap: int
) -> dict[str, tuple[Tokens, Tokens]]:
    """cache -> the user's (train, test) on its residual arm's mixture, for each cache of fit.on_cache."""
    on_mixture = {}
    for cache in dict.fromkeys(cache for _, _, cache in fit.on_cache):  # every head on a cache shares its tokens
        on_cache = caches.on_cache(cache, user, hidden_of(train), targets_of(train), False, gap)
        on_mixture[cache] = (on_cache(train, own=True), on_cache(test))
    return on_mixture


def point_arms_steps(
    refits: UserRefits, point: Point, head: Head, held_out: HeldOut, solver: str, theta_g: torch.Tensor
) -> tuple[dict, torch.Tensor]:
    """The user's three arms at one point and solver (fit_arms_steps), and its fits on the caches of
    fit.on_cache there (fit_on_cache_steps): the row's columns, and theta_r."""
    radii = tuple(refits.radius(point, solver, arm) for arm in ("personal", "residual"))
    warm = (refits.start(point, solver, "personal", radii[0]), refits.start(point, solver, "residual", radii[1]))
    train, fit, user = refits.train, refits.fit, refits.user
    arms, theta_r = yield from fit_arms_steps(
        train, held_out, head, theta_g, radii, solver, fit, user, point.label, warm
    )
    for cache in [cache for at, by, cache in fit.on_cache if (at, by) == (point, solver)]:
        prefix = CACHES[cache]
        radius = refits.radius(point, solver, prefix)
        warm_cache = refits.start(point, solver, prefix, radius)
        tokens = refits.on_mixture[cache]
        arms |= yield from fit_on_cache_steps(*tokens, head, radius, solver, fit, user, point.label, warm_cache, prefix)
    return arms, theta_r


def point_dose_steps(
    refits: UserRefits,
    point: Point,
    head: Head,
    held_out: HeldOut,
    solver: str,
    theta_g: torch.Tensor,
    theta_r: torch.Tensor,
    arms: dict,
) -> list[dict]:
    """The dose-response at one point and solver (fit_dose_response_steps), each size at its chosen radius
    and warm start; all train tokens at the residual arm's (its radius, theta_r; `arms`: its global NLL)."""
    train = refits.train
    ks = [k for k in refits.fit.dose_response.train_tokens if k < train.n]
    radii = {k: refits.radius(point, solver, "residual", k) for k in ks} | {
        train.n: refits.radius(point, solver, "residual")
    }
    starts = {k: refits.start(point, solver, "residual", radii[k], k) for k in ks}
    return (
        yield from fit_dose_response_steps(
            train, held_out, head, theta_g, theta_r, arms["global_nll"], radii, solver, refits.fit, starts
        )
    )


def cache_rows(user: str, train: Tokens, test: Tokens, caches: CacheBaselines, user_columns: dict) -> list[dict]:
    """The user's rows of the cache baselines that ran (unigram, neural cache)."""
    rows = []
    if caches.unigram is not None:
        vocab_and_lambda = train.layer.W.shape[0] + 1
        rows.append(
            {
                **UNIGRAM_METHOD,
                **user_columns,
                "params_per_user": vocab_and_lambda,
                **unigram_arms(train, test, caches.unigram),
            }
        )
    if caches.neural is not None:
        store = train.n * (train.layer.W.shape[1] + 1)  # the user's states and next tokens
        rows.append(
            {
                **NEURAL_CACHE_METHOD,
                **user_columns,
                "params_per_user": store,
                **neural_cache_arms(user, train, test, caches.neural),
            }
        )
    return rows


def fit_users(
    job: FitJob,
    thetas_g: dict,
    choices: pd.DataFrame,
    caches: CacheBaselines,
    fit: FitConfig,
    starts: dict[tuple, WarmStart] | None = None,
    lockstep: bool | None = None,
    stacked: bool | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every user of one fit job: (fits, dose_response) tables (module docstring), each refit warm from
    its validation path's ball at the chosen radius where `starts` (warm_starts) has it. With `lockstep`
    (default: on a GPU) the users' refits advance together within uph.lm.engine.lockstep's memory budget; each
    user's rows are the same either way. `stacked` (default: on a GPU; implies lockstep): a group's train
    tokens side by side, as uph.lm.jobs.validate.validate_users has them."""
    tokens = {user: len(states.train_targets) + len(states.test_targets) for user, states in job.users.items()}
    tables = ([], [])
    for group in user_groups(tokens, job.layer.W.shape[0], job.device, True if stacked else lockstep):
        steps = []
        for user, train in group_trains(job, group, stacked).items():
            states = job.users[user]
            test = prepare(states.test_hidden, states.test_targets, job.layer, device=job.device)
            steps.append(fit_user_steps(user, train, test, job.heads, thetas_g, choices, caches, fit, job.gap, starts))
        for rows in run_lockstep(steps):
            for table, user_rows in zip(tables, rows):
                table.extend(user_rows)
    return tuple(pd.DataFrame(rows) for rows in tables)
