"""The personalization study on cached users: every method at its capacity chosen on validation.

A method is a sweep point (head, alpha, d), or the full-vocabulary bias (d = V) when fit.baselines
has it; each is fitted with every solver, in three arms whose held-out NLLs sit side by side in one
row per (user, point, solver):

    global     theta_g fitted on the pooled train tokens of all users (the domain-adaptation control)
    personal   theta_u fitted on the user's train tokens from zero (seed 002's setting)
    residual   theta_r fitted on the user's train tokens on top of theta_g (held fixed): the
               personal gain beyond domain adaptation is nll(theta_g + theta_r) - nll(theta_g)

Each arm's capacity, the radius of its ball, is chosen on validation (uph.lm.capacity): every radius
of fit.radii is fitted on the users' fit parts (warm along the path, uph.lm.fit.fit_path) and scored
on their validation parts, the best mean is chosen, and the arm is refitted on all train tokens at it.
The cache baselines choose their knobs the same way: the unigram mixtures (uph.lm.baselines) their lambda,
the neural cache (uph.lm.neural_cache) its temperature and lambda. The heads of fit.on_cache are also
fitted on a cache's residual-arm mixture as their base (a fourth arm, "cache" or "neural_cache").

Jobs (rules/fit.smk), each computing a user's base distribution p0 once for all its methods; the
per-user ones hold the users of one fit job (fit.jobs of them, balanced by train tokens: uph.lm.partition),
and a user's rows do not depend on which job holds it. `fit_global` (one job per method) walks the global
path on the pooled fit parts (each user's first ceil(global_max_tokens / N) tokens, so its memory does not
grow with the number of users), scores it on every user's validation part, chooses, and refits on the
pooled train tokens (the same tokens when the cap leaves every fit part longer than its share);
`global_unigram` counts the pooled unigram and chooses the unigram's three lambdas, `global_neural_cache`
pools the neural cache's datastore and chooses its three (T, lambda) (both `mixture_validation`).
`validate_users` walks the personal and residual paths (and the dose-response's, on each prefix's own
tail, and the cache arms') of a job's users; `capacity_choices` chooses; `fit_users` refits each arm at
its choice (`fit_arms`, `fit_on_cache`), the dose-response (`fit_dose_response`) and the caches' arms
(`unigram_arms`, `neural_cache_arms`) and scores them on test; `others` and `cross_user` score the
residual thetas on a job's users' held-out text (no fits), `others` the neural cache's control too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from uph.artifacts import FIT_FILE, USERS_FILE
from uph.config import sweep_points
from uph.device import resolve_device
from uph.errors import ConfigError
from uph.lm.baselines import (
    NEURAL_CACHE,
    UNIGRAM,
    arm_nll,
    cache_mixture,
    count,
    counts_of,
    hidden_of,
    log_unigram,
    model_log_probs,
    targets_of,
    unigram_nll,
)
from uph.lm.basis import load_basis
from uph.lm.cache import UserStates, read_users
from uph.lm.capacity import KNOBS, choose, chosen, chosen_row
from uph.lm.evaluate import HeldOut
from uph.lm.fit import FitResult, HeadOnTokens, WarmStart, fit_path, fit_theta
from uph.lm.heads import Head, HeadSettings, full_bias_head, make_head
from uph.lm.models import OutputLayer, read_output_layer
from uph.lm.neural_cache import Datastore, NeuralCache, datastore_table, log_cache_probabilities, pooled_datastore
from uph.lm.partition import users_of_job
from uph.lm.solvers import SolverSettings
from uph.lm.splits import split_lengths
from uph.lm.tokens import Mixture, Tokens, on_device, pool, prepare, validation_split
from uph.model_identity import read_identity as read_model_identity

log = logging.getLogger(__name__)

FULL_BIAS = "full_bias"
CHOICE_KEYS = ["head", "alpha", "d", "solver", "arm", "train_tokens"]  # one capacity choice each
ARMS = ("global", "personal", "residual")
ALL_TOKENS = float("nan")  # train_tokens of a choice for all of each user's train tokens


@dataclass(frozen=True)
class Point:
    head: str
    alpha: float
    d: int

    @classmethod
    def of(cls, head: str, alpha, d) -> Point:
        return cls(head, float(alpha), int(d))

    @property
    def columns(self) -> dict:
        return {"head": self.head, "alpha": self.alpha, "d": self.d}

    @property
    def label(self) -> str:
        return f"head={self.head} alpha={self.alpha:g} d={self.d}"


@dataclass(frozen=True)
class DoseResponse:
    """fit.dose_response: the residual arm refitted on each user's first k train tokens, at `points`."""

    points: tuple[tuple[Point, str], ...]  # (point, solver)
    train_tokens: tuple[int, ...]

    @classmethod
    def from_config(cls, section: dict) -> DoseResponse:
        points = tuple((Point.of(p["head"], p["alpha"], p["d"]), p["solver"]) for p in section["points"])
        return cls(points, tuple(section["train_tokens"]))


@dataclass(frozen=True)
class Capacity:
    """fit.radii, fit.lambdas, fit.temperatures and fit.validation_fraction: the grids and the split of
    uph.lm.capacity."""

    radii: tuple[float, ...]
    lambdas: tuple[float, ...]
    temperatures: tuple[float, ...]
    validation_fraction: float

    @classmethod
    def from_config(cls, fit: dict) -> Capacity:
        grids = (tuple(sorted(fit[key])) for key in ("radii", "lambdas", "temperatures"))
        return cls(*grids, fit["validation_fraction"])


@dataclass(frozen=True)
class FitConfig:
    """The `fit:` section as a fit-stage job receives it (its keys in uph.config: FIT_GLOBAL_KEYS,
    FIT_VALIDATE_KEYS or FIT_SHARD_KEYS; defaults in schemas/fit.schema.yaml only), built once by the
    job's script. A part the job is not given is None: global_max_tokens (null there: no cap) is
    fit_global's, capacity the validating jobs', dose_response and on_cache the per-user jobs'."""

    points: tuple[Point, ...]  # heads x alphas x ds, then extra_points
    solvers: tuple[str, ...]
    heads: HeadSettings
    solver: SolverSettings
    baselines: tuple[str, ...]
    capacity: Capacity | None
    global_max_tokens: int | None
    dose_response: DoseResponse | None
    on_cache: tuple[tuple[Point, str, str], ...] | None  # (point, solver, cache): fitted on a cache's mixture

    @classmethod
    def from_config(cls, fit: dict) -> FitConfig:
        points = tuple(Point.of(*point) for point in sweep_points(fit))
        dose, on_cache = fit.get("dose_response"), fit.get("on_cache")
        return cls(
            points,
            tuple(fit["solvers"]),
            HeadSettings.from_config(fit),
            SolverSettings.from_config(fit),
            tuple(fit["baselines"]),
            Capacity.from_config(fit) if "radii" in fit else None,
            fit.get("global_max_tokens"),
            None if dose is None else DoseResponse.from_config(dose),
            None
            if on_cache is None
            else tuple((Point.of(p["head"], p["alpha"], p["d"]), p["solver"], p["cache"]) for p in on_cache),
        )


def build_heads(points, layer: OutputLayer, svd, settings: HeadSettings, full_bias: bool = False) -> dict[Point, Head]:
    """Each point's head on the model's output layer and SVD basis `svd` (U, S, Vh); with `full_bias`,
    the full bias too (at Point(FULL_BIAS, 1, V))."""
    heads = {
        point: make_head(point.head, layer.W, d=point.d, alpha=point.alpha, settings=settings, svd=svd, bias=layer.b)
        for point in points
    }
    if full_bias:
        heads[Point.of(FULL_BIAS, 1.0, layer.W.shape[0])] = full_bias_head(layer.W, layer.b)
    return heads


@dataclass
class FitJob:
    """What a fit-stage job works on: the model's output layer (on `device`: uph.lm.tokens.on_device), the
    users of its cache files (each checked against the model, the users table and the job's extract keys),
    every method's head, and the gap between a train part and the part that follows it (extract.context)."""

    layer: OutputLayer
    users: dict[str, UserStates]
    heads: dict[Point, Head]
    device: torch.device
    gap: int


def load_fit_job(inputs, points, heads: HeadSettings, cache: dict, device: str, only=None, full_bias=False) -> FitJob:
    """`inputs`: the rule's model (identity.json), users (users.parquet), basis and shards; `only`: the
    users the job works on (a fit job's, job_users), else every user; `cache`: the job's extract keys;
    `full_bias`: fit the full bias beside the points. The output layer goes to the job's device once
    (on_device): every Tokens of the job shares it."""
    model_dir, device = Path(inputs.model).parent, resolve_device(device)
    layer = read_output_layer(model_dir)
    svd = load_basis(inputs.basis, read_model_identity(model_dir)["weights_sha256"])
    users = read_users(inputs.shards, model_dir, inputs.users, cache, only)
    heads = build_heads(points, layer, svd, heads, full_bias)
    return FitJob(on_device(layer, device), users, heads, device, cache["context"])


def load_methods(inputs, fit: FitConfig, cache: dict, device: str, only=None, method: str | None = None) -> FitJob:
    """load_fit_job for every method of `fit` (or the one named `method`: a head, or the full bias): its
    points, and the full bias if fit.baselines has it."""
    points = [point for point in fit.points if method in (None, point.head)]
    full_bias = FULL_BIAS in fit.baselines and method in (None, FULL_BIAS)
    return load_fit_job(inputs, points, fit.heads, cache, device, only, full_bias)


def job_users(users_path, job, jobs: int) -> list[str]:
    """The users of fit job `job` of `jobs` (uph.lm.partition), from the users table at `users_path`."""
    return users_of_job(USERS_FILE.read_parquet(users_path, ["user_id", "train_end"]), int(job), jobs)


def prepared(states: UserStates, layer: OutputLayer, device: torch.device) -> tuple[Tokens, Tokens]:
    """(train, held-out) tokens of one user with their base distributions, on `device`."""
    return (
        prepare(states.train_hidden, states.train_targets, layer, device=device),
        prepare(states.test_hidden, states.test_targets, layer, device=device),
    )


def _fit_columns(prefix: str, result: FitResult) -> dict:
    return {f"{prefix}_{key}": value for key, value in result.as_dict().items() if key != "solver"}


def _scored_path(held_out: HeldOut, path, offset: torch.Tensor | None, columns: dict) -> list[dict]:
    """One validation row per ball of a path (uph.lm.fit.fit_path): its thetas (on top of `offset`)
    scored on the validation part in one pass (HeldOut.many)."""
    thetas = torch.stack([theta.double() for theta, _ in path])
    scores = held_out.many(thetas if offset is None else thetas + offset)
    return [
        {
            **columns,
            "capacity": result.radius,
            "validation_nll": score["nll"],
            "theta_norm": result.theta_norm,
            "certificate": result.certificate,
            "evaluations": result.evaluations,
            "seconds": result.seconds,
        }
        for (_, result), score in zip(path, scores)
    ]


def _choice_columns(point: Point, solver: str, arm: str, train_tokens=ALL_TOKENS) -> dict:
    return {**point.columns, "solver": solver, "arm": arm, "train_tokens": train_tokens}


UNIGRAM_METHOD = {"head": UNIGRAM, "alpha": math.nan, "d": math.nan, "solver": "exact"}  # no point, no solver
NEURAL_CACHE_METHOD = {**UNIGRAM_METHOD, "head": NEURAL_CACHE}
CACHES = {UNIGRAM: "cache", NEURAL_CACHE: "neural_cache"}  # fit.on_cache's caches: their arm, column prefix


def _baseline_columns(method: dict, arm: str) -> dict:
    return {**method, "arm": arm, "train_tokens": ALL_TOKENS}


def capacity_choices(validation: pd.DataFrame) -> pd.DataFrame:
    """Every (method, arm, train_tokens)'s choice from the validation rows of every job (uph.lm.capacity)."""
    return choose(validation, CHOICE_KEYS, KNOBS)


def _radius(choices: pd.DataFrame, point: Point, solver: str, arm: str, train_tokens=ALL_TOKENS) -> float:
    return chosen(choices, "capacity", **_choice_columns(point, solver, arm, train_tokens))


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
            columns = {**_choice_columns(point, solver, "global"), "user": user}
            validation += _scored_path(held_out[point], path, None, columns)
    validation = pd.DataFrame(validation)
    choices = capacity_choices(validation)
    train = None if fit_ends == train_ends else _pooled(job, train_ends)  # else: the same tokens, the same fit
    rows = []
    for (point, solver), path in paths.items():
        radius = _radius(choices, point, solver, "global")
        theta_fit, result = next((theta, result) for theta, result in path if result.radius == radius)
        theta = theta_fit
        if train is not None:
            theta, result = fit_theta(
                train, job.heads[point], solver, fit.solver, radius, user="global", label=point.label
            )
        edge = chosen_row(choices, **_choice_columns(point, solver, "global"))["at_edge"]
        rows.append(
            {
                **point.columns,
                "solver": solver,
                "pooled_tokens": sum(train_ends.values()),
                "at_edge": edge,
                **_fit_columns("fit", result),
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
    """(chosen settings, pooled datastore, validation rows) of the neural cache (uph.lm.neural_cache): the
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


def global_thetas(table: pd.DataFrame, column: str = "theta") -> dict[tuple[Point, str], torch.Tensor]:
    """(point, solver) -> theta_g from fit_global's table (`theta_fit`: the fit parts' theta_g)."""
    return {
        (Point.of(row["head"], row["alpha"], row["d"]), row["solver"]): torch.tensor(row[column], dtype=torch.float64)
        for _, row in table.iterrows()
    }


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


def _dose_split(train: Tokens, k: int, fraction: float, gap: int) -> tuple[Tokens, Tokens]:
    try:
        return validation_split(train.prefix(k), fraction, gap)
    except ValueError as error:
        raise ConfigError(
            f"config key 'fit.dose_response.train_tokens': {k} is too few to validate on: {error}"
        ) from None


def validate_user(
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
    warm-start rows: every ball's theta and BFGS model, for the refit at the radius chosen, _warm_rows)."""
    capacity = fit.capacity
    fit_part, held = validation_split(train, capacity.validation_fraction, gap)
    dose_points, ks = dict(fit.dose_response.points), [k for k in fit.dose_response.train_tokens if k < train.n]
    rows, warm = [], []

    def scored(held_out: HeldOut, path, offset, columns: dict) -> None:
        rows.extend(_scored_path(held_out, path, offset, {**columns, "user": user}))
        warm.extend(_warm_rows(path, {**columns, "user": user}))

    for point, head in heads.items():
        held_out = HeldOut(held, head)
        for solver in fit.solvers:
            theta_g, shared = thetas_g_fit[(point, solver)], HeadOnTokens(fit_part, head)
            personal = fit_path(fit_part, head, solver, fit.solver, capacity.radii, None, user, point.label, shared)
            residual = fit_path(fit_part, head, solver, fit.solver, capacity.radii, theta_g, user, point.label, shared)
            scored(held_out, personal, None, _choice_columns(point, solver, "personal"))
            scored(held_out, residual, theta_g, _choice_columns(point, solver, "residual"))
            if dose_points.get(point) != solver:
                continue
            for k in ks:
                fit_k, held_k = _dose_split(train, k, capacity.validation_fraction, gap)
                path = fit_path(fit_k, head, solver, fit.solver, capacity.radii, theta_g, user, point.label)
                scored(HeldOut(held_k, head), path, theta_g, _choice_columns(point, solver, "residual", k))
    for cache in dict.fromkeys(cache for _, _, cache in fit.on_cache):  # each cache's mixture once
        on_cache = caches.on_cache(cache, user, hidden_of(fit_part), targets_of(fit_part), True, gap)
        fit_cache, held_cache = on_cache(fit_part, own=True), on_cache(held)
        for point, solver in [(point, solver) for point, solver, name in fit.on_cache if name == cache]:
            path = fit_path(fit_cache, heads[point], solver, fit.solver, capacity.radii, user=user, label=point.label)
            scored(HeldOut(held_cache, heads[point]), path, None, _choice_columns(point, solver, CACHES[cache]))
    return rows, warm


WARM_MAX_D = 128  # a warm start's BFGS model is d² doubles: 128 KB at d = 128, 2.6 MB at d = 576 (cold there)


def _warm_rows(path, columns: dict) -> list[dict]:
    """Each ball's warm start (uph.lm.fit.WarmStart) for a refit at its radius: its theta and the exact
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
    job: FitJob, thetas_g_fit: dict, caches: CacheBaselines, fit: FitConfig
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every user of one fit job: (the validation rows that capacity_choices chooses from, the warm starts
    the fit job's refits read at the radii chosen) (validate_user)."""
    rows, warm = [], []
    for user, states in job.users.items():
        train = prepare(states.train_hidden, states.train_targets, job.layer, device=job.device)
        user_rows, user_warm = validate_user(user, train, job.heads, thetas_g_fit, caches, fit, job.gap)
        rows += user_rows
        warm += user_warm
        log.info("%s: validated %d train tokens", user, train.n)
    return pd.DataFrame(rows), pd.DataFrame(warm)


def fit_arms(
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
    theta_p, personal = fit_theta(train, head, solver, fit.solver, radii[0], None, user, label, shared, starts[0])
    theta_r, residual = fit_theta(train, head, solver, fit.solver, radii[1], theta_g, user, label, shared, starts[1])
    global_, personal_, residual_ = held_out.many(torch.stack([theta_g, theta_p.double(), theta_g + theta_r.double()]))
    columns = {
        "base_nll": held_out.base_nll,
        "global_nll": global_["nll"],
        "personal_nll": personal_["nll"],
        "residual_nll": residual_["nll"],
        "global_kl": global_["kl"],
        "personal_kl": personal_["kl"],
        "residual_kl": residual_["kl"],
        **_fit_columns("personal", personal),
        **_fit_columns("residual", residual),
        "sum_theta_norm": float((theta_g + theta_r.double()).norm()),
        "theta_personal": theta_p.double().tolist(),
        "theta_residual": theta_r.double().tolist(),
    }
    return columns, theta_r


def fit_dose_response(
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
            theta_k = fit_theta(train.prefix(k), head, solver, fit.solver, radius, offset=theta_g, start=start)[0]
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


def _cache_mixture(unigram: pd.DataFrame, counts: str, targets: torch.Tensor) -> Mixture:
    """The unigram residual arm's mixture at its chosen lambdas: the pooled `counts` column of fit_global's
    unigram row with the user's own counts of train token ids `targets`."""
    pooled = torch.tensor(unigram[counts].iloc[0], dtype=torch.float64)
    lam_global, lam_residual = float(unigram["lambda_global"].iloc[0]), float(unigram["lambda_residual"].iloc[0])
    return cache_mixture(pooled, count(targets, len(pooled)), lam_global, lam_residual)


@dataclass(frozen=True)
class CacheBaselines:
    """The cache baselines' global outputs as a per-user job reads them (None: not in fit.baselines):
    fit_global_unigram's lambdas and counts, fit_global_neural_cache's settings and datastore."""

    unigram: pd.DataFrame | None
    neural: NeuralCache | None

    def on_cache(self, cache: str, user: str, hidden: torch.Tensor, targets: torch.Tensor, fit_part: bool, gap: int):
        """tokens, own -> those tokens on `cache`'s residual-arm mixture for `user`, whose store is its train
        tokens `hidden`, `targets` (its fit part at validation: `fit_part`, with the pooled fit parts' cache);
        `own`: the tokens are those train tokens, each leaving its neighbourhood out of the neural cache."""
        if cache == UNIGRAM:
            mixture = _cache_mixture(self.unigram, "counts_fit" if fit_part else "counts", targets.cpu())
            return lambda tokens, own=False: tokens.mixed(mixture)
        store, owner = self.neural.own(user, hidden, targets), self.neural.owners[user]
        return lambda tokens, own=False: self.neural.mixed(tokens, store, fit_part, owner if own else None, gap)


def read_cache_baselines(inputs, record: dict, device: torch.device) -> CacheBaselines:
    """The cache baselines' global tables a rule's `inputs` name (unigram; neural_cache and datastore),
    checked against `record`; an empty table (the baseline not in fit.baselines) is None."""
    unigram, settings = (FIT_FILE.read_table(path, record) for path in (inputs.unigram, inputs.neural_cache))
    neural = None
    if not settings.empty:
        neural = NeuralCache.from_tables(settings, FIT_FILE.read_table(inputs.datastore, record), device)
    return CacheBaselines(None if unigram.empty else unigram, neural)


def neural_cache_arms(user: str, train: Tokens, test: Tokens, cache: NeuralCache) -> dict:
    """One user's neural cache mixtures in the three arms at their chosen (T, lambda), scored on test: the
    columns of a fits row (uph.lm.neural_cache)."""
    nlls = cache.arm_nlls(test, cache.own(user, hidden_of(train), targets_of(train)))
    return {"base_nll": test.base_nll, **{f"{arm}_nll": nll for arm, nll in nlls.items()}}


def unigram_arms(train: Tokens, test: Tokens, unigram: pd.DataFrame) -> dict:
    """One user's unigram mixtures in the three arms at their chosen lambdas, scored on test: the columns
    of a fits row (uph.lm.baselines)."""
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


def fit_on_cache(
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
    theta, result = fit_theta(train, head, solver, fit.solver, radius, user=user, label=label, start=start)
    held_out = HeldOut(test, head)
    return {
        f"{prefix}_nll": held_out.base_nll,
        f"{prefix}_head_nll": held_out(theta)["nll"],
        **_fit_columns(prefix, result),
        f"theta_{prefix}": theta.double().tolist(),
    }


def fit_user(
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
    The heads of fit.on_cache are also fitted on their cache's residual-arm mixture (fit_on_cache).
    `starts`: the validate job's warm starts (warm_starts); a refit without one starts cold."""
    starts = starts or {}

    def start(point: Point, solver: str, arm: str, radius: float, k: int | None = None) -> WarmStart | None:
        return starts.get((point, solver, arm, k, user, float(radius)))

    dose_points, on_mixture = dict(fit.dose_response.points), {}
    for cache in dict.fromkeys(cache for _, _, cache in fit.on_cache):  # every head on a cache shares its tokens
        on_cache = caches.on_cache(cache, user, hidden_of(train), targets_of(train), False, gap)
        on_mixture[cache] = (on_cache(train, own=True), on_cache(test))
    fits, dose = [], []
    user_columns = {"user": user, "train_tokens": train.n, "test_tokens": test.n}
    for point, head in heads.items():
        held_out = HeldOut(test, head)
        for solver in fit.solvers:
            theta_g = thetas_g[(point, solver)]
            radii = tuple(_radius(choices, point, solver, arm) for arm in ("personal", "residual"))
            warm = (start(point, solver, "personal", radii[0]), start(point, solver, "residual", radii[1]))
            arms, theta_r = fit_arms(train, held_out, head, theta_g, radii, solver, fit, user, point.label, warm)
            for cache in [cache for at, by, cache in fit.on_cache if (at, by) == (point, solver)]:
                prefix = CACHES[cache]
                radius = _radius(choices, point, solver, prefix)
                warm_cache = start(point, solver, prefix, radius)
                tokens = on_mixture[cache]
                arms |= fit_on_cache(*tokens, head, radius, solver, fit, user, point.label, warm_cache, prefix)
            fits.append({**point.columns, "solver": solver, **user_columns, "params_per_user": point.d, **arms})
            if dose_points.get(point) == solver:
                ks = [k for k in fit.dose_response.train_tokens if k < train.n]
                dose_radii = {k: _radius(choices, point, solver, "residual", k) for k in ks} | {train.n: radii[1]}
                dose_starts = {k: start(point, solver, "residual", dose_radii[k], k) for k in ks}
                dose += [
                    {**point.columns, "solver": solver, "user": user, **row}
                    for row in fit_dose_response(
                        train,
                        held_out,
                        head,
                        theta_g,
                        theta_r,
                        arms["global_nll"],
                        dose_radii,
                        solver,
                        fit,
                        dose_starts,
                    )
                ]
        log.info(
            "%s %s: beyond global %+.4f, personal %+.4f",
            user,
            point.label,
            fits[-1]["residual_nll"] - fits[-1]["global_nll"],
            fits[-1]["personal_nll"] - fits[-1]["base_nll"],
        )
    if caches.unigram is not None:
        vocab_and_lambda = train.layer.W.shape[0] + 1
        fits.append(
            {
                **UNIGRAM_METHOD,
                **user_columns,
                "params_per_user": vocab_and_lambda,
                **unigram_arms(train, test, caches.unigram),
            }
        )
    if caches.neural is not None:
        store = train.n * (train.layer.W.shape[1] + 1)  # the user's states and next tokens
        fits.append(
            {
                **NEURAL_CACHE_METHOD,
                **user_columns,
                "params_per_user": store,
                **neural_cache_arms(user, train, test, caches.neural),
            }
        )
    return fits, dose


def fit_users(
    job: FitJob,
    thetas_g: dict,
    choices: pd.DataFrame,
    caches: CacheBaselines,
    fit: FitConfig,
    starts: dict[tuple, WarmStart] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every user of one fit job: (fits, dose_response) tables (module docstring), each refit warm from
    its validation path's ball at the chosen radius where `starts` (warm_starts) has it."""
    tables = ([], [])
    for user, states in job.users.items():
        train, test = prepared(states, job.layer, job.device)
        rows = fit_user(user, train, test, job.heads, thetas_g, choices, caches, fit, job.gap, starts)
        for table, user_rows in zip(tables, rows):
            table.extend(user_rows)
    return tuple(pd.DataFrame(rows) for rows in tables)


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
    caches: CacheBaselines = CacheBaselines(None, None),
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
