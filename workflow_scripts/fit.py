"""Rule fit: the personal and residual arms of every sweep point and solver, the dose-response and the
baselines, for the users of one cache shard (each user's base distribution computed once)."""

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import FitConfig, fit_shard, global_thetas, load_fit_job
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_fit_job(
        snakemake.input,
        fit.points,
        fit.heads,
        snakemake.params.cache,
        snakemake.params.device,
        [snakemake.input.shard],
    )
    log.info("%d users x %d points x solvers %s", len(job.users), len(job.heads), fit.solvers)
    thetas_g = global_thetas(pd.read_parquet(snakemake.input.global_fit))
    tables = fit_shard(job, thetas_g, fit)
    for table, path in zip(tables, (snakemake.output.fits, snakemake.output.dose, snakemake.output.baselines)):
        write_parquet(table, path)
