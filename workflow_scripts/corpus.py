"""Rule corpus: tokenize every user, keep the largest `max_users` with >= `min_tokens`, split in time."""

import uph.job_start
from uph.artifacts import ROLES_FILE
from uph.config import check_context
from uph.io import write_parquet
from uph.lm.data.corpus import tokenize_users
from uph.lm.data.models import load_tokenizer
from uph.logs import rule_logging

from pathlib import Path

with rule_logging(snakemake) as log:
    cfg = snakemake.params.corpus
    roles = ROLES_FILE.read_parquet(snakemake.input.roles)
    check_context(snakemake.params.gap, Path(snakemake.input.model).parent)  # the model is known only now
    tokenizer = load_tokenizer(Path(snakemake.input.model).parent)
    users = tokenize_users(
        roles,
        tokenizer,
        cfg["min_tokens"],
        cfg["max_users"],
        cfg["train_fraction"],
        gap=snakemake.params.gap,
        max_tokens=cfg["max_tokens"],
    )
    log.info(
        "kept %d of %d users (%d to %d tokens each, %d used in all)",
        len(users),
        len(roles),
        users["n_tokens_total"].min(),
        users["n_tokens_total"].max(),
        users["n_tokens"].sum(),
    )
    write_parquet(users, snakemake.output.users)
