"""Rule fit: every method's personal and residual arms at their chosen radii, the dose-response and the
unigram arms, for the users of one cache shard (each user's base distribution computed once)."""

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import FitConfig, fit_shard, global_thetas, load_methods
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_methods(snakemake.input, fit, snakemake.params.cache, snakemake.params.device, [snakemake.input.shard])
    log.info("%d users x %d methods x solvers %s", len(job.users), len(job.heads), fit.solvers)
    thetas_g = global_thetas(pd.read_parquet(snakemake.input.global_fit))
    choices = pd.read_parquet(snakemake.input.capacity)
    unigram = pd.read_parquet(snakemake.input.unigram)
    fits, dose = fit_shard(job, thetas_g, choices, None if unigram.empty else unigram, fit)
    write_parquet(fits, snakemake.output.fits)
    write_parquet(dose, snakemake.output.dose)
