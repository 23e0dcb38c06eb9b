"""Rules cross_user and cross_user_headline: one block of the cross-user matrix at one sweep point: every
user's residual theta (on top of the global one) scored on the held-out text of one fit job's users. The
point is a point of fit.cross_user (rule cross_user), or the point the summary reports (cross_user_headline:
headline_point's pick; no rows when fit.cross_user lists that point already). The table job gathers the
blocks."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record, write_recorded
from uph.device import job_device
from uph.lm.engine.heads import HeadSettings
from uph.lm.jobs.choices import Point
from uph.lm.jobs.controls import cross_user, residual_thetas
from uph.lm.jobs.fit_job import global_thetas, job_users, load_fit_job
from uph.logs import rule_logging

import pandas as pd
import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.heads, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    if "headline" in snakemake.input.keys():
        pick = FIT_FILE.read_table(snakemake.input.headline, record).iloc[0]
        point, solver, listed = Point.of(pick["head"], pick["alpha"], pick["d"]), pick["solver"], bool(pick["listed"])
    else:
        point = Point.of(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
        solver, listed = snakemake.params.solver, False
    if listed:
        log.info("fit.cross_user lists %s, solver %s: its cross_user jobs score it", point.label, solver)
        table = pd.DataFrame(columns=["theta_user", "text_user", "base_nll", "global_nll", "nll", "delta_nll"])
    else:
        residuals = residual_thetas(FIT_FILE.read_tables(snakemake.input.fits, record))[(point, solver)]
        theta_g = global_thetas(FIT_FILE.read_tables(snakemake.input.global_fit, record))[(point, solver)]
        users = job_users(snakemake.input.users, snakemake.wildcards.job, snakemake.params.jobs)
        settings = HeadSettings.from_config(snakemake.params.heads)
        job = load_fit_job(
            snakemake.input,
            [point],
            settings,
            snakemake.params.cache,
            job_device(snakemake.rule, snakemake.config),
            users,
        )
        log.info("%s, solver %s: %d x %d cross-user scores", point.label, solver, len(residuals), len(job.users))
        table = cross_user(job, point, theta_g, residuals)
    write_recorded(table.assign(**point.columns, solver=solver), snakemake.output[0], record)
