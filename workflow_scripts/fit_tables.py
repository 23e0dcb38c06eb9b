"""Rule personalization_table: the study's LM tables from the per-user rows (uph.lm.jobs.tables), as CSV with
Markdown and LaTeX beside them (no timings: the tables are deterministic; wall time per job is in
results/benchmarks)."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record
from uph.io import write_table
from uph.lm.jobs.tables import (
    capacity_table,
    check_unique_users,
    cross_user_table,
    dose_response_table,
    in_user_order,
    personalization_table,
    read_in_user_order,
)
from uph.logs import rule_logging

import json

import pandas as pd

with rule_logging(snakemake) as log:
    model = json.loads(open(snakemake.input.model).read())["name"]
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    n_boot = snakemake.params.bootstrap
    fits = {path: FIT_FILE.read_table(path, record) for path in snakemake.input.fits}
    check_unique_users(fits)
    choices = FIT_FILE.read_table(snakemake.input.capacity, record)
    table = personalization_table(
        model,
        in_user_order(pd.concat(fits.values())),
        FIT_FILE.read_tables(snakemake.input.global_fit, record),
        read_in_user_order(snakemake.input.others, record),
        choices,
        n_boot,
    )
    write_table(table, snakemake.output.personalization)
    log.info("personalization: %d rows", len(table))

    curves = capacity_table(model, read_in_user_order(snakemake.input.validation, record), choices)
    write_table(curves, snakemake.output.capacity)
    log.info("capacity: %d rows", len(curves))

    dose = dose_response_table(model, read_in_user_order(snakemake.input.dose, record), choices, n_boot)
    write_table(dose, snakemake.output.dose_response)
    log.info("dose_response: %d rows", len(dose))

    blocks = [FIT_FILE.read_table(path, record) for path in snakemake.input.cross_user]
    cross = cross_user_table(model, blocks)
    write_table(cross, snakemake.output.cross_user)
    log.info("cross_user: %d rows", len(cross))
