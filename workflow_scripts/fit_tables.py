"""Rule personalization_table: the study's LM tables from the per-user rows (uph.lm.tables), as CSV with
Markdown and LaTeX beside them (no timings: the tables are deterministic; wall time per job is in
results/benchmarks)."""

import json

import pandas as pd

from uph.io import write_table
from uph.lm.cache import check_unique_users
from uph.lm.tables import capacity_table, cross_user_table, dose_response_table, personalization_table
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    model = json.loads(open(snakemake.input.model).read())["name"]
    n_boot = snakemake.params.bootstrap
    fits = {path: pd.read_parquet(path) for path in snakemake.input.fits}
    check_unique_users(fits)
    choices = pd.read_parquet(snakemake.input.capacity)
    table = personalization_table(
        model,
        pd.concat(fits.values()),
        pd.read_parquet(snakemake.input.global_fit),
        pd.read_parquet(snakemake.input.others),
        choices,
        n_boot,
    )
    write_table(table, snakemake.output.personalization)
    log.info("personalization: %d rows", len(table))

    curves = capacity_table(model, pd.concat(map(pd.read_parquet, snakemake.input.validation)), choices)
    write_table(curves, snakemake.output.capacity)
    log.info("capacity: %d rows", len(curves))

    dose = dose_response_table(model, pd.concat(map(pd.read_parquet, snakemake.input.dose)), choices, n_boot)
    write_table(dose, snakemake.output.dose_response)
    log.info("dose_response: %d rows", len(dose))

    cross = cross_user_table(model, [pd.read_parquet(path) for path in snakemake.input.cross_user])
    write_table(cross, snakemake.output.cross_user)
    log.info("cross_user: %d rows", len(cross))
