"""Rule attention_train: one task of the attention study for one (model, attention): lr sweep, seeds, tests."""

import uph.job_start
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.training import run_cell
from uph.device import job_device, resolve_device
from uph.io import write_parquet
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    wildcards = snakemake.wildcards
    # the params leave out the lists the wildcards pick (rules/attention.smk): the job's task is its wildcard
    cfg = AttentionStudyConfig.from_config({**snakemake.params.attention, "tasks": [wildcards.task]})
    device = resolve_device(job_device(snakemake.rule, snakemake.config))
    cell = run_cell(cfg, wildcards.task, wildcards.model, wildcards.attention, device, log)
    for frame, name in zip(cell, ("curves", "sweep", "evaluation"), strict=True):
        write_parquet(frame.reset_index(drop=True), snakemake.output[name])
