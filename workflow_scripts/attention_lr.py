"""Rule attention_lr: one lr of a split kind's sweep (its runs on every seed of attention.seeds), read by the
cell's attention_train job."""

import uph.job_start
from uph.attention.study_config import AttentionStudyConfig
from uph.attention.training import train_lr
from uph.device import job_device, resolve_device
from uph.io import atomic_path, write_parquet
from uph.logs import rule_logging

import torch
from safetensors.torch import save_file

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    wildcards = snakemake.wildcards
    cfg = AttentionStudyConfig.from_config({**snakemake.params.attention, "tasks": [wildcards.task]})
    device = resolve_device(job_device(snakemake.rule, snakemake.config))
    lr = next(lr for lr in cfg.lrs if str(lr) == wildcards.lr)  # rules/common.smk names an lr by str()
    curves, sweep, weights = train_lr(cfg, wildcards.task, wildcards.model, wildcards.attention, lr, device, log)
    write_parquet(curves, snakemake.output.curves)
    write_parquet(sweep, snakemake.output.sweep)
    with atomic_path(snakemake.output.weights) as tmp:
        save_file({name: tensor.cpu().contiguous() for name, tensor in weights.items()}, tmp)
