"""Held-out evaluation of fitted thetas: per user, across users, per configuration.

Per user, on the held-out split: base NLL (theta = 0), personalized NLL, delta_nll = nll -
base_nll (negative = better) and kl = mean KL(p0 ‖ p_theta), all from the engine's `Objective`
(beta = lam = 0). Controls: the cross-user matrix (theta of user u scored on the text of user v;
a dominant diagonal means the gain is personal) and the `global` theta (fitted on
`uph.lm.fit.pool` of all users' train splits, then scored on every user like a personal one).
Per configuration: mean delta with a 95 % percentile-bootstrap interval over users (fixed RNG
seed, so tables are reproducible), the share of users improved, and d parameters per user.
"""

from __future__ import annotations

import pandas as pd
import torch

from uph.lm.fit import Objective, Tokens
from uph.lm.heads import Head
from uph.stats import bootstrap_ci


def _metrics(objective: Objective, theta: torch.Tensor) -> dict:
    value = objective(theta, need_grad=False)
    base = objective.tokens.base_nll
    return {"base_nll": base, "nll": value.ce, "delta_nll": value.ce - base, "kl": value.kl}


def user_metrics(tokens: Tokens, head: Head, theta: torch.Tensor) -> dict:
    """base_nll, nll, delta_nll and kl of `theta` on one user's held-out tokens."""
    return _metrics(Objective(tokens, head, beta=0.0, lam=0.0), theta)


def per_user(thetas: dict[str, torch.Tensor], tests: dict[str, Tokens], head: Head) -> pd.DataFrame:
    """One row per user: its theta (or, for the global control, the same theta for all) on its text."""
    return pd.DataFrame([{"user": user, **user_metrics(tests[user], head, theta)} for user, theta in thetas.items()])


def cross_user(thetas: dict[str, torch.Tensor], tests: dict[str, Tokens], head: Head) -> pd.DataFrame:
    """One row per (theta_user u, text_user v): theta_u scored on v's held-out text."""
    rows = []
    for text_user, tokens in tests.items():
        objective = Objective(tokens, head, beta=0.0, lam=0.0)
        rows += [
            {"theta_user": theta_user, "text_user": text_user, **_metrics(objective, theta)}
            for theta_user, theta in thetas.items()
        ]
    return pd.DataFrame(rows)


def summarize(users: pd.DataFrame, d: int, n_boot: int = 10_000, seed: int = 0) -> dict:
    """A configuration's row from its per-user metrics (`per_user`)."""
    low, high = bootstrap_ci(users["delta_nll"], n_boot=n_boot, seed=seed)
    return {
        "n_users": len(users),
        "base_nll": users["base_nll"].mean(),
        "nll": users["nll"].mean(),
        "delta_nll": users["delta_nll"].mean(),
        "delta_nll_ci_low": low,
        "delta_nll_ci_high": high,
        "frac_users_improved": float((users["delta_nll"] < 0).mean()),
        "kl": users["kl"].mean(),
        "params_per_user": d,
    }
