"""Rule personalization_table: the study's LM tables from the per-user rows (uph.lm.tables), as CSV with
Markdown and LaTeX beside them (no timings: the tables are deterministic; wall time per job is in
results/benchmarks)."""

import json

import pandas as pd

from uph.io import write_table
from uph.lm.cache import check_unique_users
from uph.lm.tables import cross_user_table, dose_response_table, personalization_table
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    model = json.loads(open(snakemake.input.model).read())["name"]
    n_boot = snakemake.params.bootstrap
    fits = {path: pd.read_parquet(path) for path in snakemake.input.fits}
    check_unique_users(fits)
    baselines = {path: pd.read_parquet(path) for path in snakemake.input.baselines}
    check_unique_users(baselines, keys=("baseline", "solver"))
    table = personalization_table(
        model,
        pd.concat(fits.values()),
        pd.read_parquet(snakemake.input.global_fit),
        pd.read_parquet(snakemake.input.others),
        pd.concat(baselines.values()),
        n_boot,
        snakemake.params.max_norm,
    )
    write_table(table, snakemake.output.personalization)
    log.info("personalization: %d rows", len(table))

    dose = dose_response_table(model, pd.concat(map(pd.read_parquet, snakemake.input.dose)), n_boot)
    write_table(dose, snakemake.output.dose_response)
    log.info("dose_response: %d rows", len(dose))

    cross = cross_user_table(model, [pd.read_parquet(path) for path in snakemake.input.cross_user])
    write_table(cross, snakemake.output.cross_user)
    log.info("cross_user: %d rows", len(cross))
