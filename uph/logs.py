"""Logging for workflow scripts: to the rule's log file and the console, one line per bad input.

Every job logs one line saying what it runs on and leaves the same as JSON beside its log,
`<log>.device.json` (uph.device: host, device and its name, dtype, matmul precision, TF32 and
determinism on CUDA; a CUDA job adds its peak device memory when it ends, uph.device.peak_device_memory);
results/provenance.json gathers them per rule. A job with a device (uph.device.job_device) sets
up its device first (uph.device.setup_device); any other job records its host and CPU without
importing torch. A job that ends well leaves its CPU-seconds beside its log, `<log>.cpu.json` (its
process's user and system time from its start, imports included: what Snakemake's benchmark `cpu_time`
samples, and misses the last seconds of), and writes its record last (uph.records): what made its outputs.

Fault injection for testing retries: with the environment variable UPH_FAIL_ONCE=<rule name>, the
first attempt of each job of that rule exits 1 before any work and leaves `<its log>.failed-once`
behind; the next attempt (Snakemake's --retries, locally or on the cluster) finds the marker and runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
from pathlib import Path

from uph.device import (
    TRAINING_RULES,
    describe,
    device_record,
    host_record,
    job_device,
    peak_device_memory,
    resolve_dtype,
    setup_device,
)
from uph.errors import UphError
from uph.io import write_json
from uph.records import write_record


@contextlib.contextmanager
def rule_logging(snakemake):
    """Log to the rule's `log:` file and stderr; turn a `UphError` (a write that fails included: read-only,
    not a file, disk full; uph.io.atomic_path) into one line and exit 1. Once the job's work is done, a
    bookkeeping write that fails (its record, its device's peak) is one line too, and the job still ends
    well: Snakemake would delete the outputs of a failed job, and without its record the next run does the
    job again (uph.records)."""
    name = snakemake.rule
    log = start_logging(snakemake)
    fail_once(snakemake, log)
    start = time.perf_counter()
    try:
        record = record_device(snakemake, log)
        yield log
    except UphError as error:
        log.error("%s", error)
        sys.exit(1)
    try:
        if peak := peak_device_memory(record):
            log.info(
                "peak device memory: %(peak_allocated_mib)d MiB allocated, %(peak_reserved_mib)d MiB reserved", peak
            )
            if snakemake.log:
                write_json({**record, **peak}, f"{snakemake.log[0]}.device.json")
        if snakemake.log:
            write_json({"rule": name, "cpu_seconds": round(process_cpu_seconds(), 2)}, f"{snakemake.log[0]}.cpu.json")
        record_job(snakemake)
    except UphError as error:
        log.error(
            "the outputs are written and kept, the bookkeeping is not: %s (the next run does %s again)", error, name
        )
    log.info("done in %.1f s", time.perf_counter() - start)


def process_cpu_seconds() -> float:
    """User and system CPU-seconds of this process since it started, and of the children it waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def start_logging(snakemake) -> logging.Logger:
    """The job's logger: to stderr and its `log:` file, each line stamped with the time and the rule. A log
    file that cannot be opened ends the job in one line, before any work."""
    name = snakemake.rule
    handlers = [logging.StreamHandler(sys.stderr)]
    try:
        if snakemake.log:
            handlers.append(logging.FileHandler(snakemake.log[0], mode="w"))
    except OSError as error:
        sys.exit(
            f"{name}: cannot write its log '{snakemake.log[0]}' ({error.strerror}); make the folder writable or "
            "choose another 'results' folder and run snakemake again"
        )
    logging.basicConfig(
        level=logging.INFO,
        handlers=handlers,
        force=True,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    return logging.getLogger(f"uph.{name}")


def record_job(snakemake) -> None:
    """The job's record beside its outputs (uph.records): its params, its inputs' and outputs' digests."""
    write_record(
        snakemake.config["results"],
        snakemake.rule,
        dict(snakemake.wildcards.items()),
        dict(snakemake.params.items()),
        list(snakemake.input),
        list(snakemake.output),
    )


def record_device(snakemake, log: logging.Logger) -> dict:
    """Set up the job's device (a job with one: uph.device.setup_device, once, before any work), log what
    the job runs on in one line and write it to `<log>.device.json`, then how long the set-up took. Torch
    is imported only by a job with a device."""
    configured = job_device(snakemake.rule, snakemake.config)
    start = time.perf_counter()
    if configured is None:
        record = host_record()
    else:
        device = setup_device(configured, deterministic=snakemake.rule not in TRAINING_RULES)
        record = device_record(device, job_dtype(snakemake.params, device))
    seconds = time.perf_counter() - start
    record = {"rule": snakemake.rule, **record}
    log.info("%s", describe(record))
    if configured is not None:  # torch's CUDA initialization, once a job (and importing torch, where the script
        log.info("device set up in %.1f s", seconds)  # had not): benchmarks/bench_startup.py times its pieces
    if snakemake.log:
        write_json(record, f"{snakemake.log[0]}.device.json")
    return record


def job_dtype(params, device):
    """The compute dtype of a job that has one: extraction's `extract.dtype` as resolved on this
    machine, the copy task's autocast `copy_task.dtype`; else None."""
    extract, copy_task = getattr(params, "extract", None), getattr(params, "copy_task", None)
    if extract is not None:
        return resolve_dtype(extract["dtype"], device)
    return None if copy_task is None else copy_task.get("dtype")


def fail_once(snakemake, log: logging.Logger) -> None:
    """Exit 1 on the first attempt of a job of the rule named by UPH_FAIL_ONCE (see the module docstring)."""
    if os.environ.get("UPH_FAIL_ONCE") != snakemake.rule or not snakemake.log:
        return
    marker = Path(f"{snakemake.log[0]}.failed-once")
    if not marker.exists():
        marker.touch()
        log.error("UPH_FAIL_ONCE=%s: failing this first attempt on purpose", snakemake.rule)
        sys.exit(1)
