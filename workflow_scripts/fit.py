"""Rule fit: every user of one shard x every solver, at one sweep point (head, alpha, d)."""

from pathlib import Path

import torch

from uph.io import write_parquet
from uph.lm.sweep import fit_users, load_point, point_label
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    point = point_label(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    head, users, device = load_point(
        point,
        Path(snakemake.input.model).parent,
        snakemake.input.basis,
        [snakemake.input.shard],
        snakemake.params.head,
        snakemake.params.cache,
        snakemake.params.device,
    )
    log.info("%s: %d users, solvers %s", point, len(users), snakemake.params.fit["solvers"])
    write_parquet(fit_users(users, head, snakemake.params.fit, point, device), snakemake.output[0])
