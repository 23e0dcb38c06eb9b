"""The personalization study on cached users: every sweep point, p0 computed once per user.

A point is (head, alpha, d); every point is fitted with every solver, in three arms whose
held-out NLLs sit side by side in one row per (user, point, solver):

    global     theta_g fitted on the pooled train tokens of all users (the domain-adaptation control)
    personal   theta_u fitted on the user's train tokens from zero (seed 002's setting)
    residual   theta_r fitted on the user's train tokens on top of theta_g (held fixed): the
               personal gain beyond domain adaptation is nll(theta_g + theta_r) - nll(theta_g)

Jobs (rules/fit.smk), each computing a user's base distribution p0 once for all points:
`fit_global` pools each user's first ceil(global_max_tokens / N) train tokens (all when null),
so its memory does not grow with the number of users; `fit_shard` runs, per user of one cache
shard (`fit_user`), the three arms of every point and solver (`fit_arms`), the dose-response
(`fit_dose_response`: residual fits on the first k train tokens) and the baselines (`fit_baselines`,
uph.lm.baselines); `cross_user` scores every user's residual
theta on each user's held-out text (N x N evaluations, no fits).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from uph.device import resolve_device
from uph.lm.baselines import unigram_interpolation
from uph.lm.basis import load_basis
from uph.lm.cache import UserStates, read_users
from uph.lm.evaluate import HeldOut
from uph.lm.fit import FitResult, fit_theta
from uph.lm.heads import Head, HeadSettings, full_bias_head, make_head
from uph.lm.models import OutputLayer, read_output_layer
from uph.lm.solvers import SolverSettings
from uph.lm.tokens import Tokens, pool, prepare

log = logging.getLogger(__name__)


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
class FitConfig:
    """The `fit:` section as a fit-stage job receives it (its keys in uph.config: FIT_GLOBAL_KEYS or
    FIT_SHARD_KEYS; defaults in schemas/fit.schema.yaml only), built once by the job's script. A part
    the job is not given is None: global_max_tokens (null there: no cap) is fit_global's, dose_response
    and baselines the shard fits'."""

    points: tuple[Point, ...]  # heads x alphas x ds
    solvers: tuple[str, ...]
    heads: HeadSettings
    solver: SolverSettings
    global_max_tokens: int | None
    dose_response: DoseResponse | None
    baselines: tuple[str, ...] | None

    @classmethod
    def from_config(cls, fit: dict) -> FitConfig:
        points = tuple(Point.of(h, a, d) for h in fit["heads"] for a in fit["alphas"] for d in fit["ds"])
        dose = fit.get("dose_response")
        return cls(
            points,
            tuple(fit["solvers"]),
            HeadSettings.from_config(fit),
            SolverSettings.from_config(fit),
            fit.get("global_max_tokens"),
            None if dose is None else DoseResponse.from_config(dose),
            None if "baselines" not in fit else tuple(fit["baselines"]),
        )


def build_heads(points, layer: OutputLayer, basis_path: str | Path, settings: HeadSettings) -> dict[Point, Head]:
    """Each point's head on the model's output layer and SVD basis."""
    svd = load_basis(basis_path)
    return {
        point: make_head(point.head, layer.W, d=point.d, alpha=point.alpha, settings=settings, svd=svd, bias=layer.b)
        for point in points
    }


@dataclass
class FitJob:
    """What a fit-stage job works on: the model's output layer, the users of its cache files (each
    checked against the model, the users table and the job's extract keys), every point's head."""

    layer: OutputLayer
    users: dict[str, UserStates]
    heads: dict[Point, Head]
    device: torch.device


def load_fit_job(inputs, points, heads: HeadSettings, cache: dict, device: str, shards=None) -> FitJob:
    """`inputs`: the rule's model (identity.json), users (users.parquet), basis and shards (or `shards`);
    `cache`: the job's extract keys."""
    model_dir = Path(inputs.model).parent
    layer = read_output_layer(model_dir)
    users = read_users(shards or inputs.shards, model_dir, inputs.users, cache)
    return FitJob(layer, users, build_heads(points, layer, inputs.basis, heads), resolve_device(device))


def prepared(states: UserStates, layer: OutputLayer, device: torch.device) -> tuple[Tokens, Tokens]:
    """(train, held-out) tokens of one user with their base distributions, on `device`."""
    return (
        prepare(states.train_hidden, states.train_targets, layer, device=device),
        prepare(states.test_hidden, states.test_targets, layer, device=device),
    )


def _fit_columns(prefix: str, result: FitResult) -> dict:
    return {f"{prefix}_{key}": value for key, value in result.as_dict().items() if key != "solver"}


def fit_global(job: FitJob, fit: FitConfig) -> pd.DataFrame:
    """The global theta of every (point, solver) on the pooled train tokens of the job's users (module
    docstring)."""
    cap = fit.global_max_tokens
    share = None if cap is None else math.ceil(cap / len(job.users))
    train = pool(
        [
            prepare(states.train_hidden[:share], states.train_targets[:share], job.layer, device=job.device)
            for states in job.users.values()
        ]
    )
    log.info("global theta on %d pooled train tokens of %d users", train.n, len(job.users))
    rows = []
    for point, head in job.heads.items():
        for solver in fit.solvers:
            theta, result = fit_theta(train, head, solver, fit.solver, user="global", label=point.label)
            rows.append(
                {
                    **point.columns,
                    "solver": solver,
                    "pooled_tokens": train.n,
                    **_fit_columns("fit", result),
                    "theta": theta.double().tolist(),
                }
            )
            log.info("%s %s: certificate %.1e (%.1f s)", point.label, solver, result.certificate, result.seconds)
    return pd.DataFrame(rows)


def global_thetas(table: pd.DataFrame) -> dict[tuple[Point, str], torch.Tensor]:
    """(point, solver) -> theta_g from fit_global's table."""
    return {
        (Point.of(row.head, row.alpha, row.d), row.solver): torch.tensor(row.theta, dtype=torch.float64)
        for row in table.itertuples()
    }


def residual_thetas(fits: pd.DataFrame) -> dict[tuple[Point, str], dict[str, torch.Tensor]]:
    """(point, solver) -> user -> residual theta_r, from the fit jobs' rows."""
    thetas: dict[tuple[Point, str], dict[str, torch.Tensor]] = {}
    for row in fits.itertuples():
        key = (Point.of(row.head, row.alpha, row.d), row.solver)
        thetas.setdefault(key, {})[row.user] = torch.tensor(row.theta_residual, dtype=torch.float64)
    return thetas


def fit_arms(
    train: Tokens,
    held_out: HeldOut,
    head: Head,
    theta_g: torch.Tensor,
    solver: str,
    fit: FitConfig,
    user: str,
    label: str,
) -> tuple[dict, torch.Tensor]:
    """One user's three arms at one point and solver, scored on the held-out text: the global theta_g,
    the personal theta from zero, the residual theta_r on top of theta_g. Returns the row's columns
    and theta_r."""
    theta_p, personal = fit_theta(train, head, solver, fit.solver, user=user, label=label)
    theta_r, residual = fit_theta(train, head, solver, fit.solver, offset=theta_g, user=user, label=label)
    global_, personal_, residual_ = held_out(theta_g), held_out(theta_p), held_out(theta_g + theta_r)
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
    solver: str,
    fit: FitConfig,
) -> list[dict]:
    """The residual arm refitted on the user's first k train tokens, for each k of fit.dose_response
    below the user's count, then all of them (theta_r, already fitted): the held-out NLL of each, beside
    the global theta's (`global_nll`, from the arms)."""
    ks = [k for k in fit.dose_response.train_tokens if k < train.n]
    rows = []
    for k in [*ks, train.n]:
        theta_k = theta_r if k == train.n else fit_theta(train.prefix(k), head, solver, fit.solver, offset=theta_g)[0]
        rows.append(
            {
                "train_tokens": k,
                "all_train_tokens": k == train.n,
                "global_nll": global_nll,
                "residual_nll": held_out(theta_g + theta_k)["nll"],
            }
        )
    return rows


def fit_baselines(train: Tokens, test: Tokens, fit: FitConfig, user: str, columns: dict) -> list[dict]:
    """The baselines fitted on the user's train tokens (uph.lm.baselines), each row with `columns`: unigram
    interpolation (its lambda by leave-one-out, no solver) and the full-vocabulary bias (every solver)."""
    vocab_size = train.layer.W.shape[0]
    rows = []
    if "unigram" in fit.baselines:
        unigram = unigram_interpolation(train, test, vocab_size)
        rows.append(
            {
                "baseline": "unigram",
                "solver": "exact",
                **columns,
                "nll": unigram["nll"],
                "lambda": unigram["lambda"],
                "params_per_user": vocab_size + 1,
            }
        )
    if "full_bias" in fit.baselines:
        head = full_bias_head(train.layer.W, train.layer.b)
        held_out = HeldOut(test, head)
        for solver in fit.solvers:
            theta, result = fit_theta(train, head, solver, fit.solver, user=user, label="full_bias")
            rows.append(
                {
                    "baseline": "full_bias",
                    "solver": solver,
                    **columns,
                    "nll": held_out(theta)["nll"],
                    **_fit_columns("fit", result),
                    "params_per_user": vocab_size,
                }
            )
    return rows


def fit_user(
    user: str, train: Tokens, test: Tokens, heads: dict[Point, Head], thetas_g: dict, fit: FitConfig
) -> tuple[list[dict], list[dict], list[dict]]:
    """One user's rows: (every point x solver with its three arms, dose-response, baselines)."""
    dose_points = dict(fit.dose_response.points)
    fits, dose = [], []
    user_columns = {"user": user, "train_tokens": train.n, "test_tokens": test.n}
    for point, head in heads.items():
        held_out = HeldOut(test, head)
        for solver in fit.solvers:
            theta_g = thetas_g[(point, solver)]
            arms, theta_r = fit_arms(train, held_out, head, theta_g, solver, fit, user, point.label)
            fits.append({**point.columns, "solver": solver, **user_columns, **arms})
            if dose_points.get(point) == solver:
                dose += [
                    {**point.columns, "solver": solver, "user": user, **row}
                    for row in fit_dose_response(
                        train, held_out, head, theta_g, theta_r, arms["global_nll"], solver, fit
                    )
                ]
        log.info(
            "%s %s: beyond global %+.4f, personal %+.4f",
            user,
            point.label,
            fits[-1]["residual_nll"] - fits[-1]["global_nll"],
            fits[-1]["personal_nll"] - fits[-1]["base_nll"],
        )
    return fits, dose, fit_baselines(train, test, fit, user, {**user_columns, "base_nll": test.base_nll})


def fit_shard(job: FitJob, thetas_g: dict, fit: FitConfig) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every user of one shard: (fits, dose_response, baselines) tables (module docstring)."""
    tables = ([], [], [])
    for user, states in job.users.items():
        train, test = prepared(states, job.layer, job.device)
        for table, rows in zip(tables, fit_user(user, train, test, job.heads, thetas_g, fit)):
            table.extend(rows)
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


def others(job: FitJob, thetas_g: dict, residuals: dict[tuple[Point, str], dict[str, torch.Tensor]]) -> pd.DataFrame:
    """The control with a residual's capacity that is not the user's own: per (point, solver, user u) the
    global theta plus the mean of the other users' residual thetas, scored on u's held-out text,

        theta_others(u) = theta_g + (Σ_v theta_r(v) - theta_r(u)) / (N - 1).

    A personal gain is the own residual beating it; a residual that only extends a direction every user
    shares does as well in others' hands. One text's held-out p0 in memory at a time; no rows for N < 2."""
    if len(job.users) < 2:
        log.info("the 'others' control needs 2 users or more; this study has %d", len(job.users))
        return pd.DataFrame(columns=["head", "alpha", "d", "solver", "user", "others_nll"])
    totals = {key: sum(thetas.values()) for key, thetas in residuals.items()}
    rows = []
    for user, states in tqdm(job.users.items(), desc="others", unit="text", mininterval=5):
        test = prepare(states.test_hidden, states.test_targets, job.layer, device=job.device)
        held_out = {point: HeldOut(test, head) for point, head in job.heads.items()}
        for (point, solver), thetas in residuals.items():
            theta = thetas_g[(point, solver)] + (totals[point, solver] - thetas[user]) / (len(thetas) - 1)
            rows.append({**point.columns, "solver": solver, "user": user, "others_nll": held_out[point](theta)["nll"]})
    return pd.DataFrame(rows)
