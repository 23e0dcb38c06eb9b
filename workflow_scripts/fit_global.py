"""Rule fit_global: the global theta of every sweep point and solver, on all users' train tokens pooled."""

from pathlib import Path

import torch

from uph.io import write_parquet
from uph.lm.sweep import build_heads, fit_global, load_users, sweep_points
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = snakemake.params.fit
    layer, users, device = load_users(
        Path(snakemake.input.model).parent,
        snakemake.input.shards,
        snakemake.input.users,
        snakemake.params.cache,
        snakemake.params.device,
    )
    heads = build_heads(sweep_points(fit), layer, snakemake.input.basis, fit)
    write_parquet(fit_global(users, heads, layer, fit, device), snakemake.output[0])
