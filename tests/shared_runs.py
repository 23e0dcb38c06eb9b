"""Whole-study runs that every process of one pytest run shares (pytest-xdist's workers, or pytest alone).

The first process to ask starts a run in the background, at its session's start; any process then waits for
the run's result. A run's folder lies in the pytest run's base folder (`run_root`), so each worker finds the
same one: `<name>/` holds the run's files, `<name>/result.json` appears (written whole, then renamed) once
it ended, and `<name>.lock` makes "start it unless another process did" one step.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

# launch(folder) -> (finish, stop): it starts the run; finish() waits for it and returns its result (JSON
# data), stop() ends it where it is.
Launch = Callable[[Path], tuple[Callable[[], dict], Callable[[], None]]]


def run_root(base_temp: Path) -> Path:
    """The folder every process of this pytest run shares: pytest-xdist gives each worker a base folder
    below the run's own."""
    return base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp


def failure(error: Exception) -> dict:
    """The result of a run that raised `error`: `SharedRun.result` raises it again, in every reader."""
    return {"error": f"{type(error).__name__}: {error}"}


class SharedRun:
    """One run of the pytest run, by its name."""

    def __init__(self, root: Path, name: str):
        self.folder = root / name
        self.started_here: tuple[threading.Thread, Callable[[], None]] | None = None

    def start(self, launch: Launch) -> None:
        """Start the run in the background, unless another process of the pytest run did."""
        with FileLock(f"{self.folder}.lock"):
            if self.folder.exists():
                return
            self.folder.mkdir()
        try:
            finish, stop = launch(self.folder)
        except Exception as error:  # a cluster that does not start: its tests fail, not every test
            self._write(failure(error))
            return

        def wait() -> None:
            try:
                self._write(finish())
            except Exception as error:
                self._write(failure(error))

        thread = threading.Thread(target=wait, name=f"shared run {self.folder.name}", daemon=True)
        thread.start()
        self.started_here = (thread, stop)

    def result(self, timeout: float = 1800) -> dict:
        """The run's result, once it ended (the run's error raised, where it had one)."""
        path, deadline = self.folder / "result.json", time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.folder.name}: no result after {timeout:.0f} s")
            time.sleep(0.2)
        result = json.loads(path.read_text())
        if "error" in result:
            raise RuntimeError(f"{self.folder.name}: {result['error']}")
        return result

    def end(self, stop: bool) -> None:
        """Where this process started the run: stop it (`stop`), or wait for it, since another process may
        still read it."""
        if self.started_here is not None:
            thread, stop_run = self.started_here
            if stop:
                stop_run()
            thread.join()

    def _write(self, result: dict) -> None:
        temporary = self.folder / ".result.json.tmp"
        temporary.write_text(json.dumps(result))
        temporary.rename(self.folder / "result.json")
