"""The results folder: written as the rules spell their paths, writable, and written by one checkout."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from uph.errors import ConfigError


def results_folder(results: str, cwd: str | Path | None = None) -> str:
    """Config key `results` as the rules spell their paths, so that every spelling of one folder names the
    same files and a target given either way matches them: normalized (os.path.normpath: `./runs/x` and
    `runs/x/` are `runs/x`), relative where it lies under the working directory `cwd` (default: the
    current one; its absolute path too), else absolute. A symlink stays as written: the folder it points to
    is read and written through it."""
    cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
    absolute = os.path.normpath(os.path.join(cwd, results))
    relative = os.path.relpath(absolute, cwd)
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def check_results_folder(results: str | Path) -> None:
    """The results folder, or else the nearest folder above it that exists, must be a folder this
    process can write to; otherwise every job would fail, and a long one only at its end."""
    path = Path(results).absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    problem = (
        "is not a folder"
        if not existing.is_dir()
        else "is not writable"
        if not os.access(existing, os.W_OK | os.X_OK)
        else None
    )
    if problem and existing == path:
        raise ConfigError(f"config key 'results': folder '{results}' {problem}")
    if problem:
        raise ConfigError(f"config key 'results': folder '{results}' cannot be created: '{existing}' {problem}")


CHECKOUT_FILE = ".uph-checkout"


def claim_results_folder(results: str | Path, checkout: str | Path) -> None:
    """One checkout writes a results folder: the first run names its checkout in `<results>/.uph-checkout`,
    and a run from another checkout is refused, so two versions of the code never interleave their
    outputs in one folder (Snakemake's own lock lives in each working directory, not in `results`)."""
    marker, checkout = Path(results) / CHECKOUT_FILE, str(Path(checkout).resolve())
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        claim = marker.with_name(f"{CHECKOUT_FILE}.{os.getpid()}")
        claim.write_text(checkout + "\n")
        with contextlib.suppress(FileExistsError):  # another run claimed it first: its claim stands
            os.link(claim, marker)
        claim.unlink()
    owner = marker.read_text().strip()
    if owner != checkout:
        raise ConfigError(
            f"config key 'results': folder '{results}' is written by the checkout '{owner}' ({marker}); give "
            f"this checkout ('{checkout}') its own results folder, or delete that file to hand the folder over"
        )
