"""Rule fit_others: the 'others' control of every sweep point and solver, on one fit job's users' texts:
each user's held-out text of every method (the full bias too) scored with the global theta plus the mean of
the other users' residual thetas, the heads on a cache with the mean of the other users' thetas on it, and
the neural cache with a store of the same size drawn from the other users' (uph.lm.jobs.controls.others)."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record, write_recorded
from uph.device import job_device
from uph.lm.jobs.controls import others, residual_thetas
from uph.lm.jobs.fit_job import CACHES, FitConfig, global_thetas, job_users, load_methods, read_cache_baselines
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    fits = FIT_FILE.read_tables(snakemake.input.fits, record)
    residuals = residual_thetas(fits)
    cache_thetas = {cache: residual_thetas(fits, f"theta_{prefix}") for cache, prefix in CACHES.items()}
    thetas_g = global_thetas(FIT_FILE.read_tables(snakemake.input.global_fit, record))
    fit = FitConfig.from_config(snakemake.params.fit)
    users = job_users(snakemake.input.users, snakemake.wildcards.job, snakemake.params.jobs)
    job = load_methods(
        snakemake.input, fit, snakemake.params.cache, job_device(snakemake.rule, snakemake.config), users
    )
    log.info("%d texts x %d points x solvers %s: the others control", len(job.users), len(job.heads), fit.solvers)
    table = others(job, thetas_g, residuals, cache_thetas, read_cache_baselines(snakemake.input, record, job.device))
    write_recorded(table, snakemake.output[0], record)
