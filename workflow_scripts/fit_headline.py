"""Rule headline_point: the point the summary reports, the best own-against-others gain, picked from the fits
and the others control as the report picks it (uph.report.study.best_beyond_global); `listed` when
fit.cross_user lists it already, so its cross_user_headline blocks write no rows."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record, write_recorded
from uph.lm.jobs.choices import Point
from uph.lm.jobs.tables import personalization_table, read_in_user_order
from uph.logs import rule_logging
from uph.report.study import best_beyond_global

import json

import pandas as pd

with rule_logging(snakemake) as log:
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    table = personalization_table(
        json.loads(open(snakemake.input.model).read())["name"],
        read_in_user_order(snakemake.input.fits, record),  # as the table job reads them: the same pick
        FIT_FILE.read_tables(snakemake.input.global_fit, record),
        read_in_user_order(snakemake.input.others, record),
        FIT_FILE.read_table(snakemake.input.capacity, record),
        snakemake.params.bootstrap,
    )
    best, points = best_beyond_global(table)
    point, solver = Point.of(best["head"], best["alpha"], best["d"]), best["solver"]
    listed = {(Point.of(p["head"], p["alpha"], p["d"]), p["solver"]) for p in snakemake.params.listed}
    log.info(
        "the headline point: %s, solver %s (the best own-vs-others gain of %d points)", point.label, solver, points
    )
    headline = pd.DataFrame([{**point.columns, "solver": solver, "listed": (point, solver) in listed}])
    write_recorded(headline, snakemake.output[0], record)
