"""Rule fit: every user of one shard x every solver, at one sweep point (head, alpha, d)."""
from pathlib import Path

import torch

from uph.device import resolve_device
from uph.io import write_parquet
from uph.logs import rule_logging
from uph.sweep import fit_users, load_head, load_users, point_label

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    model_dir = Path(snakemake.input.model).parent
    point = point_label(snakemake.wildcards.head, snakemake.wildcards.alpha, snakemake.wildcards.d)
    head = load_head(model_dir, snakemake.input.basis, snakemake.params.fit, point)
    users = load_users([snakemake.input.shard], model_dir, snakemake.params.extract, snakemake.params.device)
    log.info("%s: %d users, solvers %s", point, len(users), snakemake.params.fit["solvers"])
    device = resolve_device(snakemake.params.device)
    write_parquet(fit_users(users, head, snakemake.params.fit, point, device), snakemake.output[0])
