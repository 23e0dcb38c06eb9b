"""Hidden-state cache: per token, the final hidden state h (the lm_head input) and the next token.

One parquet file per shard; a user's shard is a stable hash of the user id, so shards can be
built and consumed as independent jobs. Rows: user_id, split ('train' | 'test'), position (index
of the target in the user's token stream), target, hidden (H numbers; bfloat16 is stored as its
raw 16 bits). The file's key-value metadata names the model (weights and tokenizer hashes), the
dtype, the context length and the schema version; a reader that expects another is refused.
Data pages carry CRC checksums, so a damaged file is detected when it is read, and so are NaN or
inf hidden states (a float16 extraction that overflowed). Every refusal is one `CacheError` line
naming the file and what to do, raised before any of the file's states is used.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from uph.device import resolve_device, resolve_dtype
from uph.errors import CacheError
from uph.io import atomic_path
from uph.lm.identity import read_identity as read_model_identity

SCHEMA_VERSION = 1
METADATA_KEY = b"uph"
IDENTITY_KEYS = ("schema_version", "weights_sha256", "tokenizer_sha256", "dtype", "context")


def shard_of(user_id: str, n_shards: int) -> int:
    """Stable across runs and machines (unlike Python's salted hash)."""
    return zlib.crc32(user_id.encode("utf-8")) % n_shards


def cache_identity(model_identity: dict, dtype: torch.dtype, context: int) -> dict:
    """What a cache file must match to be reused (see `configured_identity` for a config's)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model_identity["name"],
        "weights_sha256": model_identity["weights_sha256"],
        "tokenizer_sha256": model_identity["tokenizer_sha256"],
        "dtype": str(dtype).removeprefix("torch."),
        "context": context,
        "hidden_size": model_identity["hidden_size"],
    }


def configured_identity(model_dir: str | Path, extract: dict, device: str) -> dict:
    """The cache identity that the config's `extract` section and `device` ask for."""
    dtype = resolve_dtype(extract["dtype"], resolve_device(device))
    return cache_identity(read_model_identity(model_dir), dtype, extract["context"])


def _arrow_schema(hidden_size: int, dtype: str, identity: dict) -> pa.Schema:
    value = pa.uint16() if dtype == "bfloat16" else pa.from_numpy_dtype(np.dtype(dtype))
    return pa.schema(
        [
            ("user_id", pa.string()),
            ("split", pa.string()),
            ("position", pa.int32()),
            ("target", pa.int32()),
            ("hidden", pa.list_(value, hidden_size)),
        ],
        metadata={METADATA_KEY: json.dumps(identity).encode()},
    )


def _to_numpy(hidden: torch.Tensor) -> np.ndarray:
    if hidden.dtype == torch.bfloat16:
        return hidden.contiguous().view(torch.uint16).numpy()
    return hidden.numpy()


def _from_numpy(values: np.ndarray, dtype: str) -> torch.Tensor:
    tensor = torch.from_numpy(values.copy())  # arrow's buffers are read-only
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


@contextlib.contextmanager
def shard_writer(path: str | Path, identity: dict):
    """Yield `write(user_id, split, positions, targets, hidden)`; the shard appears only on success."""
    schema = _arrow_schema(identity["hidden_size"], identity["dtype"], identity)
    value_type = schema.field("hidden").type.value_type

    with (
        atomic_path(path) as tmp,
        pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True) as writer,
    ):

        def write(user_id: str, split: str, positions, targets, hidden: torch.Tensor) -> None:
            n, size = hidden.shape
            flat = pa.array(_to_numpy(hidden.cpu()).reshape(-1), type=value_type)
            writer.write_table(
                pa.table(
                    {
                        "user_id": pa.array([user_id] * n, pa.string()),
                        "split": pa.array([split] * n, pa.string()),
                        "position": pa.array(positions, pa.int32()),
                        "target": pa.array(targets, pa.int32()),
                        "hidden": pa.FixedSizeListArray.from_arrays(flat, size),
                    },
                    schema=schema,
                )
            )

        yield write


@dataclass
class UserStates:
    """One user's cached tokens: hidden [n, H] and targets [n] for each split."""

    train_hidden: torch.Tensor
    train_targets: torch.Tensor
    test_hidden: torch.Tensor
    test_targets: torch.Tensor


def _unusable(path, why: str) -> CacheError:
    return CacheError(f"cache file '{path}' {why}; delete it and run snakemake again (the extract job rebuilds it)")


def read_identity(path: str | Path) -> dict:
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as error:
        raise _unusable(path, f"is damaged or truncated ({str(error).splitlines()[0]})") from None
    try:
        return json.loads(metadata[METADATA_KEY])
    except (KeyError, ValueError):
        raise _unusable(path, "has no readable uph metadata: not a hidden-state cache of this suite") from None


class HiddenStateCache:
    """Read-only view of shard files, each checked against the identity the reader expects."""

    def __init__(self, paths, expect: dict):
        self.paths = [Path(p) for p in paths]
        for path in self.paths:
            found = read_identity(path)
            wrong = [k for k in IDENTITY_KEYS if found.get(k) != expect.get(k)]
            if wrong:
                detail = ", ".join(f"{k}={found.get(k)!r} (expected {expect.get(k)!r})" for k in wrong)
                raise _unusable(path, f"was built for something else: {detail}")
        self.dtype = expect["dtype"]

    def load(self) -> dict[str, UserStates]:
        """Every user of every shard, in user order."""
        users: dict[str, UserStates] = {}
        for path in self.paths:
            try:
                table = pq.read_table(path, page_checksum_verification=True)
            except (OSError, pa.ArrowException) as error:
                raise _unusable(path, f"is damaged ({str(error).splitlines()[0]})") from None
            users.update(self._split_users(table, path))
        return dict(sorted(users.items()))

    def _split_users(self, table: pa.Table, path: Path) -> dict[str, UserStates]:
        size = table.schema.field("hidden").type.list_size
        user_ids = table.column("user_id").to_numpy(zero_copy_only=False)
        is_train = table.column("split").to_numpy(zero_copy_only=False) == "train"
        targets = torch.from_numpy(table.column("target").to_numpy().astype(np.int64))
        hidden = _from_numpy(table.column("hidden").combine_chunks().values.to_numpy().reshape(-1, size), self.dtype)
        finite = torch.isfinite(hidden).all(dim=1)
        if not finite.all():
            user = user_ids[int(torch.argmin(finite.int()))]
            fix = (
                "the model computes them in float32 too"
                if self.dtype == "float32"
                else f"{self.dtype} overflowed: set config key 'extract.dtype' to float32"
            )
            raise CacheError(f"cache file '{path}' holds NaN or inf hidden states of user '{user}'; {fix}")
        out = {}
        for user in np.unique(user_ids):
            mine = user_ids == user
            train, test = np.flatnonzero(mine & is_train), np.flatnonzero(mine & ~is_train)
            out[str(user)] = UserStates(hidden[train], targets[train], hidden[test], targets[test])
        return out
