"""Rule cross_user: theta of user u scored on the held-out text of user v, for every (u, v)."""

from pathlib import Path

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.evaluate import cross_user
from uph.lm.fit import prepare
from uph.lm.sweep import load_point, point_label
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    point = point_label(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    solver = snakemake.params.solver
    fits = pd.concat(map(pd.read_parquet, snakemake.input.fits))
    fits = fits[fits["solver"] == solver]
    thetas = {user: torch.tensor(theta) for user, theta in zip(fits["user"], fits["theta"])}
    head, users, device = load_point(
        point,
        Path(snakemake.input.model).parent,
        snakemake.input.basis,
        snakemake.input.shards,
        snakemake.params.head,
        snakemake.params.cache,
        snakemake.params.device,
    )
    tests = {user: prepare(s.test_hidden, s.test_targets, head.W, head.b, device=device) for user, s in users.items()}
    log.info("%s, solver %s: %d x %d cross-user scores", point, solver, len(thetas), len(tests))
    table = cross_user(thetas, tests, head).assign(**point, solver=solver)
    write_parquet(table, snakemake.output[0])
