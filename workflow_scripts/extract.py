"""Rule extract: cache the final hidden states of the users of one shard (`extract.dtype: auto` is
resolved here, on the machine that extracts, and recorded in the shard)."""

from pathlib import Path

import torch

from uph.artifacts import USERS_FILE
from uph.device import resolve_device, resolve_dtype
from uph.lm.cache import cache_identity, shard_manifest, shard_users, shard_writer
from uph.lm.extract import extract_users
from uph.lm.models import load_model
from uph.logs import rule_logging
from uph.model_identity import read_identity

with rule_logging(snakemake) as log:
    cfg = snakemake.params.extract
    shard = int(snakemake.wildcards.shard)
    torch.set_num_threads(snakemake.threads)
    device = resolve_device(snakemake.params.device)
    dtype = resolve_dtype(cfg["dtype"], device)
    model_dir = Path(snakemake.input.model).parent
    users = USERS_FILE.read_parquet(snakemake.input.users)
    manifest = shard_manifest(users, shard, cfg["shards"])
    mine = shard_users(users, shard, cfg["shards"])
    log.info("shard %d: %d users, %d tokens, %s on %s", shard, len(mine), mine["n_tokens"].sum(), dtype, device)
    model = load_model(model_dir, dtype=dtype, device=device)
    identity = cache_identity(read_identity(model_dir), dtype, cfg["context"])
    with shard_writer(snakemake.output[0], identity, manifest) as write:
        n = extract_users(model, mine, cfg["context"], cfg["batch_size"], device, write)
    log.info("cached %d tokens", n)
