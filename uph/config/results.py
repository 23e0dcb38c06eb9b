"""The results folder: written as the rules spell their paths, writable, written by one checkout, one run at a
time."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from uph.errors import ConfigError


def path_as_written(path: str, cwd: str | Path | None = None) -> str:
    """A path the config names, in the one spelling the rules and the records use: normalized
    (os.path.normpath: `./runs/x` and `runs/x/` are `runs/x`); relative where it lies under the working
    directory `cwd` (default: the current one; its absolute path too); outside it, relative or absolute as
    written (`../runs/x` stays relative, so a target spelled the same way from that working directory names
    the rules' files). A symlink stays as written: what it points to is read and written through it."""
    cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
    absolute = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    relative = os.path.relpath(absolute, cwd)
    outside = relative == os.pardir or relative.startswith(os.pardir + os.sep)
    return absolute if outside and os.path.isabs(os.path.expanduser(path)) else relative


def results_folder(results: str, cwd: str | Path | None = None) -> str:
    """Config key `results` as the rules spell their paths (path_as_written), so that a target spelled
    as the config spells the folder matches their outputs."""
    return path_as_written(results, cwd)


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


LOCK_FILE = ".uph-run.lock"
_HELD: list = []  # the open lock file of the results folder this process runs on (hold_results_folder)


def hold_results_folder(results: str | Path) -> None:
    """One run at a time on a results folder, from any working directory (Snakemake's own lock lives in the
    working directory's .snakemake/): an exclusive lock (flock) on `<results>/.uph-run.lock`, held until
    this process ends, which writes its host and process id there. A second run is refused in one line
    naming the folder and the first run's host and process. Called once a run starts jobs (onstart): a dry
    run, which writes nothing, needs none. A filesystem without locks (some network ones) holds none."""
    import fcntl
    import socket

    if _HELD:
        return
    path = Path(results) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held open for the run: closing it would release the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that wrote no name"
        handle.close()
        raise ConfigError(
            f"results folder '{results}' is in use by another run ({holder}); wait for it to end, or give this "
            "run another folder (config key 'results')"
        ) from None
    except OSError:  # no locks on this filesystem
        handle.close()
        return
    handle.seek(0)
    handle.truncate()
    handle.write(f"host {socket.gethostname()}, process {os.getpid()}\n")
    handle.flush()
    _HELD.append(handle)
