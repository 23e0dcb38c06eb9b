"""Rule copy_task_table: every (attention, seed) job's final evaluation as one table."""

import uph.job_start
from uph.artifacts import COPY_TASK_RUN
from uph.io import write_table
from uph.logs import rule_logging

import pandas as pd

COLUMNS = ["attention", "seed", "train_len", "eval_len", "final_loss", "token_acc", "seq_acc"]

with rule_logging(snakemake) as log:
    table = pd.concat(COPY_TASK_RUN.read_all(snakemake.input.evaluations), ignore_index=True)
    table = table[COLUMNS].sort_values(["attention", "seed", "eval_len"], kind="stable")
    summary = table.groupby(["attention", "eval_len"])[["token_acc", "seq_acc"]].agg(["min", "mean"])
    log.info("token and sequence accuracy on the copied half over seeds:\n%s", summary.to_string())
    curves = pd.concat(COPY_TASK_RUN.read_all(snakemake.input.curves), ignore_index=True)
    trend = curves.groupby(["attention", "seed"])["loss"].agg(best="min", final="last")
    log.info(
        "copy loss at train_len along training, best and final (a final far above the best means "
        "training lost ground):\n%s",
        trend.to_string(),
    )
    write_table(table, snakemake.output.csv)
