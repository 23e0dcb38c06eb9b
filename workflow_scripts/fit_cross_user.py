"""Rule cross_user: every user's residual theta (on top of the global one) scored on every user's held-out
text, at one sweep point."""

from pathlib import Path

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.sweep import Point, build_heads, cross_user, global_thetas, load_users
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    point = Point.of(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    solver = snakemake.params.solver
    fits = pd.concat(map(pd.read_parquet, snakemake.input.fits))
    fits = fits[(fits["head"] == point.head) & (fits["alpha"] == point.alpha) & (fits["d"] == point.d)]
    fits = fits[fits["solver"] == solver]
    residuals = {
        user: torch.tensor(theta, dtype=torch.float64) for user, theta in zip(fits["user"], fits["theta_residual"])
    }
    layer, users, device = load_users(
        Path(snakemake.input.model).parent,
        snakemake.input.shards,
        snakemake.input.users,
        snakemake.params.cache,
        snakemake.params.device,
    )
    head = build_heads([point], layer, snakemake.input.basis, snakemake.params.heads)[point]
    theta_g = global_thetas(pd.read_parquet(snakemake.input.global_fit))[(point, solver)]
    log.info("%s, solver %s: %d x %d cross-user scores", point.label, solver, len(residuals), len(users))
    table = cross_user(users, head, theta_g, residuals, layer, device).assign(**point.columns, solver=solver)
    write_parquet(table, snakemake.output[0])
