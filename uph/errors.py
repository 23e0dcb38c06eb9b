"""Errors about the user's input. Each message is one line naming the key, file or user at fault;
workflow scripts print it as is, without a traceback (and a job stopped by Ctrl-C prints none:
`quiet_interrupts`, which every workflow script runs first, importing uph.job_start)."""

import signal
import sys
import threading


class UphError(ValueError):
    """Base class: bad input the user can fix."""


class ConfigError(UphError):
    """A config value is wrong; the message names the key."""


class CorpusError(UphError):
    """The corpus cannot be used as given; the message names the file, column or user."""


class ModelError(UphError):
    """The model source cannot be loaded; the message names it."""


class ArtifactError(UphError):
    """A file a job wrote for later jobs is missing, damaged or was built for something else; the
    message names it and the command that rebuilds it (uph.artifacts)."""


class CacheError(ArtifactError):
    """A hidden-state cache file is missing, damaged or was built for something else."""


class FitDivergedError(UphError):
    """A theta fit produced a NaN or inf; the message names the user and the configuration."""


class TrainingDivergedError(UphError):
    """A training run (copy task, feedback) reached a NaN or inf loss; the message names the run,
    the step and the config key to lower."""


def workflow_job():
    """The `snakemake` object of the workflow script this process runs (Snakemake's preamble puts it in
    `__main__` before the script's first import), else None."""
    job = getattr(sys.modules.get("__main__"), "snakemake", None)
    return job if type(job).__module__.startswith("snakemake.") else None


def quiet_interrupts() -> None:
    """In a workflow job, Ctrl-C (SIGINT, which the terminal sends to Snakemake and to every job) ends the
    job with status 130 and no traceback: Snakemake reports each stopped job once, and a rerun resumes
    where it stopped. The stop unwinds the job as KeyboardInterrupt would (a half-written output's
    temporary file is removed). Elsewhere (tests, a notebook), and where SIGINT is not Python's own
    handler, nothing changes."""
    if workflow_job() is None or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        raise SystemExit(130)

    signal.signal(signal.SIGINT, stop)
