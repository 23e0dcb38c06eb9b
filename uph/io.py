"""Atomic outputs: every file is written to a temporary name in its folder, then renamed.

A job killed midway leaves at most a `.tmp-*` file behind, never a truncated output that a rerun
could mistake for a finished one; the next write of the same output deletes what it left. A folder
that is read-only or full ends the job with one line naming the file (`ConfigError` on 'results').
JSON is strict (a NaN is an error, not a bare `NaN`), table cells never break Markdown, and every
table records the code that computed it. Pandas-free at import (pandas is imported where a table is
read): every job imports this module through uph.logs, and a job that only writes JSON never loads it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from uph.errors import ArtifactError, ConfigError

if TYPE_CHECKING:
    import pandas as pd

REPO = Path(__file__).resolve().parent.parent
CODE_FILES = ("Snakefile", "rules/*.smk", "workflow_scripts/*.py", "uph/**/*.py", "schemas/*.yaml")


def git_state(repo: str | Path) -> dict:
    """{'commit': HEAD, 'dirty': tracked files changed}; both None outside a git checkout or without git."""

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    try:
        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip()),
        }
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def code_version(repo: str | Path = REPO) -> dict:
    """The code running now: git_state and 'code_sha256', a hash of the workflow's code files
    (CODE_FILES), which also tells apart two versions of a dirty tree."""
    digest = hashlib.sha256()
    for path in sorted({path for pattern in CODE_FILES for path in Path(repo).glob(pattern) if path.is_file()}):
        digest.update(f"{path.relative_to(repo)}\0".encode() + path.read_bytes())
    return {**git_state(repo), "code_sha256": digest.hexdigest()}


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for left_behind in path.parent.glob(f".tmp-{glob.escape(path.name)}.{'?' * 8}"):  # mkstemp's names, of
            left_behind.unlink(missing_ok=True)  # a killed writer of `path`
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make results private
        os.replace(tmp, path)
    except OSError as error:
        if error.errno in FULL + READ_ONLY:
            fix = "free space there" if error.errno in FULL else "make it writable or choose another 'results' folder"
            raise ConfigError(
                f"config key 'results': cannot write '{path}' ({error.strerror}); {fix} and run snakemake again"
            ) from None
        in_the_way = "a folder is at that path" if path.is_dir() else "something is in the way of that path"
        raise ArtifactError(  # a folder, a file where a folder belongs, a link to nowhere
            f"cannot write '{path}' ({error.strerror}): {in_the_way}; move it aside or delete it and run "
            "snakemake again"
        ) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_json(obj, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines (and some editors) break


def markdown_text(value):
    """A cell as Markdown shows it literally: `|` would split the row, `$` start math, `\\` escape, and a
    line break end the row (written as its escape, \\n or \\u2028, unambiguous once backslashes are
    escaped)."""
    if not isinstance(value, str):
        return value
    value = value.replace("\\", "\\\\").replace("|", "\\|").replace("$", "\\$")
    return "".join(c.encode("unicode_escape").decode() if c in LINE_BREAKS else c for c in value)


# What write_table writes beside a table's CSV, by name: the one list of them (the table rules declare
# each as an output through rules/common.smk's table_outputs, so a deleted one is rebuilt).
TABLE_COMPANIONS = {"md": ".md", "tex": ".tex", "code": ".code.json"}


def table_files(csv_path: str | Path) -> dict[str, str]:
    """Every file write_table writes for the table at `csv_path`, by name: 'csv' and TABLE_COMPANIONS."""
    csv_path = Path(csv_path)
    return {
        "csv": str(csv_path),
        **{name: str(csv_path.with_suffix(suffix)) for name, suffix in TABLE_COMPANIONS.items()},
    }


def write_table(df: pd.DataFrame, csv_path: str | Path, float_format: str = "%.6g") -> None:
    """A results table as CSV, with Markdown (.md) and LaTeX (.tex) renderings beside it, and the
    version of the code that computed it (.code.json, read by uph.report.provenance): `table_files`."""
    files = table_files(csv_path)
    with atomic_path(files["csv"]) as tmp:
        df.to_csv(tmp, index=False, float_format=float_format)
    with atomic_path(files["md"]) as tmp:
        tmp.write_text(df.map(markdown_text).to_markdown(index=False, floatfmt=".4g") + "\n")
    with atomic_path(files["tex"]) as tmp:
        tmp.write_text(df.to_latex(index=False, float_format=lambda x: f"{x:.4g}", escape=True))
    write_json(code_version(), files["code"])


ID_COLUMNS = ("user", "theta_user", "text_user")  # user ids: text as written, never a number or NaN


def read_table(csv_path: str | Path) -> pd.DataFrame:
    """A table written by write_table, its user ids as written: "007", "1e3" and "NA" stay strings (a
    plain read_csv makes them 7, 1000.0 and NaN, so "1e3" and "1000" would be one user)."""
    import pandas as pd

    table = pd.read_csv(csv_path)
    ids = [column for column in ID_COLUMNS if column in table.columns]
    if ids:
        table[ids] = pd.read_csv(csv_path, usecols=ids, dtype=str, keep_default_na=False)[ids]
    return table
