"""Rule validate: the personal and residual paths of radii of every method and solver (and of the heads
on a cache, fit.on_cache) on the fit parts of one fit job's users, scored on their validation parts, with every ball's
warm start for the fit job's refits (uph.lm.jobs.validate.warm_starts)."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record, write_recorded
from uph.device import job_device
from uph.lm.jobs.fit_job import FitConfig, global_thetas, job_users, load_methods, read_cache_baselines
from uph.lm.jobs.validate import validate_users
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    thetas_g_fit = global_thetas(FIT_FILE.read_tables(snakemake.input.global_fit, record), "theta_fit")
    fit = FitConfig.from_config(snakemake.params.fit)
    users = job_users(snakemake.input.users, snakemake.wildcards.job, snakemake.params.jobs)
    job = load_methods(
        snakemake.input, fit, snakemake.params.cache, job_device(snakemake.rule, snakemake.config), users
    )
    log.info(
        "%d users x %d methods x solvers %s, radii %s", len(job.users), len(job.heads), fit.solvers, fit.capacity.radii
    )
    validation, warm = validate_users(job, thetas_g_fit, read_cache_baselines(snakemake.input, record, job.device), fit)
    write_recorded(validation, snakemake.output.validation, record)
    write_recorded(warm, snakemake.output.warm, record)
