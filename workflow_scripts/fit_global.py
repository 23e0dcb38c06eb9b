"""Rule fit_global: the control theta fitted on all users' train tokens pooled, scored on each user."""

from pathlib import Path

import pandas as pd
import torch

from uph.io import write_parquet
from uph.lm.fit import pool
from uph.lm.sweep import fit_and_score, load_point, point_label, prepared
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    fit = snakemake.params.fit
    point = point_label(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    head, users, device = load_point(
        point,
        Path(snakemake.input.model).parent,
        snakemake.input.basis,
        snakemake.input.shards,
        snakemake.params.head,
        snakemake.params.cache,
        snakemake.params.device,
    )
    splits = {user: prepared(states, head, device) for user, states in users.items()}
    train = pool([train for train, _ in splits.values()])
    tests = {user: test for user, (_, test) in splits.items()}
    log.info("%s: global theta on %d pooled tokens of %d users", point, train.n, len(users))
    rows = []
    for solver in fit["solvers"]:
        rows += fit_and_score(train, tests, head, fit, solver, "global", point)[1]
    write_parquet(pd.DataFrame(rows), snakemake.output[0])
