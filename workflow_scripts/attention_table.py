"""Rule attention_table: the attention study's tests, lr sweeps and curves as tables.

attention.csv: one row per (task, model, attention, seed, eval_len, level) at the cell's chosen lr,
`lr_at_edge` flagging a choice at an end of the lrs tried (low, high, both), the run's steps (steps_run,
best_step, steps_to_90, steps_to_99, at_step_limit) and why it stopped (`stopped`: solved, patience,
step_limit, diverged), the kind's family and `loudness_invariant` (its
normalization divides the distractors' loudness m out by construction: flat in m proves nothing).
attention_sweep.csv: validation metrics of every (lr, seed) run, `chosen` marking the cell's lr and
`extended` an lr tried past an end of attention.lrs.
attention_curves.csv: the chosen lr's curves (validation accuracy, score magnitude, attention
gradient norm) per seed and logged step.
"""

import uph.job_start
from uph.artifacts import ATTENTION_RUN
from uph.attention.study_config import PROGRESS
from uph.io import write_table
from uph.logs import rule_logging

import pandas as pd

KEYS = ["task", "model", "attention"]
COLUMNS = [
    *KEYS,
    "lr",
    "lr_at_edge",
    "seed",
    "train_len",
    "eval_len",
    "level",
    "loss",
    "token_acc",
    "seq_acc",
    "val_token_acc",
    "diverged",
    *PROGRESS,
    "family",
    "loudness_invariant",
]

with rule_logging(snakemake) as log:
    table = pd.concat(ATTENTION_RUN.read_all(snakemake.input.evaluations), ignore_index=True)
    table = table[COLUMNS].sort_values([*KEYS, "seed", "eval_len", "level"], kind="stable")
    sweep = pd.concat(ATTENTION_RUN.read_all(snakemake.input.sweeps), ignore_index=True)
    sweep = sweep[
        [*KEYS, "lr", "seed", "val_loss", "val_token_acc", "diverged", *PROGRESS, "chosen", "extended", "lr_at_edge"]
    ]
    sweep = sweep.sort_values([*KEYS, "lr", "seed"], kind="stable")
    chosen = sweep[sweep["chosen"]][[*KEYS, "lr", "seed"]]
    curves = pd.concat(ATTENTION_RUN.read_all(snakemake.input.curves), ignore_index=True).merge(chosen)
    curves = curves[
        [*KEYS, "lr", "seed", "step", "train_loss", "val_loss", "val_token_acc", "score_abs", "attention_grad_norm"]
    ]
    log.info(
        "validation token accuracy of the lr sweep, mean over its seeds:\n%s",
        sweep.groupby([*KEYS, "lr"])["val_token_acc"].mean().unstack("lr").to_string(),
    )
    log.info(
        "test token accuracy at the chosen lr, mean over seeds, per eval length:\n%s",
        table.groupby([*KEYS, "eval_len"])["token_acc"].mean().unstack("eval_len").to_string(),
    )
    write_table(table, snakemake.output.csv)
    write_table(sweep, snakemake.output.sweep)
    write_table(curves.sort_values([*KEYS, "seed", "step"], kind="stable"), snakemake.output.curves)
