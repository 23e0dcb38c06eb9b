"""Rule extract: cache the final hidden states of the users of one shard."""

from pathlib import Path

import pandas as pd
import torch

from uph.device import resolve_device
from uph.lm.cache import configured_identity, shard_of, shard_writer
from uph.lm.extract import extract_users
from uph.lm.models import load_model
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    cfg = snakemake.params.extract
    shard = int(snakemake.wildcards.shard)
    torch.set_num_threads(snakemake.threads)
    device = resolve_device(snakemake.params.device)
    model_dir = Path(snakemake.input.model).parent
    identity = configured_identity(model_dir, cfg, snakemake.params.device)
    dtype = getattr(torch, identity["dtype"])
    users = pd.read_parquet(snakemake.input.users)
    users = users[[shard_of(u, cfg["shards"]) == shard for u in users["user_id"]]]
    log.info("shard %d: %d users, %d tokens, %s on %s", shard, len(users), users["n_tokens"].sum(), dtype, device)
    model = load_model(model_dir, dtype=dtype, device=device)
    with shard_writer(snakemake.output[0], identity) as write:
        n = extract_users(model, users, cfg["context"], cfg["batch_size"], device, write)
    log.info("cached %d tokens", n)
