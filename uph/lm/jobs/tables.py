"""The personalization study's tables from the fit jobs' per-user rows (rule personalization_table).

personalization: per method (head, alpha, d; the baselines full_bias, unigram and neural_cache with no
alpha, d) and
solver, the arms on the users' held-out text, each uph.stats.compare of per-user NLLs (paired bootstrap
interval, users improved, sign test), each at its capacity chosen on validation (uph.lm.engine.capacity):

    global            nll(theta_g)          against base_nll
    personal          nll(theta_u)          against base_nll
    global+personal   nll(theta_g + theta_r) against nll(theta_g)   (the gain beyond global)
    others            nll(theta_g + mean of the other users' theta_r) against nll(theta_g)
    own vs others     nll(theta_g + theta_r) against the others' nll (the personal gain: the own
                      residual against the same capacity fitted on everyone else)
    cache+head        the head fitted on the unigram residual arm's mixture, against that mixture alone
                      (fit.on_cache: does a rank-d head add anything to a cache?)
    cache others      the mean of the other users' cache thetas on the user's mixture, against the mixture
    cache own vs others  the own cache theta against the others' (is what a head adds to a cache personal?)
    neural cache+head, neural cache others, neural cache own vs others: the same on the neural cache

The cache baselines' arms are the pooled, the personal and the personal-on-pooled cache (uph.lm.
baselines, uph.lm.engine.neural_cache); the neural cache's others control is its residual arm with a store of
the same size drawn from the other users'. Each arm's row has its chosen `capacity` (radius, or lambda;
the neural cache's `temperature` beside it), `at_edge` and the share of users whose theta lies on its
ball; `params_per_user` is the mean over users (the neural cache stores a user's every train state). capacity: every validation curve, its chosen point marked.
dose_response: the gain beyond global of residuals fitted on each user's first k train tokens at the
radius chosen for k, the all-tokens rows standing at their mean count. cross_user: every residual theta
on every user's text, as the cross_user jobs scored them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from uph.artifacts import FIT_FILE
from uph.errors import CacheError
from uph.lm.engine.capacity import chosen_row, on_ball
from uph.stats import COMPARISON_COLUMNS, compare

KEYS = ["head", "alpha", "d", "solver"]
BASELINES = ("full_bias", "unigram", "neural_cache")  # rows with no alpha, d: the baselines, not prior heads
ARMS = (  # control, its arm (uph.lm.engine.capacity), held-out NLL, the reference it is compared with, its KL column
    ("global", "global", "global_nll", "base_nll", "global_kl"),
    ("personal", "personal", "personal_nll", "base_nll", "personal_kl"),
    ("global+personal", "residual", "residual_nll", "global_nll", "residual_kl"),
)
OTHERS = (  # control, its held-out NLL, the reference: the comparisons that read the others control
    ("others", "others_nll", "global_nll"),
    ("own vs others", "residual_nll", "others_nll"),
)
CACHE_CONTROLS = {"cache": "cache", "neural_cache": "neural cache"}  # a cache's column prefix: its rows' name


def cache_others(prefix: str) -> tuple:
    """The others comparisons of the heads on a cache (fit.on_cache), as OTHERS."""
    name = CACHE_CONTROLS[prefix]
    return (
        (f"{name} others", f"{prefix}_others_nll", f"{prefix}_nll"),
        (f"{name} own vs others", f"{prefix}_head_nll", f"{prefix}_others_nll"),
    )


DOSE_RESPONSE_COLUMNS = [
    "model",
    *KEYS,
    "train_tokens",
    "all_train_tokens",
    "radius",
    "at_edge",
    *COMPARISON_COLUMNS,
]
CROSS_USER_COLUMNS = ["model", *KEYS, "theta_user", "text_user", "base_nll", "global_nll", "nll", "delta_nll"]


def _comparison(model: str, point: dict, users: pd.DataFrame, control: str, arm: str, reference: str, n_boot: int):
    """A row's comparison columns: the users' `arm` NLL against their `reference` NLL (uph.stats.compare)."""
    return {
        "model": model,
        **point,
        "control": control,
        "reference": reference.removesuffix("_nll"),
        **compare(users[arm], users[reference], n_boot=n_boot),
    }


def _fitted(users: pd.DataFrame, global_fit: pd.Series | None, arm: str, radius: float) -> dict:
    """An arm's fit columns: objective, worst certificate, share of thetas on the ball of `radius` (NaN
    for the unigram, which fits no theta)."""
    if arm == "global":
        if global_fit is None:
            return {"fit_objective": np.nan, "fit_certificate_max": np.nan, "frac_on_ball": np.nan}
        return {
            "fit_objective": global_fit["fit_objective"],
            "fit_certificate_max": global_fit["fit_certificate"],
            "frac_on_ball": float(on_ball(global_fit["fit_theta_norm"], radius)),
        }
    if f"{arm}_objective" not in users or users[f"{arm}_objective"].isna().all():
        return {"fit_objective": np.nan, "fit_certificate_max": np.nan, "frac_on_ball": np.nan}
    return {
        "fit_objective": users[f"{arm}_objective"].mean(),
        "fit_certificate_max": users[f"{arm}_certificate"].max(),
        "frac_on_ball": float(on_ball(users[f"{arm}_theta_norm"], radius).mean()),
    }


def personalization_table(
    model: str, fits: pd.DataFrame, global_fits: pd.DataFrame, others: pd.DataFrame, choices: pd.DataFrame, n_boot: int
) -> pd.DataFrame:
    """`fits`: the fit jobs' per-(user, method, solver) rows; `global_fits`: fit_global's rows; `others`:
    fit_others' per-(user, method, solver) others_nll (no rows with one user: no others controls);
    `choices`: the capacity job's choices (uph.lm.engine.capacity)."""
    global_fits = global_fits.set_index(KEYS)
    fits = fits.assign(others_nll=np.nan) if others.empty else fits.merge(others, on=[*KEYS, "user"], how="left")
    rows = []
    for key, users in fits.groupby(KEYS, sort=True, dropna=False):
        method = dict(zip(KEYS, key))
        baseline = method["head"] in BASELINES
        shown = {**method, "alpha": np.nan, "d": np.nan} if baseline else method
        params = round(users["params_per_user"].mean())
        global_fit = global_fits.loc[key] if key in global_fits.index else None  # the caches fit no theta
        for control, arm, nll, reference, kl in ARMS:
            choice = chosen_row(choices, **method, arm=arm, train_tokens=np.nan)
            rows.append(
                {
                    **_comparison(model, shown, users, control, nll, reference, n_boot),
                    "params_per_user": params,
                    "capacity": choice["capacity"],
                    "temperature": choice.get("temperature", np.nan),
                    "at_edge": choice["at_edge"],
                    "kl": users[kl].mean() if kl in users else np.nan,
                    **_fitted(users, global_fit, arm, choice["capacity"]),
                    "sum_theta_norm": users["sum_theta_norm"].mean()
                    if arm == "residual" and "sum_theta_norm" in users
                    else np.nan,
                }
            )
        if users["others_nll"].notna().all():
            rows += [
                {**_comparison(model, shown, users, *control, n_boot), "params_per_user": params} for control in OTHERS
            ]
        for prefix, name in CACHE_CONTROLS.items():  # fit.on_cache
            if f"{prefix}_head_nll" not in users or users[f"{prefix}_head_nll"].isna().any():
                continue
            choice = chosen_row(choices, **method, arm=prefix, train_tokens=np.nan)
            rows.append(
                {
                    **_comparison(model, shown, users, f"{name}+head", f"{prefix}_head_nll", f"{prefix}_nll", n_boot),
                    "params_per_user": params,
                    "capacity": choice["capacity"],
                    "at_edge": choice["at_edge"],
                    **_fitted(users, None, prefix, choice["capacity"]),
                }
            )
            if f"{prefix}_others_nll" in users and users[f"{prefix}_others_nll"].notna().all():
                rows += [
                    {**_comparison(model, shown, users, *control, n_boot), "params_per_user": params}
                    for control in cache_others(prefix)
                ]
    return pd.DataFrame(rows)


def capacity_table(model: str, validation: pd.DataFrame, choices: pd.DataFrame) -> pd.DataFrame:
    """Every validation curve: per (method, arm, train_tokens, temperature, capacity) the mean validation NLL over the
    users, the share of their thetas on the ball, and whether it is the chosen point (at a grid edge?)."""
    keys = [*KEYS, "arm", "train_tokens", "temperature"]
    if "temperature" not in validation:
        validation = validation.assign(temperature=np.nan)
    curves = (
        validation.assign(
            on_ball=on_ball(validation["theta_norm"], validation["capacity"]) if "theta_norm" in validation else np.nan
        )
        .groupby([*keys, "capacity"], dropna=False, sort=True)
        .agg(validation_nll=("validation_nll", "mean"), n_users=("user", "nunique"), frac_on_ball=("on_ball", "mean"))
        .reset_index()
    )
    picked = choices[[*keys, "capacity", "at_edge"]].assign(chosen=True)
    table = curves.merge(picked, on=[*keys, "capacity"], how="left")
    table["chosen"] = table["chosen"].fillna(False).astype(bool)
    table["at_edge"] = table["at_edge"].fillna("")
    return table.assign(model=model)[
        ["model", *keys, "capacity", "validation_nll", "n_users", "frac_on_ball", "chosen", "at_edge"]
    ]


def dose_response_table(model: str, dose: pd.DataFrame, choices: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    """Per (point, solver, train size): the residual against the global theta over the users, at the
    radius chosen for that size (`at_edge` from `choices`). The rows that use all of each user's train
    tokens stand at their mean count. No dose-response point: no rows, every column."""
    if dose.empty:
        return pd.DataFrame(columns=DOSE_RESPONSE_COLUMNS)
    mean_count = dose.groupby([*KEYS, "all_train_tokens"])["train_tokens"].transform("mean")
    sizes = dose["train_tokens"].where(~dose["all_train_tokens"])  # NaN: all train tokens, as choices key it
    dose = dose.assign(train_tokens=mean_count.where(dose["all_train_tokens"], dose["train_tokens"]), size=sizes)
    rows = []
    for (*key, train_tokens, everything), users in dose.groupby([*KEYS, "train_tokens", "all_train_tokens"]):
        method = dict(zip(KEYS, key))
        choice = chosen_row(choices, **method, arm="residual", train_tokens=users["size"].iloc[0])
        rows.append(
            {
                "model": model,
                **method,
                "train_tokens": train_tokens,
                "all_train_tokens": everything,
                "radius": choice["capacity"],
                "at_edge": choice["at_edge"],
                **compare(users["residual_nll"], users["global_nll"], n_boot=n_boot),
            }
        )
    return pd.DataFrame(rows)[DOSE_RESPONSE_COLUMNS]


def in_user_order(rows: pd.DataFrame, user: str = "user") -> pd.DataFrame:
    """The rows gathered from the fit jobs, in user order (each user's rows in the order its job wrote
    them): what the tables compute (means, bootstrap resamples) reads the users alike whatever the cut."""
    return rows.sort_values(user, kind="stable", ignore_index=True) if user in rows else rows


def read_in_user_order(paths, record: dict) -> pd.DataFrame:
    """The fit jobs' files `paths` (checked against `record`), gathered in user order (in_user_order)."""
    return in_user_order(FIT_FILE.read_tables(paths, record))


def cross_user_table(model: str, blocks: list[pd.DataFrame]) -> pd.DataFrame:
    """The cross_user jobs' blocks (a block: one point, one fit job's texts, every theta; the headline's
    have no rows when a listed point is the headline) as one table, by point and text user; no rows at
    all: every column."""
    blocks = [block for block in blocks if not block.empty]
    if not blocks:
        return pd.DataFrame(columns=CROSS_USER_COLUMNS)
    matrix = pd.concat([block.assign(model=model) for block in blocks], ignore_index=True)
    return matrix.sort_values(["head", "alpha", "d", "solver", "text_user"], kind="stable")[CROSS_USER_COLUMNS]


def check_unique_users(tables: dict, keys=("head", "alpha", "d", "solver"), user: str = "user") -> None:
    """`tables`: file -> its rows (pandas). A user must appear in at most one file at each `keys`;
    twice means a cache shard was copied over another, and its fits would count the user twice. Every pair
    of files that share users is named in one error (with its first such user), so one round of deleting
    them is enough."""
    seen: dict[tuple, str] = {}
    pairs: dict[tuple[str, str], str] = {}  # (first file, second file) -> the first user both hold, where
    for path, rows in tables.items():
        if rows.empty:  # a shard the hash left without users
            continue
        for row in rows[[*keys, user]].drop_duplicates().itertuples(index=False):
            first = seen.setdefault(row, path)
            if first != path and (first, path) not in pairs:
                where = " ".join(f"{k}={v}" for k, v in zip(keys, row))
                pairs[first, path] = f"user {row[-1]!r} is in both '{first}' and '{path}' ({where})"
    if pairs:
        fix = "delete both" if len(pairs) == 1 else "delete them"
        raise CacheError(
            f"{'; '.join(pairs.values())}: results of one shard were copied over another; {fix} and run snakemake again"
        )
