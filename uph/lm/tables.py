"""The personalization study's tables from the fit jobs' per-user rows (rule personalization_table).

personalization: per (head, alpha, d, solver) three comparisons on the users' held-out text, each
uph.stats.compare of per-user NLLs (paired bootstrap interval, users improved, sign test):

    global            nll(theta_g)          against base_nll
    personal          nll(theta_u)          against base_nll
    global+personal   nll(theta_g + theta_r) against nll(theta_g)   (the gain beyond global)
    others            nll(theta_g + mean of the other users' theta_r) against nll(theta_g)
    own vs others     nll(theta_g + theta_r) against the others' nll (the personal gain: the own
                      residual against the same capacity fitted on everyone else)

then one row per (baseline, solver), personal against base. dose_response: the gain beyond global of
residuals fitted on each user's first k train tokens, the all-tokens rows standing at their mean count.
cross_user: every residual theta on every user's text, as the cross_user jobs scored them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from uph.lm.solvers import on_ball
from uph.stats import compare

KEYS = ["head", "alpha", "d", "solver"]
ARMS = (  # control, its held-out NLL, the reference it is compared with, its KL column, its fit columns' prefix
    ("global", "global_nll", "base_nll", "global_kl", None),
    ("personal", "personal_nll", "base_nll", "personal_kl", "personal"),
    ("global+personal", "residual_nll", "global_nll", "residual_kl", "residual"),
)
OTHERS = (  # control, its held-out NLL, the reference: the comparisons that read the others control
    ("others", "others_nll", "global_nll"),
    ("own vs others", "residual_nll", "others_nll"),
)
CROSS_USER_COLUMNS = ["model", *KEYS, "theta_user", "text_user", "base_nll", "global_nll", "nll", "delta_nll"]


def _comparison(model: str, point: dict, users: pd.DataFrame, control: str, arm: str, reference: str, n_boot: int):
    """A row's comparison columns: the users' `arm` NLL against their `reference` NLL (uph.stats.compare)."""
    return {
        "model": model,
        **point,
        "control": control,
        "reference": reference.removesuffix("_nll"),
        **compare(users[arm], users[reference], n_boot=n_boot),
        "params_per_user": point["d"],
    }


def personalization_table(
    model: str,
    fits: pd.DataFrame,
    global_fits: pd.DataFrame,
    others: pd.DataFrame,
    baselines: pd.DataFrame,
    n_boot: int,
    max_norm: float,
) -> pd.DataFrame:
    """`fits`: the fit jobs' per-(user, point, solver) rows; `global_fits`: fit_global's rows; `others`:
    fit_others' per-(user, point, solver) others_nll (no rows with one user: no others controls);
    `baselines`: the per-(user, baseline, solver) rows. A fitted row's frac_on_ball is the share of its
    thetas on the ball of radius `max_norm` (fit.max_norm; the global row's one theta: 0 or 1)."""
    global_fits = global_fits.set_index(KEYS)
    fits = fits.assign(others_nll=np.nan) if others.empty else fits.merge(others, on=[*KEYS, "user"], how="left")
    rows = []
    for key, users in fits.groupby(KEYS, sort=True):
        point = dict(zip(KEYS, key))
        for control, arm, reference, kl, prefix in ARMS:
            fitted = global_fits.loc[key] if prefix is None else None
            rows.append(
                {
                    **_comparison(model, point, users, control, arm, reference, n_boot),
                    "kl": users[kl].mean(),
                    "fit_objective": fitted["fit_objective"] if prefix is None else users[f"{prefix}_objective"].mean(),
                    "fit_certificate_max": (
                        fitted["fit_certificate"] if prefix is None else users[f"{prefix}_certificate"].max()
                    ),
                    "frac_on_ball": float(
                        on_ball(fitted["fit_theta_norm"], max_norm)
                        if prefix is None
                        else on_ball(users[f"{prefix}_theta_norm"], max_norm).mean()
                    ),
                }
            )
        if users["others_nll"].notna().all():
            rows += [_comparison(model, point, users, *control, n_boot) for control in OTHERS]
    for (baseline, solver), users in baselines.groupby(["baseline", "solver"], sort=True):
        fitted = "fit_objective" in users and users["fit_objective"].notna().any()
        rows.append(
            {
                "model": model,
                "head": baseline,
                "alpha": np.nan,
                "d": np.nan,
                "solver": solver,
                "control": "personal",
                "reference": "base",
                **compare(users["nll"], users["base_nll"], n_boot=n_boot),
                "params_per_user": users["params_per_user"].iloc[0],
                "kl": np.nan,
                "fit_objective": users["fit_objective"].mean() if fitted else np.nan,
                "fit_certificate_max": users["fit_certificate"].max() if fitted else np.nan,
                "frac_on_ball": on_ball(users["fit_theta_norm"], max_norm).mean() if fitted else np.nan,
            }
        )
    return pd.DataFrame(rows)


def dose_response_table(model: str, dose: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    """Per (point, solver, train size): the residual against the global theta over the users. The rows
    that use all of each user's train tokens stand at their mean count."""
    mean_count = dose.groupby([*KEYS, "all_train_tokens"])["train_tokens"].transform("mean")
    dose = dose.assign(train_tokens=mean_count.where(dose["all_train_tokens"], dose["train_tokens"]))
    return pd.DataFrame(
        [
            {
                "model": model,
                **dict(zip(KEYS, key)),
                "train_tokens": train_tokens,
                "all_train_tokens": everything,
                **compare(users["residual_nll"], users["global_nll"], n_boot=n_boot),
            }
            for (*key, train_tokens, everything), users in dose.groupby([*KEYS, "train_tokens", "all_train_tokens"])
        ]
    )


def cross_user_table(model: str, points: list[pd.DataFrame]) -> pd.DataFrame:
    """The cross_user jobs' matrices (one frame per point) as one table; no point: no rows, every column."""
    if not points:
        return pd.DataFrame(columns=CROSS_USER_COLUMNS)
    return pd.concat([matrix.assign(model=model) for matrix in points])[CROSS_USER_COLUMNS]
