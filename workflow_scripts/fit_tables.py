"""Rule personalization_table: the sweep's summary per (head, alpha, d, solver, control) and the
cross-user matrix, as CSV with Markdown and LaTeX beside them. No timings: the tables are deterministic
(wall time per job is in results/benchmarks and provenance.json)."""

import json

import pandas as pd

from uph.io import write_table
from uph.lm.evaluate import summarize
from uph.logs import rule_logging

KEYS = ["head", "alpha", "d", "solver"]

with rule_logging(snakemake) as log:
    model = json.loads(open(snakemake.input.model).read())["name"]
    personal = pd.concat(map(pd.read_parquet, snakemake.input.fits)).assign(control="personal")
    controls = pd.concat(map(pd.read_parquet, snakemake.input.controls)).assign(control="global")
    rows = []
    for (control, *key), users in pd.concat([personal, controls]).groupby(["control", *KEYS], sort=True):
        point = dict(zip(KEYS, key))
        rows.append(
            {
                "model": model,
                **point,
                "control": control,
                **summarize(users, d=point["d"], n_boot=snakemake.params.bootstrap),
                "fit_objective": users["fit_objective"].mean(),
                "fit_certificate_max": users["fit_certificate"].max(),
            }
        )
    table = pd.DataFrame(rows).sort_values(
        ["control", "head", "alpha", "d", "solver"], ascending=[False, True, True, True, True]
    )
    write_table(table, snakemake.output.personalization)
    log.info("personalization: %d rows", len(table))

    columns = ["model", "head", "alpha", "d", "solver", "theta_user", "text_user", "base_nll", "nll", "delta_nll", "kl"]
    cross = [pd.read_parquet(path).assign(model=model) for path in snakemake.input.cross_user]
    cross = pd.concat(cross)[columns] if cross else pd.DataFrame(columns=columns)
    write_table(cross, snakemake.output.cross_user)
    log.info("cross_user: %d rows", len(cross))
