"""Rule feedback_table: one row per (method, seed) from the training curves."""

import uph.job_start
from uph.artifacts import FEEDBACK_RUN
from uph.feedback.comparison import summarize
from uph.io import write_table
from uph.logs import rule_logging

import pandas as pd

with rule_logging(snakemake) as log:
    table = summarize(pd.concat(FEEDBACK_RUN.read_all(snakemake.input.runs), ignore_index=True))
    columns = ["final_loss", "final_acc", "mean_alignment", "seconds_per_step"]
    means = table.groupby("method", sort=False)[columns].mean()
    log.info("means over seeds:\n%s", means.to_string(float_format="%.4f"))
    write_table(table, snakemake.output.csv)
