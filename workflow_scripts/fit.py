"""Rule fit: every method's personal and residual arms at their chosen radii, the dose-response and the
cache baselines' arms, for the users of one fit job (each user's base distribution computed once), each refit warm
from its validation path's ball at the chosen radius."""

import uph.job_start
from uph.artifacts import FIT_FILE, check_fit_inputs, job_record, write_recorded
from uph.device import job_device
from uph.lm.jobs.fit_job import FitConfig, global_thetas, job_users, load_methods, read_cache_baselines
from uph.lm.jobs.refit import fit_users
from uph.lm.jobs.validate import warm_starts
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    thetas_g = global_thetas(FIT_FILE.read_tables(snakemake.input.global_fit, record))
    choices = FIT_FILE.read_table(snakemake.input.capacity, record)
    fit = FitConfig.from_config(snakemake.params.fit)
    users = job_users(snakemake.input.users, snakemake.wildcards.job, snakemake.params.jobs)
    job = load_methods(
        snakemake.input, fit, snakemake.params.cache, job_device(snakemake.rule, snakemake.config), users
    )
    log.info("%d users x %d methods x solvers %s", len(job.users), len(job.heads), fit.solvers)
    starts = warm_starts(FIT_FILE.read_table(snakemake.input.warm, record))
    log.info("%d warm starts from the validation paths", len(starts))
    fits, dose = fit_users(
        job, thetas_g, choices, read_cache_baselines(snakemake.input, record, job.device), fit, starts
    )
    write_recorded(fits, snakemake.output.fits, record)
    write_recorded(dose, snakemake.output.dose, record)
