"""Rule attention_train: one task of the attention study for one (model, attention): lr sweep, seeds, tests.
A kind of attention.split_kinds reads its sweep from its attention_lr jobs (input `swept`, one folder an lr)."""

import uph.job_start
from uph.artifacts import ATTENTION_LR_RUN
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.training import read_lr_jobs, run_cell
from uph.device import job_device, resolve_device
from uph.io import write_parquet
from uph.logs import rule_logging

from pathlib import Path

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    wildcards = snakemake.wildcards
    # the params leave out the lists the wildcards pick (rules/attention.smk): the job's task is its wildcard
    cfg = AttentionStudyConfig.from_config({**snakemake.params.attention, "tasks": [wildcards.task]})
    device = resolve_device(job_device(snakemake.rule, snakemake.config))
    folders = list(dict.fromkeys(Path(path).parent for path in snakemake.input.swept))  # the lrs' order
    swept = read_lr_jobs(
        [
            (
                ATTENTION_LR_RUN.read_parquet(folder / "curves.parquet"),
                ATTENTION_LR_RUN.read_parquet(folder / "sweep.parquet"),
                ATTENTION_LR_RUN.read_tensors(folder / "weights.safetensors"),
            )
            for folder in folders
        ]
    )
    cell = run_cell(
        cfg, wildcards.task, wildcards.model, wildcards.attention, device, log, swept=swept if folders else None
    )
    for frame, name in zip(cell, ("curves", "sweep", "evaluation"), strict=True):
        write_parquet(frame.reset_index(drop=True), snakemake.output[name])
