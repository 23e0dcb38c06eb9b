"""The personalization sweep on cached users: one sweep point (head, alpha, d) at a time.

Each user's train and held-out tokens are prepared once per job (the only V×H products, see
uph.lm.fit), then every solver fits theta on the train split and is scored on the held-out split.
A job reads only the fit keys its head reads (`head_settings`) and those of its solvers
(`SOLVER_KEYS`), so changing one head's settings reruns only that head's jobs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import torch

from uph.device import resolve_device
from uph.lm.basis import load_basis
from uph.lm.cache import UserStates, read_users
from uph.lm.evaluate import user_metrics
from uph.lm.fit import Tokens, fit_theta, prepare
from uph.lm.heads import Head, make_head
from uph.lm.models import read_output_layer

log = logging.getLogger(__name__)


def point_label(head: str, alpha: float, d: int) -> dict:
    return {"head": head, "alpha": float(alpha), "d": int(d)}


def load_point(
    point: dict, model_dir: str | Path, basis_path: str | Path, shards, settings: dict, cache: dict, device: str
) -> tuple[Head, dict[str, UserStates], torch.device]:
    """What every job at one sweep point needs: the point's head (`settings` from `head_settings`)
    on the model's lm_head (float32) and SVD basis, the users of `shards` (checked against the
    cache identity that `cache`, the extract keys context and dtype, asks for), the device."""
    layer = read_output_layer(model_dir)
    W, b = layer.W, layer.b
    head = make_head(
        point["head"], W, svd=load_basis(basis_path), d=point["d"], alpha=point["alpha"], bias=b, **settings
    )
    users = read_users(shards, model_dir, Path(model_dir).parent / "corpus" / "users.parquet", cache)
    return head, users, resolve_device(device)


def prepared(states: UserStates, head: Head, device: torch.device) -> tuple[Tokens, Tokens]:
    """(train, test) tokens of one user with their base distributions, on `device`."""
    return (
        prepare(states.train_hidden, states.train_targets, head.W, head.b, device=device),
        prepare(states.test_hidden, states.test_targets, head.W, head.b, device=device),
    )


def fit_and_score(
    train: Tokens, tests: dict[str, Tokens], head: Head, fit: dict, solver: str, user: str, point: dict
) -> tuple[torch.Tensor, list[dict]]:
    """Fit theta on `train` with `solver` (settings: the SOLVER_KEYS of `fit`); one row per held-out
    split in `tests` it is scored on."""
    theta, result = fit_theta(
        train,
        head,
        solver,
        beta=fit["beta"],
        lam=fit["lam"],
        max_norm=fit["max_norm"],
        lr=fit["lr"],
        steps=fit["steps"],
        tol=fit["tol"],
        max_iter=fit["max_iter"],
        user=user,
        config=point,
    )
    fit_columns = {f"fit_{k}": v for k, v in result.as_dict().items() if k != "solver"}
    rows = [
        {
            **point,
            "solver": solver,
            "user": text_user,
            **fit_columns,
            **user_metrics(test, head, theta),
            "theta": theta.double().tolist(),
        }
        for text_user, test in tests.items()
    ]
    return theta, rows


def fit_users(users: dict[str, UserStates], head: Head, fit: dict, point: dict, device: torch.device) -> pd.DataFrame:
    """Every user x solver at one sweep point: fit, certificate and held-out metrics per row."""
    rows = []
    for user, states in users.items():
        train, test = prepared(states, head, device)
        for solver in fit["solvers"]:
            _, scored = fit_and_score(train, {user: test}, head, fit, solver, user, point)
            rows += scored
            log.info(
                "%s %s: delta_nll %+.4f (certificate %.1e, %.1f s)",
                user,
                solver,
                scored[0]["delta_nll"],
                scored[0]["fit_certificate"],
                scored[0]["fit_seconds"],
            )
    return pd.DataFrame(rows)
