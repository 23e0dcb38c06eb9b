"""The fit stage's global jobs (rules/fit.smk): fit_global, fit_global_unigram, fit_global_neural_cache.

`fit_global` (one job per method) walks the global
path on the pooled fit parts (each user's first ceil(global_max_tokens / N) tokens, so its memory does not
grow with the number of users), scores it on every user's validation part, chooses, and refits on the
pooled train tokens (the same tokens when the cap leaves every fit part longer than its share);
`global_unigram` counts the pooled unigram and chooses the unigram's three lambdas, `global_neural_cache`
pools the neural cache's datastore and chooses its three (T, lambda) (both `mixture_validation`).
"""

from __future__ import annotations

import logging
import math

import pandas as pd
from tqdm import tqdm

from uph.lm.data.cache import UserStates
from uph.lm.engine.baselines import arm_nll, count, hidden_of, log_unigram, model_log_probs, targets_of
from uph.lm.engine.capacity import chosen, chosen_row
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import fit_path, fit_theta
from uph.lm.engine.neural_cache import Datastore, datastore_table, log_cache_probabilities, pooled_datastore
from uph.lm.engine.tokens import Tokens, pool, prepare
from uph.lm.jobs.choices import ALL_TOKENS, capacity_choices, choice_columns, chosen_radius
from uph.lm.jobs.fit_job import (
    ARMS,
    NEURAL_CACHE_METHOD,
    UNIGRAM_METHOD,
    Capacity,
    FitConfig,
    FitJob,
    fit_columns,
    scored_path,
)
from uph.splits import split_lengths

log = logging.getLogger(__name__)


def _baseline_columns(method: dict, arm: str) -> dict:
    return {**method, "arm": arm, "train_tokens": ALL_TOKENS}


def _pooled(job: FitJob, ends: dict[str, int]) -> Tokens:
    """Each user's first ends[user] train tokens, pooled."""
    return pool(
        [
            prepare(states.train_hidden[: ends[user]], states.train_targets[: ends[user]], job.layer, device=job.device)
            for user, states in job.users.items()
        ]
    )


def mixture_validation(method: dict, at_targets: dict, temperatures, lambdas) -> list[dict]:
    """A cache baseline's validation rows (the unigram's, or the neural cache's, `method`): every
    (temperature, lambda) of the global arm, then (on the global choice from them) the personal and
    residual arms'. `at_targets`: user -> per-token log probabilities at the validation targets: the
    model's, and temperature -> the pooled fit parts' cache's and the user's fit part's (the unigram
    has one temperature, None, recorded as NaN)."""

    def rows(arm: str, chosen_global=(None, None)) -> list[dict]:
        t_g, lam_g = chosen_global
        return [
            {
                **_baseline_columns(method, arm),
                "user": user,
                "temperature": math.nan if t is None else t,
                "capacity": lam,
                "validation_nll": arm_nll(arm, lam, model, pooled[t if t_g is None else t_g], own[t], lam_g),
            }
            for user, (model, pooled, own) in at_targets.items()
            for t in temperatures
            for lam in lambdas
        ]

    global_rows = rows("global")
    choice = chosen_row(capacity_choices(pd.DataFrame(global_rows)), **_baseline_columns(method, "global"))
    t_g = None if math.isnan(choice["temperature"]) else float(choice["temperature"])
    return global_rows + rows("personal") + rows("residual", (t_g, float(choice["capacity"])))


def fit_global(job: FitJob, fit: FitConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(global thetas, validation rows) of the job's methods (module docstring; rule fit_global runs one
    method a job): per (method, solver) the path on the pooled fit parts, each ball scored on every user's
    validation part, the radius with the best mean chosen, and theta_g refitted at it on the pooled train
    tokens (`theta_fit`, the fit parts' theta at the same radius, is the base of the validating jobs'
    residual paths). A method's choice reads its own rows only, so the methods split into jobs freely."""
    capacity, n_users = fit.capacity, len(job.users)
    splits = _validation_splits(job, capacity)
    fit_ends, train_ends = _pool_ends(job, fit, splits)
    train = _pooled(job, fit_ends)
    log.info("global paths on %d pooled fit-part tokens of %d users, radii %s", train.n, n_users, capacity.radii)
    paths = {
        (point, solver): fit_path(train, head, solver, fit.solver, capacity.radii, user="global", label=point.label)
        for point, head in job.heads.items()
        for solver in fit.solvers
    }
    del train
    validation = []
    for user, states in tqdm(job.users.items(), desc="global validation", unit="user", mininterval=5):
        held = _validation_part(job, states, splits[user][1])
        held_out = {point: HeldOut(held, head) for point, head in job.heads.items()}
        for (point, solver), path in paths.items():
            columns = {**choice_columns(point, solver, "global"), "user": user}
            validation += scored_path(held_out[point], path, None, columns)
    validation = pd.DataFrame(validation)
    choices = capacity_choices(validation)
    train = None if fit_ends == train_ends else _pooled(job, train_ends)  # else: the same tokens, the same fit
    rows = []
    for (point, solver), path in paths.items():
        radius = chosen_radius(choices, point, solver, "global")
        theta_fit, result = next((theta, result) for theta, result in path if result.radius == radius)
        theta = theta_fit
        if train is not None:
            theta, result = fit_theta(
                train, job.heads[point], solver, fit.solver, radius, user="global", label=point.label
            )
        edge = chosen_row(choices, **choice_columns(point, solver, "global"))["at_edge"]
        rows.append(
            {
                **point.columns,
                "solver": solver,
                "pooled_tokens": sum(train_ends.values()),
                "at_edge": edge,
                **fit_columns("fit", result),
                "theta": theta.double().tolist(),
                "theta_fit": theta_fit.double().tolist(),
            }
        )
        log.info(
            "%s %s: radius %g%s, certificate %.1e",
            point.label,
            solver,
            radius,
            edge and f" (at the {edge} end)",
            result.certificate,
        )
    return pd.DataFrame(rows), validation


def _pool_ends(job: FitJob, fit: FitConfig, splits: dict) -> tuple[dict[str, int], dict[str, int]]:
    """How many of each user's first train tokens the pooled (global) arm takes, from its fit part and
    from all its train tokens: ceil(fit.global_max_tokens / N) at most (all where the cap is null)."""
    share = math.inf if fit.global_max_tokens is None else math.ceil(fit.global_max_tokens / len(job.users))
    fit_ends = {user: min(share, fit_end) for user, (fit_end, _) in splits.items()}
    return fit_ends, {user: min(share, len(states.train_targets)) for user, states in job.users.items()}


def global_unigram(job: FitJob, fit: FitConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pooled unigram, validation rows): the pooled unigram counts every fit part's tokens (`counts_fit`)
    and every train token (`counts`), uncapped; its three arms' lambdas are chosen on every user's
    validation part (mixture_validation). Rule fit_global_unigram, beside the methods' fit_global jobs."""
    splits, vocab_size = _validation_splits(job, fit.capacity), job.layer.W.shape[0]
    fit_counts = {
        user: count(states.train_targets[: splits[user][0]], vocab_size) for user, states in job.users.items()
    }
    counts_fit = sum(fit_counts.values())
    counts = sum(count(states.train_targets, vocab_size) for states in job.users.values())
    pooled_fit = log_unigram(counts_fit)
    at_targets = {}  # user -> (log p_model, log q_pooled, log q_user) at the validation targets
    for user, states in tqdm(job.users.items(), desc="unigram validation", unit="user", mininterval=5):
        held = _validation_part(job, states, splits[user][1])
        y = targets_of(held)
        at_targets[user] = (model_log_probs(held), {None: pooled_fit[y]}, {None: log_unigram(fit_counts[user])[y]})
    validation = pd.DataFrame(mixture_validation(UNIGRAM_METHOD, at_targets, [None], fit.capacity.lambdas))
    choices = capacity_choices(validation)
    lams = {arm: chosen(choices, "capacity", **_baseline_columns(UNIGRAM_METHOD, arm)) for arm in ARMS}
    unigram = pd.DataFrame(
        [
            {
                **{f"lambda_{arm}": lam for arm, lam in lams.items()},
                "counts_fit": counts_fit.tolist(),
                "counts": counts.tolist(),
            }
        ]
    )
    return unigram, validation


def global_neural_cache(job: FitJob, fit: FitConfig) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(chosen settings, pooled datastore, validation rows) of the neural cache (uph.lm.engine.neural_cache): the
    pooled datastore holds each user's first train tokens up to the global theta's cap (its fit-part
    share marked); each arm's (T, lambda) is chosen on every user's validation part from the pooled fit
    parts' datastore and the user's own fit part (mixture_validation). Rule fit_global_neural_cache."""
    splits = _validation_splits(job, fit.capacity)
    fit_ends, train_ends = _pool_ends(job, fit, splits)
    datastore = datastore_table(job.users, train_ends, fit_ends)
    _, fit_pool, owners = pooled_datastore(datastore, job.device)
    temperatures = fit.capacity.temperatures
    log.info("neural cache: %d pooled fit-part entries of %d users, T %s", len(fit_pool), len(owners), temperatures)
    at_targets = {}  # user -> (log p_model, T -> log p_pool, T -> log p_own) at the validation targets
    for user, states in tqdm(job.users.items(), desc="neural cache validation", unit="user", mininterval=5):
        fit_end, start = splits[user]
        held = _validation_part(job, states, start)
        hidden, y = hidden_of(held), targets_of(held)
        own = Datastore.of_user(states.train_hidden[:fit_end], states.train_targets[:fit_end], owners[user], job.device)
        at_targets[user] = (
            model_log_probs(held),
            log_cache_probabilities(fit_pool, hidden, y, temperatures),
            log_cache_probabilities(own, hidden, y, temperatures),
        )
    validation = mixture_validation(NEURAL_CACHE_METHOD, at_targets, temperatures, fit.capacity.lambdas)
    validation = pd.DataFrame(validation)
    choices = capacity_choices(validation)
    settings = {}
    for arm in ARMS:
        choice = chosen_row(choices, **_baseline_columns(NEURAL_CACHE_METHOD, arm))
        settings |= {f"temperature_{arm}": choice["temperature"], f"lambda_{arm}": choice["capacity"]}
    return pd.DataFrame([settings]), datastore, validation


def _validation_splits(job: FitJob, capacity: Capacity) -> dict[str, tuple[int, int]]:
    """user -> (end of the fit part, start of the validation part) of the user's train tokens."""
    return {
        user: split_lengths(len(states.train_targets), capacity.validation_fraction, job.gap)
        for user, states in job.users.items()
    }


def _validation_part(job: FitJob, states: UserStates, start: int) -> Tokens:
    return prepare(states.train_hidden[start:], states.train_targets[start:], job.layer, device=job.device)
