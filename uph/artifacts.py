"""Recorded files: what a job writes for later jobs records what it was built from, and every reader
checks that record before using the file.

A record is a JSON object in the file's own metadata (a parquet footer's key `uph`; a safetensors
header's metadata, whose values are text). It names the model (`weights_sha256`) and the config keys
the file depends on, flattened ('fit.radii', 'extract.context': `job_record`). A reader compares the
weights hash and every config key that both it and the file name (a key the file did not record is
not one it depends on). A missing, damaged (truncated, edited) or foreign file is one line naming it
and the command that rebuilds it, raised before any of it is used. The hidden-state cache
(uph.lm.data.cache) adds its shard manifest and content digest; the fit stage's tables (`FIT_FILE`) and
the SVD basis (uph.lm.data.basis) record the model and their job's keys. Torch-free, and pandas-free at
import (pyarrow's to_pandas loads pandas where a table is read), so the basis job never loads pandas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from safetensors import SafetensorError, safe_open

from uph.errors import ArtifactError, UphError
from uph.io import atomic_path
from uph.model_identity import read_identity

if TYPE_CHECKING:
    import pandas as pd

METADATA_KEY = b"uph"  # in a parquet footer
MODEL_KEY = "weights_sha256"  # every record names the model; the other keys are compared where both sides have them

# What pyarrow and safetensors raise on a damaged file: their own errors (ArrowInvalid, ArrowIOError,
# SafetensorError, ... and OSError), and from a damaged footer sometimes plain Python errors of the
# thrift decoder.
READ_ERRORS = (
    OSError,
    pa.ArrowException,
    SafetensorError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    MemoryError,
)


def first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def job_record(model_identity: str | Path, **sections: dict) -> dict:
    """What a job's outputs are built from: the weights hash of the model whose identity.json is
    `model_identity`, and each config section's keys the job was given (its params), as 'section.key'."""
    record = {MODEL_KEY: read_identity(Path(model_identity).parent)[MODEL_KEY]}
    for name, keys in sections.items():
        record.update({f"{name}.{key}": value for key, value in keys.items()})
    return json.loads(json.dumps(record))  # as it reads back: lists, not tuples


def differences(found: dict, expect: dict, keys) -> str | None:
    """Why a record `found` is not what a reader expects (`expect` at `keys`), or None."""
    wrong = [key for key in keys if found.get(key) != expect[key]]
    if not wrong:
        return None
    return "was built for something else: " + ", ".join(
        f"{key}={found.get(key)!r} (expected {expect[key]!r})" for key in wrong
    )


def _metadata(path: Path):
    """The record's text in the file's metadata, or None; a safetensors header's metadata is the record."""
    if path.suffix == ".safetensors":
        with safe_open(path, framework="numpy") as f:
            return json.dumps(f.metadata())
    return (pq.read_metadata(path).metadata or {}).get(METADATA_KEY)


def _refusal(error: UphError, path, why: str) -> UphError:
    """`error`, marked as the refusal of file `path` for the reason `why` (what Artifact.each gathers)."""
    error.refused = (path, why)
    return error


@dataclass(frozen=True)
class Artifact:
    """A kind of recorded file: how messages name it, the job that rebuilds it, the error it raises."""

    noun: str
    job: str | None = None
    error: type[UphError] = ArtifactError

    def unusable(self, path, why: str) -> UphError:
        rebuilds = f" (the {self.job} job rebuilds it)" if self.job else ""
        return _refusal(
            self.error(f"{self.noun} '{path}' {why}; delete it and run snakemake again{rebuilds}"), path, why
        )

    def _exists(self, path: str | Path) -> None:
        if not Path(path).is_file():
            builds = f" (the {self.job} job builds it)" if self.job else ""
            error = self.error(f"{self.noun} '{path}' does not exist; run snakemake again{builds}")
            raise _refusal(error, path, "does not exist")

    def each(self, paths, use) -> list:
        """`use(path)` of every file of `paths`, in order; where files are refused (`unusable`, missing), one
        error naming every one of them and why, so that one round of deleting them is enough (one refused
        file: its own message)."""
        done, refused = [], []
        for path in paths:
            try:
                done.append(use(path))
            except UphError as error:
                if not hasattr(error, "refused"):  # not a refusal of this file: raised as it is
                    raise
                refused.append(error)
        if len(refused) == 1:
            raise refused[0]
        if refused:
            rebuilds = f" (the {self.job} jobs rebuild them)" if self.job else ""
            named = "; ".join(f"'{error.refused[0]}' {error.refused[1]}" for error in refused)
            raise self.error(
                f"{len(refused)} {self.noun}s cannot be used: {named}; delete them and run snakemake again{rebuilds}"
            )
        return done

    def check_all(self, paths, expect: dict) -> None:
        """`check` of every file of `paths`, before any is read: every refused file in one error (`each`)."""
        self.each(paths, lambda path: self.check(path, expect))

    def read_record(self, path: str | Path) -> dict:
        """The record in `path`'s metadata (see the module docstring)."""
        self._exists(path)
        try:
            text = _metadata(Path(path))
        except READ_ERRORS as error:
            raise self.unusable(path, f"is damaged or truncated ({first_line(error)})") from None
        try:
            record = json.loads(text)
        except (TypeError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise self.unusable(path, f"has no readable uph metadata: not a {self.noun} of this suite")
        return record

    def check(self, path: str | Path, expect: dict) -> dict:
        """The record of `path`, refused unless it has `expect`'s weights hash and agrees with it on
        every key both name."""
        found = self.read_record(path)
        why = differences(found, expect, [key for key in expect if key == MODEL_KEY or key in found])
        if why:
            raise self.unusable(path, why)
        return found

    def read_table(self, path: str | Path, expect: dict) -> pd.DataFrame:
        """A parquet file written by `write_recorded`, checked against `expect` (`job_record`)."""
        self.check(path, expect)
        return self.read_parquet(path)

    def read_parquet(self, path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
        """A parquet file (`columns` of it), page checksums verified where it has them; a file with no
        record to check (the corpus's, the training jobs') is read with this alone."""
        self._exists(path)
        try:
            return pq.read_table(path, columns=columns, page_checksum_verification=True).to_pandas()
        except READ_ERRORS as error:
            raise self.unusable(path, f"is damaged or truncated ({first_line(error)})") from None

    def read_tensors(self, path: str | Path) -> dict:
        """A safetensors file's tensors {name: tensor} (on the CPU)."""
        from safetensors.torch import load_file

        self._exists(path)
        try:
            return load_file(path)
        except READ_ERRORS as error:
            raise self.unusable(path, f"is damaged or truncated ({first_line(error)})") from None

    def read_tables(self, paths, expect: dict) -> pd.DataFrame:
        """`read_table` of every file of `paths`, concatenated (every refused file in one error: `each`)."""
        import pandas as pd

        return pd.concat(self.each(paths, lambda path: self.read_table(path, expect)), ignore_index=True)

    def read_all(self, paths, columns: list[str] | None = None) -> list[pd.DataFrame]:
        """`read_parquet` of every file of `paths` (every refused file in one error: `each`)."""
        return self.each(paths, lambda path: self.read_parquet(path, columns))


def write_recorded(df: pd.DataFrame, path: str | Path, record: dict) -> None:
    """`df` as parquet (atomically, page checksums on) with `record` (`job_record`) in its footer."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    metadata = {**table.schema.metadata, METADATA_KEY: json.dumps(record, sort_keys=True).encode()}
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp, write_page_checksum=True)


FIT_FILE = Artifact("fit file")  # the fit stage's parquet files, results/fit/**
# The named inputs of the fit stage's rules that are fit files (rules/fit.smk)
FIT_INPUTS = (
    "global_fit",
    "unigram",
    "neural_cache",
    "datastore",
    "validation",
    "capacity",
    "warm",
    "fits",
    "others",
    "dose",
    "cross_user",
    "headline",
)


def check_fit_inputs(inputs, record: dict) -> None:
    """Every fit file among a job's named `inputs` (its snakemake.input: FIT_INPUTS) checked against `record`
    before the job reads any of them: a refusal names every file that cannot be used, not the first."""
    paths = []
    for name in FIT_INPUTS:
        value = inputs.get(name)
        paths += [] if value is None else [value] if isinstance(value, str) else list(value)
    FIT_FILE.check_all(paths, record)


ROLES_FILE = Artifact("roles table", "corpus_roles")  # results/corpus/roles.parquet: the users' text
USERS_FILE = Artifact("users table", "corpus")  # results/corpus/users.parquet: tokens and splits
ATTENTION_RUN = Artifact("attention run file", "attention_train")  # results/attention/**.parquet
ATTENTION_LR_RUN = Artifact("attention lr-job file", "attention_lr")  # results/attention/**/lr~*/*
COPY_TASK_RUN = Artifact("copy-task run file", "copy_task_train")  # results/copy_task/**.parquet
FEEDBACK_RUN = Artifact("feedback run file", "feedback_train")  # results/feedback/**.parquet
