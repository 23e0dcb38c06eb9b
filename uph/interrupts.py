"""Ctrl-C in a snakemake run: one line and exit status 130, whenever it comes.

While the Snakefile is read and the DAG of jobs is built, no job runs and nothing of the results folder
is written (uph.records checks, never writes): a Ctrl-C then prints one line and ends the process with
status 130 (`quiet_while_building`), where Python would print a traceback of whatever code it stopped.
Once Snakemake holds its lock, its own handling takes over: it stops the jobs (each ends with status 130,
uph.errors.quiet_interrupts), releases the lock, and the run exits 130 (`noting`, `exit_status`), as a
command a shell's Ctrl-C stopped does, not 1 as a failed one.
"""

from __future__ import annotations

import os
import signal
import sys

STOPPED_BUILDING = "Stopped by Ctrl-C while building the DAG of jobs: no job ran, and the results folder is as it was."


def _holds_lock(workflow) -> bool:
    """Whether Snakemake holds its lock on the working directory (taken once the DAG is built)."""
    return bool(getattr(getattr(workflow, "_persistence", None), "_lockfile", None))


def quiet_while_building(workflow) -> None:
    """Until Snakemake holds its lock, Ctrl-C prints STOPPED_BUILDING and exits 130 (main process only; a
    run in the background, which ignores SIGINT, keeps ignoring it)."""
    if not workflow.is_main_process or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return

    def stop(signum, frame):
        if _holds_lock(workflow):
            raise KeyboardInterrupt
        print(STOPPED_BUILDING, file=sys.stderr, flush=True)
        os._exit(130)

    signal.signal(signal.SIGINT, stop)


INTERRUPTED: list[int] = []  # Ctrl-C seen while jobs ran (noting)


def noting(workflow) -> None:
    """onstart: from here Snakemake handles Ctrl-C (it stops the jobs and releases its lock); note that one
    came, so that `exit_status` makes the run's status 130."""
    if not workflow.is_main_process or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return

    def noted(signum, frame):
        INTERRUPTED.append(signum)
        return signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, noted)


def exit_status(failed: bool) -> None:
    """onsuccess and onerror: a Ctrl-C from here on only notes itself (Python's would print a traceback of
    the interpreter's shutdown); a run stopped by Ctrl-C exits 130."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: INTERRUPTED.append(signum))
    if failed and INTERRUPTED:
        raise SystemExit(130)
