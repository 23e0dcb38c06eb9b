"""Rule fit_others: the 'others' control of every sweep point and solver, on one fit job's users' texts:
each user's held-out text of every method (the full bias too) scored with the global theta plus the mean of
the other users' residual thetas, and the heads on the unigram cache with the mean of the other users' cache
thetas (uph.lm.sweep.others)."""

import torch

from uph.artifacts import FIT_FILE, job_record, write_recorded
from uph.lm.sweep import FitConfig, global_thetas, job_users, load_methods, others, residual_thetas
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    fits = FIT_FILE.read_tables(snakemake.input.fits, record)
    residuals, caches = residual_thetas(fits), residual_thetas(fits, "theta_cache")
    thetas_g = global_thetas(FIT_FILE.read_tables(snakemake.input.global_fit, record))
    unigram = FIT_FILE.read_table(snakemake.input.unigram, record)
    fit = FitConfig.from_config(snakemake.params.fit)
    users = job_users(snakemake.input.users, snakemake.wildcards.job, snakemake.params.jobs)
    job = load_methods(snakemake.input, fit, snakemake.params.cache, snakemake.params.device, users)
    log.info("%d texts x %d points x solvers %s: the others control", len(job.users), len(job.heads), fit.solvers)
    table = others(job, thetas_g, residuals, caches, None if unigram.empty else unigram)
    write_recorded(table, snakemake.output[0], record)
