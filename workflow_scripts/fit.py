"""Rule fit: the personal and residual arms of every sweep point and solver, the dose-response and the
baselines, for the users of one cache shard (each user's base distribution computed once)."""

from pathlib import Path

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import build_heads, fit_shard, global_thetas, load_users, sweep_points
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = snakemake.params.fit
    layer, users, device = load_users(
        Path(snakemake.input.model).parent,
        [snakemake.input.shard],
        snakemake.input.users,
        snakemake.params.cache,
        snakemake.params.device,
    )
    heads = build_heads(sweep_points(fit), layer, snakemake.input.basis, fit)
    log.info("%d users x %d points x solvers %s", len(users), len(heads), fit["solvers"])
    tables = fit_shard(users, heads, global_thetas(pd.read_parquet(snakemake.input.global_fit)), layer, fit, device)
    for table, path in zip(tables, (snakemake.output.fits, snakemake.output.dose, snakemake.output.baselines)):
        write_parquet(table, path)
