"""Logging for workflow scripts: to the rule's log file and the console, one line per bad input.

Fault injection for testing retries: with the environment variable UPH_FAIL_ONCE=<rule name>, the
first attempt of each job of that rule exits 1 before any work and leaves `<its log>.failed-once`
behind; the next attempt (Snakemake's --retries, locally or on the cluster) finds the marker and runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from uph.errors import UphError


@contextlib.contextmanager
def rule_logging(snakemake):
    """Log to the rule's `log:` file and stderr; turn a `UphError` into one line and exit 1."""
    name = snakemake.rule
    handlers = [logging.StreamHandler(sys.stderr)]
    if snakemake.log:
        handlers.append(logging.FileHandler(snakemake.log[0], mode="w"))
    logging.basicConfig(
        level=logging.INFO,
        handlers=handlers,
        force=True,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    log = logging.getLogger(f"uph.{name}")
    fail_once(snakemake, log)
    start = time.perf_counter()
    try:
        yield log
    except UphError as error:
        log.error("%s", error)
        sys.exit(1)
    log.info("done in %.1f s", time.perf_counter() - start)


def fail_once(snakemake, log: logging.Logger) -> None:
    """Exit 1 on the first attempt of a job of the rule named by UPH_FAIL_ONCE (see the module docstring)."""
    if os.environ.get("UPH_FAIL_ONCE") != snakemake.rule or not snakemake.log:
        return
    marker = Path(f"{snakemake.log[0]}.failed-once")
    if not marker.exists():
        marker.touch()
        log.error("UPH_FAIL_ONCE=%s: failing this first attempt on purpose", snakemake.rule)
        sys.exit(1)
