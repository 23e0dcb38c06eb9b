"""Rules cross_user and cross_user_headline: every user's residual theta (on top of the global one) scored on
every user's held-out text, at one sweep point: a point of fit.cross_user (rule cross_user), or the point the
summary reports (cross_user_headline: the best own-against-others gain, picked from the fits and the others
control as the report picks it; no rows when fit.cross_user lists that point already)."""

import json

import pandas as pd
import torch

from uph.artifacts import FIT_FILE, job_record, write_recorded
from uph.lm.heads import HeadSettings
from uph.lm.sweep import Point, cross_user, global_thetas, load_fit_job, residual_thetas
from uph.lm.tables import personalization_table
from uph.logs import rule_logging
from uph.report.study import best_beyond_global

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    headline = "others" in snakemake.input.keys()
    fit_keys = snakemake.params.fit if headline else snakemake.params.heads
    record = job_record(snakemake.input.model, fit=fit_keys, extract=snakemake.params.cache)
    fits = FIT_FILE.read_tables(snakemake.input.fits, record)
    global_fit = FIT_FILE.read_table(snakemake.input.global_fit, record)
    if headline:
        table = personalization_table(
            json.loads(open(snakemake.input.model).read())["name"],
            fits,
            global_fit,
            FIT_FILE.read_table(snakemake.input.others, record),
            FIT_FILE.read_table(snakemake.input.capacity, record),
            snakemake.params.bootstrap,
        )
        best, points = best_beyond_global(table)
        point, solver = Point.of(best["head"], best["alpha"], best["d"]), best["solver"]
        listed = {(Point.of(p["head"], p["alpha"], p["d"]), p["solver"]) for p in snakemake.params.listed}
        log.info(
            "the headline point: %s, solver %s (the best own-vs-others gain of %d points)", point.label, solver, points
        )
    else:
        point = Point.of(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
        solver, listed = snakemake.params.solver, set()
    if (point, solver) in listed:
        log.info("fit.cross_user lists %s, solver %s: its cross_user job scores it", point.label, solver)
        table = pd.DataFrame(columns=["theta_user", "text_user", "base_nll", "global_nll", "nll", "delta_nll"])
    else:
        residuals = residual_thetas(fits)[(point, solver)]
        theta_g = global_thetas(global_fit)[(point, solver)]
        job = load_fit_job(
            snakemake.input,
            [point],
            HeadSettings.from_config(fit_keys),
            snakemake.params.cache,
            snakemake.params.device,
        )
        log.info("%s, solver %s: %d x %d cross-user scores", point.label, solver, len(residuals), len(job.users))
        table = cross_user(job, point, theta_g, residuals)
    write_recorded(table.assign(**point.columns, solver=solver), snakemake.output[0], record)
