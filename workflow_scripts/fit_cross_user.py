"""Rule cross_user: every user's residual theta (on top of the global one) scored on every user's held-out
text, at one sweep point."""

import torch

from uph.artifacts import FIT_FILE, job_record, write_recorded
from uph.lm.heads import HeadSettings
from uph.lm.sweep import Point, cross_user, global_thetas, load_fit_job, residual_thetas
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.heads, extract=snakemake.params.cache)
    point = Point.of(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    solver = snakemake.params.solver
    residuals = residual_thetas(FIT_FILE.read_tables(snakemake.input.fits, record))[(point, solver)]
    theta_g = global_thetas(FIT_FILE.read_table(snakemake.input.global_fit, record))[(point, solver)]
    job = load_fit_job(
        snakemake.input,
        [point],
        HeadSettings.from_config(snakemake.params.heads),
        snakemake.params.cache,
        snakemake.params.device,
    )
    log.info("%s, solver %s: %d x %d cross-user scores", point.label, solver, len(residuals), len(job.users))
    table = cross_user(job, point, theta_g, residuals).assign(**point.columns, solver=solver)
    write_recorded(table, snakemake.output[0], record)
