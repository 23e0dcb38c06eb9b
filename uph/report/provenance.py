"""results/provenance.json: what produced a run, so a reader can tell two runs' numbers apart.

The resolved config (defaults filled in), the code's git commit, whether tracked files differed
from it and a hash of the code files, per table the code version that computed it (flagged
`older_code` when that is not the code of this run), Python, platform and package versions, the model's identity (source, sizes, weight and
tokenizer hashes), every seed in the config, the machine that wrote it (CPU model and vector extensions, cores, the
settings that cap torch's CPU kernels), per rule what its jobs ran on (hosts, devices and their
names, dtypes, matmul precision, the CPU kernels torch ran and its threads, TF32 and determinism on CUDA: the `<log>.device.json` each job writes
beside its log, uph.logs), the host that wrote the record, and the wall time per rule summed over that
rule's jobs from the `benchmark:` files present, each file attributed to the rule whose benchmark
pattern (wildcards and their constraints, as Snakemake matches them) it matches, with their CPU-seconds
(the `<log>.cpu.json` each job writes). Torch-free.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import socket
import sys
from importlib import metadata
from pathlib import Path

import pandas as pd
from snakemake.io import regex_from_filepattern

from uph.config import key_path
from uph.device import machine_record
from uph.errors import ArtifactError
from uph.io import TABLE_COMPANIONS, code_version, git_state  # noqa: F401 (git_state: part of this module's interface)

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "gguf",
    "snakemake",
    "pandas",
    "numpy",
    "pyarrow",
    "matplotlib",
)


def package_versions(names=PACKAGES) -> dict:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def config_seeds(config: dict, path: tuple = ()) -> dict:
    """Every config key named `seed`, `seeds` or `*_seed`, by its dotted path."""
    seeds = {}
    for key, value in config.items():
        if isinstance(value, dict):
            seeds.update(config_seeds(value, (*path, key)))
        elif key in ("seed", "seeds") or key.endswith("_seed"):
            seeds[key_path((*path, key))] = value
    return seeds


PEAKS = ("peak_allocated_mib", "peak_reserved_mib")  # a CUDA job's peak device memory (uph.device.peak_device_memory)


def rule_devices(logs_dir: str | Path) -> dict:
    """rule -> {'jobs': n, and per key of the jobs' records (host, device, device_name, dtype, ...) the
    distinct values, sorted; for a peak of device memory (PEAKS) the largest of any job}, from every
    `<log>.device.json` under `logs_dir` (uph.logs.record_device). A job run before jobs recorded their
    device has no record: 'jobs' counts the records."""
    values, jobs = {}, {}
    for path in sorted(Path(logs_dir).rglob("*.device.json")):
        try:
            record = json.loads(path.read_text())
            rule = record.pop("rule")
        except (ValueError, KeyError, AttributeError):
            raise ArtifactError(
                f"device record '{path}' is damaged; delete it (its job's device goes unrecorded) or rerun that job"
            ) from None
        jobs[rule] = jobs.get(rule, 0) + 1
        for key, value in record.items():
            values.setdefault(rule, {}).setdefault(key, set()).add(value)
    return {
        rule: {
            "jobs": jobs[rule],
            **{key: max(seen) if key in PEAKS else sorted(seen, key=str) for key, seen in sorted(values[rule].items())},
        }
        for rule in sorted(jobs)
    }


def rule_cpu_seconds(logs_dir: str | Path) -> dict:
    """rule -> (jobs, CPU-seconds summed over them), from every `<log>.cpu.json` under `logs_dir` (uph.logs)."""
    totals = {}
    for path in sorted(Path(logs_dir).rglob("*.cpu.json")):
        try:
            record = json.loads(path.read_text())
            rule, seconds = record["rule"], float(record["cpu_seconds"])
        except (ValueError, KeyError, TypeError):
            raise ArtifactError(f"CPU record '{path}' is damaged; delete it or rerun that job") from None
        jobs, total = totals.get(rule, (0, 0.0))
        totals[rule] = (jobs + 1, total + seconds)
    return totals


def rule_wall_times(
    benchmark_patterns: dict, exclude_rule: str | None = None, recorded_cpu: dict | None = None
) -> dict:
    """rule -> {'jobs': n, 'seconds': wall seconds summed over its jobs, 'cpu_seconds': their CPU seconds
    (user and system of each job's process: what a job computed, whatever it waited for, a run paused or
    cores shared), 'peak_rss_mb': the largest resident memory of any of its jobs (Snakemake's max_rss, MB;
    None where none was measured)}. The CPU-seconds are `recorded_cpu`'s (rule_cpu_seconds) where it holds as many
    jobs as the benchmark files, else Snakemake's cpu_time: a lower bound, as Snakemake samples it every
    0.5 s for a job's first 15 s, then every 30 s, and not at its end. `benchmark_patterns`: rule ->
    its `benchmark:` file pattern, e.g. 'results/benchmarks/extract-{shard}.tsv'; every file present
    in those patterns' folders counts for the first rule whose pattern it matches."""
    regexes = {
        rule: re.compile(regex_from_filepattern(pattern))
        for rule, pattern in benchmark_patterns.items()
        if rule != exclude_rule
    }
    folders = sorted({Path(pattern).parent for pattern in benchmark_patterns.values()})
    times = {}
    for path in (path for folder in folders for path in sorted(folder.glob("*.tsv"))):
        rule = next((rule for rule, regex in regexes.items() if regex.fullmatch(path.as_posix())), None)
        if rule is not None:
            jobs, seconds, sampled, rss = times.get(rule, (0, 0.0, 0.0, []))
            benchmark = pd.read_csv(path, sep="\t")
            rss = [*rss, *pd.to_numeric(benchmark["max_rss"], errors="coerce").dropna()]
            sampled += float(pd.to_numeric(benchmark["cpu_time"], errors="coerce").fillna(0).sum())
            times[rule] = (jobs + 1, seconds + float(benchmark["s"].sum()), sampled, rss)
    recorded = recorded_cpu or {}
    return {
        rule: {
            "jobs": jobs,
            "seconds": round(seconds, 2),
            "cpu_seconds": round(recorded[rule][1] if recorded.get(rule, (0,))[0] == jobs else sampled, 2),
            "peak_rss_mb": round(max(rss), 1) if rss else None,
        }
        for rule, (jobs, seconds, sampled, rss) in sorted(times.items())
    }


def table_code(tables_dir: str | Path, current: dict) -> dict:
    """table name -> the code version that computed it (the .code.json uph.io.write_table writes beside
    it), with 'older_code': true where that differs from the `current` code (a table not rerun since)."""
    tables, suffix = {}, TABLE_COMPANIONS["code"]
    for stamp in sorted(Path(tables_dir).glob(f"*{suffix}")):
        recorded = json.loads(stamp.read_text())
        older = recorded.get("code_sha256") != current["code_sha256"]
        tables[stamp.name.removesuffix(suffix)] = {**recorded, "older_code": older}
    return tables


def provenance(
    config: dict,
    model_identity: dict,
    repo: str | Path,
    benchmark_patterns: dict,
    exclude_rule: str | None = None,
    tables_dir: str | Path | None = None,
    logs_dir: str | Path | None = None,
) -> dict:
    """The record; `exclude_rule`: the rule writing it, whose benchmark file is not written yet;
    `tables_dir`: the folder of the tables whose code versions it lists; `logs_dir`: the folder of the
    jobs' logs and device records."""
    code = code_version(repo)
    return {
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "git": {"commit": code["commit"], "dirty": code["dirty"]},
        "code_sha256": code["code_sha256"],
        "tables": table_code(tables_dir, code) if tables_dir else {},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "model": model_identity,
        "seeds": config_seeds(config),
        "host": socket.gethostname(),  # of this record's job; each rule's jobs: devices_per_rule
        "machine": machine_record(),  # of this record's job: CPU, cores, kernel caps
        "devices_per_rule": rule_devices(logs_dir) if logs_dir else {},
        "wall_seconds_per_rule": rule_wall_times(
            benchmark_patterns, exclude_rule, rule_cpu_seconds(logs_dir) if logs_dir else None
        ),
    }
