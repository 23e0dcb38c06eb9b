"""Rule cross_user: every user's residual theta (on top of the global one) scored on every user's held-out
text, at one sweep point."""

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.heads import HeadSettings
from uph.lm.sweep import Point, cross_user, global_thetas, load_fit_job, residual_thetas
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    point = Point.of(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    solver = snakemake.params.solver
    residuals = residual_thetas(pd.concat(map(pd.read_parquet, snakemake.input.fits)))[(point, solver)]
    job = load_fit_job(
        snakemake.input,
        [point],
        HeadSettings.from_config(snakemake.params.heads),
        snakemake.params.cache,
        snakemake.params.device,
    )
    theta_g = global_thetas(pd.read_parquet(snakemake.input.global_fit))[(point, solver)]
    log.info("%s, solver %s: %d x %d cross-user scores", point.label, solver, len(residuals), len(job.users))
    table = cross_user(job, point, theta_g, residuals).assign(**point.columns, solver=solver)
    write_parquet(table, snakemake.output[0])
