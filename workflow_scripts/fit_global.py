"""Rule fit_global: the global theta of one method (a head's points, or the full bias) and every solver at
its radius chosen on validation, on all users' train tokens pooled, with the validation rows it chose from."""

import uph.job_start
from uph.artifacts import job_record, write_recorded
from uph.device import job_device
from uph.lm.jobs.fit_job import FitConfig, load_methods
from uph.lm.jobs.global_fit import fit_global
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    fit = FitConfig.from_config(snakemake.params.fit)
    method = snakemake.wildcards.method
    job = load_methods(
        snakemake.input, fit, snakemake.params.cache, job_device(snakemake.rule, snakemake.config), method=method
    )
    log.info("%s: %d points x solvers %s on %d users", method, len(job.heads), fit.solvers, len(job.users))
    thetas, validation = fit_global(job, fit)
    write_recorded(thetas, snakemake.output.thetas, record)
    write_recorded(validation, snakemake.output.validation, record)
