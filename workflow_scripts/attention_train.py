"""Rule attention_train: every task of the attention study for one (model, attention): lr sweep, seeds, tests."""

import pandas as pd
import torch

from uph.attention.study_config import AttentionStudyConfig
from uph.attention.training import run_cell
from uph.device import resolve_device
from uph.io import write_parquet
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    cfg = AttentionStudyConfig.from_config(snakemake.params.attention)
    device = resolve_device(snakemake.params.device)
    model, attention = snakemake.wildcards.model, snakemake.wildcards.attention
    cells = [run_cell(cfg, task, model, attention, device, log) for task in cfg.tasks]
    for i, name in enumerate(("curves", "sweep", "evaluation")):
        write_parquet(pd.concat([cell[i] for cell in cells], ignore_index=True), snakemake.output[name])
