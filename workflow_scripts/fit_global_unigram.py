"""Rule fit_global_unigram: the pooled unigram's counts and its three arms' lambdas chosen on every user's
validation part (no rows when fit.baselines leaves the unigram out)."""

import uph.job_start
from uph.artifacts import job_record, write_recorded
from uph.device import job_device
from uph.lm.engine.baselines import UNIGRAM
from uph.lm.jobs.fit_job import FitConfig, load_fit_job
from uph.lm.jobs.global_fit import global_unigram
from uph.logs import rule_logging

import pandas as pd
import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    fit = FitConfig.from_config(snakemake.params.fit)
    unigram, validation = pd.DataFrame(), pd.DataFrame()
    if UNIGRAM in fit.baselines:
        job = load_fit_job(
            snakemake.input, [], fit.heads, snakemake.params.cache, job_device(snakemake.rule, snakemake.config)
        )
        unigram, validation = global_unigram(job, fit)
    else:
        log.info("fit.baselines leaves the unigram out: no rows")
    write_recorded(unigram, snakemake.output.unigram, record)
    write_recorded(validation, snakemake.output.validation, record)
