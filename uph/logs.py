"""Logging for workflow scripts: to the rule's log file and the console, one line per bad input."""
from __future__ import annotations

import contextlib
import logging
import sys
import time

from uph.errors import UphError


@contextlib.contextmanager
def rule_logging(snakemake):
    """Log to the rule's `log:` file and stderr; turn a `UphError` into one line and exit 1."""
    name = snakemake.rule
    handlers = [logging.StreamHandler(sys.stderr)]
    if snakemake.log:
        handlers.append(logging.FileHandler(snakemake.log[0], mode="w"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s {name} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    log = logging.getLogger(f"uph.{name}")
    start = time.perf_counter()
    try:
        yield log
    except UphError as error:
        log.error("%s", error)
        sys.exit(1)
    log.info("done in %.1f s", time.perf_counter() - start)
