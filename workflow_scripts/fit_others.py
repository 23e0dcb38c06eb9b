"""Rule fit_others: the 'others' control of every sweep point and solver: each user's held-out text
of every method (the full bias too) scored with the global theta plus the mean of the other users' residual
thetas, and the heads on the unigram cache with the mean of the other users' cache thetas (uph.lm.sweep.others)."""

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import FitConfig, global_thetas, load_methods, others, residual_thetas
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_methods(snakemake.input, fit, snakemake.params.cache, snakemake.params.device)
    fits = pd.concat(map(pd.read_parquet, snakemake.input.fits))
    residuals, caches = residual_thetas(fits), residual_thetas(fits, "theta_cache")
    log.info("%d users x %d points x solvers %s: the others control", len(job.users), len(job.heads), fit.solvers)
    thetas_g = global_thetas(pd.read_parquet(snakemake.input.global_fit))
    unigram = pd.read_parquet(snakemake.input.unigram)
    write_parquet(others(job, thetas_g, residuals, caches, None if unigram.empty else unigram), snakemake.output[0])
