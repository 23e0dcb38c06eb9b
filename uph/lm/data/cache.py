"""Hidden-state cache: per token, the final hidden state h (the lm_head input) and the next token.

One parquet file per shard, `shard-<i>.parquet`; a user's shard is a stable hash of the user id, so
shards are built and consumed as independent jobs. Rows: user_id, split ('train' | 'test'),
position (index of the target in the user's token stream), target, hidden (H numbers; bfloat16 is
stored as its raw 16 bits).

Each file's footer holds a record of what it holds and for whom: the model (weights and tokenizer
hashes, hidden size), the dtype the extraction computed in (`auto` resolved on the machine that
extracted), the context length, the schema version, the shard index and count, the corpus identity
(a hash of the users table it was cut from), its users with their token counts, and a content
digest of its columns. A reader expects, for `shard-<i>.parquet`, the users that shard i has in the
users table now; any difference, another Arrow schema, a digest that does not match the columns
(an edited or damaged file: data pages also carry CRC checksums), or NaN/inf hidden states (a
float16 extraction that overflowed) is one `CacheError` line naming the file and what to do,
raised before any of the file's states is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from uph.artifacts import METADATA_KEY, READ_ERRORS, USERS_FILE, Artifact, differences, first_line
from uph.errors import CacheError
from uph.io import atomic_path
from uph.model_identity import read_identity as read_model_identity

SCHEMA_VERSION = 2
IDENTITY_KEYS = ("schema_version", "weights_sha256", "tokenizer_sha256", "hidden_size", "dtype", "context")
AUTO_DTYPES = ("bfloat16", "float32")  # what `extract.dtype: auto` resolves to (uph.device.resolve_dtype)
COLUMNS = ("user_id", "split", "position", "target", "hidden")
SHARD_NAME = re.compile(r"shard-(\d+)\.parquet")


def shard_of(user_id: str, n_shards: int) -> int:
    """Stable across runs and machines (unlike Python's salted hash)."""
    return zlib.crc32(user_id.encode("utf-8")) % n_shards


def shard_users(users: pd.DataFrame, shard: int, shards: int) -> pd.DataFrame:
    """The rows of the users table (results/corpus/users.parquet) that shard `shard` of `shards` holds."""
    return users[[shard_of(user, shards) == shard for user in users["user_id"]]]


def corpus_identity(users: pd.DataFrame) -> str:
    """sha256 of the users table: every user's id, token count, split bounds and tokens, in user order."""
    digest = hashlib.sha256()
    for row in users.sort_values("user_id").itertuples():
        digest.update(row.user_id.encode("utf-8") + b"\0")
        digest.update(np.array([row.n_tokens, row.train_end, row.test_start, *row.tokens], dtype="<i8").tobytes())
    return digest.hexdigest()


def shard_manifest(users: pd.DataFrame, shard: int, shards: int) -> dict:
    """What shard `shard` of `shards` cut from the users table `users` holds: its users and their tokens."""
    mine = shard_users(users, shard, shards)
    return {
        "shard": shard,
        "shards": shards,
        "corpus_sha256": corpus_identity(users),
        "users": {user: int(n) for user, n in zip(mine["user_id"], mine["n_tokens"])},
    }


def cache_identity(model_identity: dict, dtype, context: int) -> dict:
    """The model and extraction settings a cache file was built with; `dtype` a torch dtype or its
    name ('auto' in what a reader expects: any dtype auto resolves to)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model_identity["name"],
        "weights_sha256": model_identity["weights_sha256"],
        "tokenizer_sha256": model_identity["tokenizer_sha256"],
        "hidden_size": model_identity["hidden_size"],
        "dtype": str(dtype).removeprefix("torch."),
        "context": context,
    }


def arrow_schema(hidden_size: int, dtype: str) -> pa.Schema:
    value = pa.uint16() if dtype == "bfloat16" else pa.from_numpy_dtype(np.dtype(dtype))
    return pa.schema(
        [
            ("user_id", pa.string()),
            ("split", pa.string()),
            ("position", pa.int32()),
            ("target", pa.int32()),
            ("hidden", pa.list_(value, hidden_size)),
        ]
    )


class ContentDigest:
    """sha256 of each column's values in row order (strings NUL-terminated, numbers as stored), then
    of those digests: the same for a file written in batches and for the file read back whole."""

    def __init__(self):
        self.columns = {name: hashlib.sha256() for name in COLUMNS}

    def update(self, table: pa.Table) -> None:
        for name in COLUMNS:
            column = table.column(name)
            if pa.types.is_string(column.type):
                values = "".join(value + "\0" for value in column.to_pylist()).encode("utf-8")
            elif pa.types.is_fixed_size_list(column.type):
                values = np.ascontiguousarray(column.combine_chunks().flatten().to_numpy())
            else:
                values = np.ascontiguousarray(column.to_numpy())
            self.columns[name].update(values)

    def hexdigest(self) -> str:
        return hashlib.sha256(b"".join(self.columns[name].digest() for name in COLUMNS)).hexdigest()


def _to_numpy(hidden: torch.Tensor) -> np.ndarray:
    if hidden.dtype == torch.bfloat16:
        return hidden.contiguous().view(torch.uint16).numpy()
    return hidden.numpy()


def _from_numpy(values: np.ndarray, dtype: str) -> torch.Tensor:
    tensor = torch.from_numpy(values.copy())  # arrow's buffers are read-only
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


@contextlib.contextmanager
def shard_writer(path: str | Path, identity: dict, manifest: dict):
    """Yield `write(user_id, split, positions, targets, hidden)`; the shard appears only on success,
    its record (`identity`, `manifest` from `shard_manifest`, the content digest) written last."""
    schema = arrow_schema(identity["hidden_size"], identity["dtype"])
    value_type = schema.field("hidden").type.value_type
    digest = ContentDigest()

    with atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True) as writer:

            def write(user_id: str, split: str, positions, targets, hidden: torch.Tensor) -> None:
                n, size = hidden.shape
                flat = pa.array(_to_numpy(hidden.cpu()).reshape(-1), type=value_type)
                batch = pa.table(
                    {
                        "user_id": pa.array([user_id] * n, pa.string()),
                        "split": pa.array([split] * n, pa.string()),
                        "position": pa.array(positions, pa.int32()),
                        "target": pa.array(targets, pa.int32()),
                        "hidden": pa.FixedSizeListArray.from_arrays(flat, size),
                    },
                    schema=schema,
                )
                digest.update(batch)
                writer.write_table(batch)

            yield write
            record = {**identity, **manifest, "digest": digest.hexdigest()}
            writer.add_key_value_metadata({METADATA_KEY: json.dumps(record, sort_keys=True).encode()})


@dataclass
class UserStates:
    """One user's cached tokens: hidden [n, H] and targets [n] for each split."""

    train_hidden: torch.Tensor
    train_targets: torch.Tensor
    test_hidden: torch.Tensor
    test_targets: torch.Tensor


CACHE_FILE = Artifact("cache file", "extract", CacheError)
read_record = CACHE_FILE.read_record  # the record in a shard's footer (see the module docstring)
_unusable = CACHE_FILE.unusable


def _differences(found: dict, expect: dict) -> str | None:
    """Why a shard's record does not match what the reader expects, or None."""
    if expect["dtype"] == "auto" and found.get("dtype") in AUTO_DTYPES:
        expect = {**expect, "dtype": found["dtype"]}
    why = differences(found, expect, IDENTITY_KEYS)
    if why:
        return why
    if (found.get("shard"), found.get("shards")) != (expect["shard"], expect["shards"]):
        return (
            f"holds shard {found.get('shard')} of {found.get('shards')}, not shard {expect['shard']} of "
            f"{expect['shards']} (config key 'extract.shards')"
        )
    if found.get("corpus_sha256") != expect["corpus_sha256"]:
        return "was cut from another users table than results/corpus/users.parquet (corpus or its settings changed)"
    if not isinstance(found.get("users"), dict) or found["users"] != expect["users"]:
        users = found.get("users") if isinstance(found.get("users"), dict) else {}
        user = min(set(users) ^ set(expect["users"]) or {u for u in users if users[u] != expect["users"][u]})
        return (
            f"does not hold the users of shard {expect['shard']}: user {user!r} has "
            f"{users.get(user, 'no')} tokens there, {expect['users'].get(user, 'none')} in the users table"
        )
    return None


def read_shard(path: str | Path, expect: dict) -> dict[str, UserStates]:
    """The users of one shard file, checked against `expect` (`cache_identity` | `shard_manifest`)."""
    found = read_record(path)
    why = _differences(found, expect)
    if why:
        raise _unusable(path, why)
    dtype, schema = found["dtype"], arrow_schema(expect["hidden_size"], found["dtype"])
    try:
        stored = pq.read_schema(path).remove_metadata()
    except READ_ERRORS as error:
        raise _unusable(path, f"is damaged ({first_line(error)})") from None
    if not stored.equals(schema):
        columns = ", ".join(f"{field.name}: {field.type}" for field in stored)
        raise _unusable(
            path, f"has the columns ({columns}), not those of a {dtype} cache of hidden size {expect['hidden_size']}"
        )
    try:
        table = pq.read_table(path, page_checksum_verification=True).replace_schema_metadata(None)
        digest = ContentDigest()
        digest.update(table)
    except READ_ERRORS as error:
        raise _unusable(path, f"is damaged ({first_line(error)})") from None
    if not table.schema.equals(schema) or digest.hexdigest() != found.get("digest"):
        raise _unusable(path, "does not match its recorded content digest (edited or damaged after it was written)")
    return _split_users(table, path, dtype)


def _split_users(table: pa.Table, path: Path, dtype: str) -> dict[str, UserStates]:
    size = table.schema.field("hidden").type.list_size
    user_ids = table.column("user_id").to_numpy(zero_copy_only=False)
    is_train = table.column("split").to_numpy(zero_copy_only=False) == "train"
    targets = torch.from_numpy(table.column("target").to_numpy().astype(np.int64))
    hidden = _from_numpy(table.column("hidden").combine_chunks().flatten().to_numpy().reshape(-1, size), dtype)
    finite = torch.isfinite(hidden).all(dim=1)
    if not finite.all():
        user = user_ids[int(torch.argmin(finite.int()))]
        fix = (
            "the model computes them in float32 too"
            if dtype == "float32"
            else f"{dtype} overflowed: set config key 'extract.dtype' to float32"
        )
        raise CacheError(f"cache file '{path}' holds NaN or inf hidden states of user {user!r}; {fix}")
    out = {}
    for user in np.unique(user_ids):
        mine = user_ids == user
        train, test = np.flatnonzero(mine & is_train), np.flatnonzero(mine & ~is_train)
        out[str(user)] = UserStates(hidden[train], targets[train], hidden[test], targets[test])
    return out


def shard_number(path: str | Path) -> int:
    """i of a cache file named shard-<i>.parquet: the shard it must hold."""
    match = SHARD_NAME.fullmatch(Path(path).name)
    if match is None:
        raise CacheError(f"cache file '{path}' is not named shard-<i>.parquet, so which users it holds is unknown")
    return int(match.group(1))


def read_users(paths, model_dir: str | Path, users_path: str | Path, extract: dict, only=None) -> dict[str, UserStates]:
    """Every user of the shard files `paths` (or the users `only` of them: a fit job's, uph.lm.jobs.partition),
    in user order, each file read checked against the model in `model_dir`, the users table `users_path`
    (results/corpus/users.parquet) and the job's extract keys `extract` (context, dtype, shards;
    `job_params(config["extract"], EXTRACT_KEYS)`); a file that holds none of `only` is not read. The files
    refused are named in one error (uph.artifacts.Artifact.each)."""
    users = USERS_FILE.read_parquet(users_path, ["user_id", "n_tokens", "train_end", "test_start", "tokens"])
    identity = cache_identity(read_model_identity(model_dir), extract["dtype"], extract["context"])
    wanted = None if only is None else set(only)
    expected = {}
    for path in paths:
        manifest = shard_manifest(users, shard_number(path), extract["shards"])
        if wanted is None or wanted & set(manifest["users"]):
            expected[path] = {**identity, **manifest}

    def wanted_of(path) -> dict[str, UserStates]:
        held = read_shard(path, expected[path])
        return held if wanted is None else {user: held[user] for user in held if user in wanted}

    states: dict[str, UserStates] = {}
    for held in CACHE_FILE.each(expected, wanted_of):  # every refused file named at once
        states.update(held)
    return dict(sorted(states.items()))
