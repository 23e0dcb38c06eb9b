"""Rule fit_global: the global theta of every sweep point and solver, on all users' train tokens pooled."""

import torch

from uph.io import write_parquet
from uph.lm.sweep import FitConfig, fit_global, load_fit_job
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_fit_job(snakemake.input, fit.points, fit.heads, snakemake.params.cache, snakemake.params.device)
    write_parquet(fit_global(job, fit), snakemake.output[0])
