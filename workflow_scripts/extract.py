"""Rule extract: cache the final hidden states of the users of one shard (`extract.dtype: auto` is
resolved here, on the machine that extracts, and recorded in the shard; `extract.batch_size: null` comes
sized by the device the job asks for (rules/common.smk, uph.config.batch_windows), and is logged)."""

import uph.job_start
from uph.artifacts import USERS_FILE
from uph.config import batch_windows
from uph.device import job_device, resolve_device, resolve_dtype
from uph.lm.data.cache import cache_identity, shard_manifest, shard_users, shard_writer
from uph.lm.data.extract import extract_users
from uph.lm.data.models import load_model
from uph.logs import rule_logging
from uph.model_identity import read_identity

import time
from pathlib import Path

import torch

with rule_logging(snakemake) as log:
    cfg = snakemake.params.extract
    shard = int(snakemake.wildcards.shard)
    torch.set_num_threads(snakemake.threads)
    device = resolve_device(job_device(snakemake.rule, snakemake.config))
    dtype = resolve_dtype(cfg["dtype"], device)
    batch_size = batch_windows(cfg["batch_size"], cfg["context"], device)
    model_dir = Path(snakemake.input.model).parent
    users = USERS_FILE.read_parquet(snakemake.input.users)
    manifest = shard_manifest(users, shard, cfg["shards"])
    mine = shard_users(users, shard, cfg["shards"])
    log.info(
        "shard %d: %d users, %d tokens, %s on %s, batches of %d windows of %d",
        shard,
        len(mine),
        mine["n_tokens"].sum(),
        dtype,
        device,
        batch_size,
        cfg["context"],
    )
    start = time.perf_counter()
    model = load_model(model_dir, dtype=dtype, device=device)
    log.info("model loaded in %.1f s", time.perf_counter() - start)
    identity = cache_identity(read_identity(model_dir), dtype, cfg["context"])
    start = time.perf_counter()
    with shard_writer(snakemake.output[0], identity, manifest) as write:
        n = extract_users(model, mine, cfg["context"], batch_size, device, write)
    seconds = time.perf_counter() - start
    log.info("cached %d tokens in %.1f s (%.0f tokens/s, with the shard's writing)", n, seconds, n / seconds)
