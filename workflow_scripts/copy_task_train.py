"""Rule copy_task_train: seed 004's one-layer model on the copy task, for one (attention, seed)."""

import uph.job_start
from uph.attention.copy_task import CopyTaskConfig, train
from uph.device import job_device, resolve_device
from uph.io import write_parquet
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    curves, evaluation = train(
        CopyTaskConfig.from_config(snakemake.params.copy_task),
        snakemake.wildcards.attention,
        int(snakemake.wildcards.seed),
        resolve_device(job_device(snakemake.rule, snakemake.config)),
        log,
    )
    for row in evaluation.itertuples():
        log.info(
            "eval length %d: copy loss %.4f, token acc %.4f, sequence acc %.4f",
            row.eval_len,
            row.final_loss,
            row.token_acc,
            row.seq_acc,
        )
    write_parquet(curves, snakemake.output.curves)
    write_parquet(evaluation, snakemake.output.evaluation)
