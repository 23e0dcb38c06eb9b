"""The personalization study on cached users: every method at its capacity chosen on validation.

A method is a sweep point (head, alpha, d), or the full-vocabulary bias (d = V) when fit.baselines
has it; each is fitted with every solver, in three arms whose held-out NLLs sit side by side in one
row per (user, point, solver):

    global     theta_g fitted on the pooled train tokens of all users (the domain-adaptation control)
    personal   theta_u fitted on the user's train tokens from zero (seed 002's setting)
    residual   theta_r fitted on the user's train tokens on top of theta_g (held fixed): the
               personal gain beyond domain adaptation is nll(theta_g + theta_r) - nll(theta_g)

Each arm's capacity, the radius of its ball, is chosen on validation (uph.lm.engine.capacity): every radius
of fit.radii is fitted on the users' fit parts (warm along the path, uph.lm.engine.fit.fit_path) and scored
on their validation parts, the best mean is chosen, and the arm is refitted on all train tokens at it.
The cache baselines choose their knobs the same way: the unigram mixtures (uph.lm.engine.baselines) their lambda,
the neural cache (uph.lm.engine.neural_cache) its temperature and lambda. The heads of fit.on_cache are also
fitted on a cache's residual-arm mixture as their base (a fourth arm, "cache" or "neural_cache").

Jobs (rules/fit.smk), each computing a user's base distribution p0 once for all its methods; the
per-user ones hold the users of one fit job (fit.jobs of them, balanced by train tokens: uph.lm.jobs.partition),
and a user's rows do not depend on which job holds it. uph.lm.jobs.choices chooses (rule capacity); the
other jobs are uph.lm.jobs.global_fit (fit_global, fit_global_unigram, fit_global_neural_cache),
uph.lm.jobs.validate (validate), uph.lm.jobs.refit (fit) and uph.lm.jobs.controls (fit_others, cross_user).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from uph.artifacts import FIT_FILE, USERS_FILE
from uph.config import sweep_points
from uph.device import resolve_device
from uph.lm.data.basis import load_basis
from uph.lm.data.cache import UserStates, read_users
from uph.lm.data.models import OutputLayer, read_output_layer
from uph.lm.engine.baselines import NEURAL_CACHE, UNIGRAM, cache_mixture, count
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import FitResult
from uph.lm.engine.heads import Head, HeadSettings, full_bias_head, make_head
from uph.lm.engine.neural_cache import NeuralCache
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import Mixture, Tokens, on_device, prepare, prepare_halves
from uph.lm.jobs.choices import Point
from uph.lm.jobs.partition import users_of_job
from uph.model_identity import read_identity as read_model_identity

FULL_BIAS = "full_bias"
ARMS = ("global", "personal", "residual")


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
    uph.lm.engine.capacity."""

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
    """What a fit-stage job works on: the model's output layer (on `device`: uph.lm.engine.tokens.on_device), the
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
    """The users of fit job `job` of `jobs` (uph.lm.jobs.partition), from the users table at `users_path`."""
    return users_of_job(USERS_FILE.read_parquet(users_path, ["user_id", "train_end"]), int(job), jobs)


def prepared(states: UserStates, layer: OutputLayer, device: torch.device) -> tuple[Tokens, Tokens]:
    """(train, held-out) tokens of one user with their base distributions, on `device`."""
    return (
        prepare(states.train_hidden, states.train_targets, layer, device=device),
        prepare(states.test_hidden, states.test_targets, layer, device=device),
    )


def group_trains(job: FitJob, group: list[str], stacked: bool | None = None) -> dict[str, Tokens]:
    """The train tokens of a lockstep group's users (uph.lm.engine.lockstep.user_groups), with their base
    distributions on the job's device: `stacked` (default: on a GPU) side by side in two Stacks, the
    group's halves (prepare_halves), each of whose rounds is one batched pass (uph.lm.engine.round) and whose rounds
    alternate (the host runs one half's solver steps while the device computes the other's pass); else
    each on its own."""
    if job.device.type == "cpu" if stacked is None else not stacked:
        return {
            user: prepare(job.users[user].train_hidden, job.users[user].train_targets, job.layer, device=job.device)
            for user in group
        }
    splits = [(job.users[user].train_hidden, job.users[user].train_targets) for user in group]
    return dict(zip(group, prepare_halves(splits, job.layer, device=job.device)))


def fit_columns(prefix: str, result: FitResult) -> dict:
    """A fit's columns (FitResult.as_dict less the solver), each named `<prefix>_<column>`."""
    return {f"{prefix}_{key}": value for key, value in result.as_dict().items() if key != "solver"}


def scored_path(held_out: HeldOut, path, offset: torch.Tensor | None, columns: dict) -> list[dict]:
    """One validation row per ball of a path (uph.lm.engine.fit.fit_path): its thetas (on top of `offset`)
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


UNIGRAM_METHOD = {"head": UNIGRAM, "alpha": math.nan, "d": math.nan, "solver": "exact"}  # no point, no solver
NEURAL_CACHE_METHOD = {**UNIGRAM_METHOD, "head": NEURAL_CACHE}
CACHES = {UNIGRAM: "cache", NEURAL_CACHE: "neural_cache"}  # fit.on_cache's caches: their arm, column prefix


def global_thetas(table: pd.DataFrame, column: str = "theta") -> dict[tuple[Point, str], torch.Tensor]:
    """(point, solver) -> theta_g from fit_global's table (`theta_fit`: the fit parts' theta_g)."""
    return {
        (Point.of(row["head"], row["alpha"], row["d"]), row["solver"]): torch.tensor(row[column], dtype=torch.float64)
        for _, row in table.iterrows()
    }


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
