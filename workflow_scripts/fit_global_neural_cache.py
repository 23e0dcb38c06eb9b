"""Rule fit_global_neural_cache: the pooled datastore of the neural cache and its three arms' temperature
and lambda chosen on every user's validation part (no rows when fit.baselines leaves it out)."""

import uph.job_start
from uph.artifacts import job_record, write_recorded
from uph.device import job_device
from uph.lm.engine.baselines import NEURAL_CACHE
from uph.lm.jobs.fit_job import FitConfig, load_fit_job
from uph.lm.jobs.global_fit import global_neural_cache
from uph.logs import rule_logging

import pandas as pd
import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    fit = FitConfig.from_config(snakemake.params.fit)
    settings, datastore, validation = pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    if NEURAL_CACHE in fit.baselines:
        job = load_fit_job(
            snakemake.input, [], fit.heads, snakemake.params.cache, job_device(snakemake.rule, snakemake.config)
        )
        settings, datastore, validation = global_neural_cache(job, fit)
        log.info("chosen: %s", settings.iloc[0].to_dict())
    else:
        log.info("fit.baselines leaves the neural cache out: no rows")
    write_recorded(settings, snakemake.output.settings, record)
    write_recorded(datastore, snakemake.output.datastore, record)
    write_recorded(validation, snakemake.output.validation, record)
