"""Rule fit_global: the global theta of every method and solver at its radius chosen on validation, on all
users' train tokens pooled, with the validation rows it chose from and the pooled unigram."""

import torch

from uph.artifacts import job_record, write_recorded
from uph.lm.sweep import FitConfig, fit_global, load_methods
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    fit = FitConfig.from_config(snakemake.params.fit)
    job = load_methods(snakemake.input, fit, snakemake.params.cache, snakemake.params.device)
    thetas, validation, unigram = fit_global(job, fit)
    for table, path in zip((thetas, validation, unigram), snakemake.output):
        write_recorded(table, path, record)
