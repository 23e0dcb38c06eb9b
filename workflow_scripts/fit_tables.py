"""Rule personalization_table: the study's LM tables from the per-user rows, as CSV with Markdown and LaTeX
beside them (no timings: the tables are deterministic; wall time per job is in results/benchmarks).

personalization: per (head, alpha, d, solver) three comparisons on the users' held-out text (global vs
base, personal vs base, global + personal vs global), then the baselines' rows; dose_response: the gain
beyond global against the train tokens of the residual fit; cross_user: the residual thetas' matrix."""

import json

import numpy as np
import pandas as pd

from uph.io import write_table
from uph.lm.cache import check_unique_users
from uph.logs import rule_logging
from uph.stats import compare

KEYS = ["head", "alpha", "d", "solver"]
ARMS = (  # control, its held-out NLL, the reference it is compared with, its KL column, its fit columns' prefix
    ("global", "global_nll", "base_nll", "global_kl", None),
    ("personal", "personal_nll", "base_nll", "personal_kl", "personal"),
    ("global+personal", "residual_nll", "global_nll", "residual_kl", "residual"),
)


with rule_logging(snakemake) as log:
    model = json.loads(open(snakemake.input.model).read())["name"]
    n_boot = snakemake.params.bootstrap
    fits = {path: pd.read_parquet(path) for path in snakemake.input.fits}
    check_unique_users(fits)
    fits = pd.concat(fits.values())
    global_fits = pd.read_parquet(snakemake.input.global_fit).set_index(KEYS)
    rows = []
    for key, users in fits.groupby(KEYS, sort=True):
        point = dict(zip(KEYS, key))
        for control, arm, reference, kl, prefix in ARMS:
            fitted = global_fits.loc[key] if prefix is None else None
            rows.append(
                {
                    "model": model,
                    **point,
                    "control": control,
                    "reference": reference.removesuffix("_nll"),
                    **compare(users[arm], users[reference], n_boot=n_boot),
                    "params_per_user": point["d"],
                    "kl": users[kl].mean(),
                    "fit_objective": fitted["fit_objective"] if prefix is None else users[f"{prefix}_objective"].mean(),
                    "fit_certificate_max": (
                        fitted["fit_certificate"] if prefix is None else users[f"{prefix}_certificate"].max()
                    ),
                }
            )
    baselines = {path: pd.read_parquet(path) for path in snakemake.input.baselines}
    check_unique_users(baselines, keys=("baseline", "solver"))
    baselines = pd.concat(baselines.values())
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
            }
        )
    table = pd.DataFrame(rows)
    write_table(table, snakemake.output.personalization)
    log.info("personalization: %d rows", len(table))

    dose = pd.concat(map(pd.read_parquet, snakemake.input.dose))
    # the rows that use all of each user's train tokens stand at their mean count
    mean_count = dose.groupby([*KEYS, "all_train_tokens"])["train_tokens"].transform("mean")
    dose["train_tokens"] = mean_count.where(dose["all_train_tokens"], dose["train_tokens"])
    dose_table = pd.DataFrame(
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
    write_table(dose_table, snakemake.output.dose_response)
    log.info("dose_response: %d rows", len(dose_table))

    columns = ["model", *KEYS, "theta_user", "text_user", "base_nll", "global_nll", "nll", "delta_nll"]
    cross = [pd.read_parquet(path).assign(model=model) for path in snakemake.input.cross_user]
    cross = pd.concat(cross)[columns] if cross else pd.DataFrame(columns=columns)
    write_table(cross, snakemake.output.cross_user)
    log.info("cross_user: %d rows", len(cross))
