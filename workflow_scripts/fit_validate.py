"""Rule validate: the personal and residual paths of radii of every method and solver (and the unigram
arms' lambdas) on the fit parts of one cache shard's users, scored on their validation parts."""

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import FitConfig, global_thetas, load_methods, validate_shard
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_methods(snakemake.input, fit, snakemake.params.cache, snakemake.params.device, [snakemake.input.shard])
    log.info(
        "%d users x %d methods x solvers %s, radii %s", len(job.users), len(job.heads), fit.solvers, fit.capacity.radii
    )
    thetas_g_fit = global_thetas(pd.read_parquet(snakemake.input.global_fit), "theta_fit")
    unigram = pd.read_parquet(snakemake.input.unigram)
    write_parquet(validate_shard(job, thetas_g_fit, None if unigram.empty else unigram, fit), snakemake.output[0])
