"""Rule attention_train: one task of the attention study for one (model, attention): lr sweep, seeds, tests.
A kind of attention.split_kinds reads its sweep from its attention_lr jobs (input `swept`: curves, sweep and weights of each lr)."""

import uph.job_start
from uph.artifacts import ATTENTION_LR_RUN
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.training import read_lr_jobs, run_cell
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
    paths = list(snakemake.input.swept)  # three an lr, the lrs in order (rules/common.smk, attention_lr_jobs)
    jobs = [
        (
            ATTENTION_LR_RUN.read_parquet(curves),
            ATTENTION_LR_RUN.read_parquet(sweep),
            ATTENTION_LR_RUN.read_tensors(weights),
        )
        for curves, sweep, weights in zip(paths[0::3], paths[1::3], paths[2::3], strict=True)
    ]
    swept = read_lr_jobs(jobs) if jobs else None
    cell = run_cell(cfg, wildcards.task, wildcards.model, wildcards.attention, device, log, swept=swept)
    for frame, name in zip(cell, ("curves", "sweep", "evaluation"), strict=True):
        write_parquet(frame.reset_index(drop=True), snakemake.output[name])
