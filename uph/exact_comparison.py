"""The exact half of `make compare`: where two runs computed on the same numerics, every table must be the
same to its printed digits.

On a CPU the study repeats bit for bit: the same config, code and inputs on the same CPU model, torch,
kernel caps, dtypes and threads give the same bytes (uph.device, "Determinism"). So where two runs'
provenance records the same of each (`numerics`), a regeneration is held to every table's text, seeded ones
included, cell by cell (wall-clock columns aside: a Comparison's `timings`); any other value is a change,
and the first of each table is named by its row and column. Where they differ, or one run does not record
them, the comparison is statistical (uph.compare, uph.seeded_comparison) and says which settings differ.

What `numerics` reads from provenance.json:
- the CPU: its name and the vector extensions that change float32 kernels (machine.cpu), and its vendor,
  family, model and stepping where both runs record them (machine.cpu_identity; a provenance written before
  it was recorded is compared on the name and extensions alone);
- torch's version;
- the kernel caps (uph.device.KERNEL_SETTINGS) of the provenance job's environment, and each job's where
  both runs record them; the CPU kernels torch ran (AVX512, AVX2, ...) and the threads of every job;
- each job's device and compute dtype: every job must have run on the CPU (CUDA's training kernels
  accumulate with atomics and repeat only to a tolerance);
- the settings that cut the same computation into other pieces and so move rounding (extraction's batch and
  shards, the stacked GPU rounds); fit.jobs is not one of them: its cuts give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from uph.tables import TABLES

NOT_RECORDED = "not recorded"
# Settings that cut or batch the same computation: tables agree across them, so compare holds runs of either to
# one reference (tests/test_reliability.py holds fit.jobs to byte-identical tables; extraction batches and
# shards, and fit.gpu_jobs' stacked rounds, move values by rounding only, so they are numerics too)
CUTS = ("extract.batch_size", "extract.shards", "fit.jobs", "fit.gpu_jobs")
ROUNDING_CUTS = tuple(key for key in CUTS if key != "fit.jobs")
ONLY_WHERE_BOTH = ("CPU identity", "each job's kernel caps")  # older provenance lacks them
SHOWN_PER_TABLE = 5  # differing cells named per table; the rest counted


def _over_jobs(devices: dict, key: str) -> list | str:
    """The distinct values of `key` over every job's device record (provenance's devices_per_rule)."""
    values = sorted({str(v) for entry in devices.values() for v in entry.get(key, [])})
    return values or NOT_RECORDED


def numerics(provenance: dict) -> dict:
    """What decides a run's bytes beyond its config and code (module docstring), by name."""
    machine = provenance.get("machine")
    machine = machine if isinstance(machine, dict) else {}
    devices = provenance.get("devices_per_rule") or {}
    config = provenance.get("config", {})
    return {
        "CPU": machine.get("cpu", NOT_RECORDED),
        "CPU identity": machine.get("cpu_identity", NOT_RECORDED),
        "torch": (provenance.get("packages") or {}).get("torch", NOT_RECORDED),
        "kernel caps": machine.get("kernel_settings", NOT_RECORDED),
        "each job's kernel caps": _over_jobs(devices, "kernel_settings"),
        "CPU kernels": _over_jobs(devices, "cpu_capability"),
        "threads per job": _over_jobs(devices, "threads"),
        "devices": _over_jobs(devices, "device"),
        "dtypes": _over_jobs(devices, "dtype"),
        **{key: (config.get(key.split(".")[0]) or {}).get(key.split(".")[1]) for key in ROUNDING_CUTS},
    }


def numerics_differences(a: dict, b: dict) -> list[str]:
    """Why two runs' numerics (`numerics` of each) cannot be held to the same bytes, one reason a line; empty
    where they can."""
    reasons = []
    for key in a:
        if key in ONLY_WHERE_BOTH and NOT_RECORDED in (a[key], b[key]):
            continue
        if a[key] == NOT_RECORDED or b[key] == NOT_RECORDED:
            reasons.append(f"{key}: {json.dumps(a[key])} against {json.dumps(b[key])} (not recorded by both)")
        elif a[key] != b[key]:
            reasons.append(f"{key}: {json.dumps(a[key])} against {json.dumps(b[key])}")
    for side, recorded in (("RESULTS", a), ("REFERENCE", b)):
        if recorded["devices"] not in (["cpu"], NOT_RECORDED):
            reasons.append(f"{side}'s jobs ran on {', '.join(recorded['devices'])}: only CPU jobs repeat bit for bit")
    return reasons


def read_text_table(path: Path) -> pd.DataFrame:
    """A table's CSV as its text: every cell a string as printed, an empty cell ''."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def exact_differences(name: str, a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Each cell where table `name` of RESULTS (`a`) and of REFERENCE (`b`), read as text (read_text_table),
    differ, row by row in file order, its timings aside: the first SHOWN_PER_TABLE named by the row's keys
    and column, then a count. The columns are the same (checked before)."""
    reading = TABLES[name].compared
    columns = [c for c in a.columns if c not in reading.timings]
    lines = []
    if len(a) != len(b):
        lines.append(f"{name}: {len(a)} rows against {len(b)} (the same rows, to the byte)")
    n = min(len(a), len(b))
    left, right = a[columns].iloc[:n].to_numpy(), b[columns].iloc[:n].to_numpy()
    rows, cols = (left != right).nonzero()
    keys = reading.keys or tuple(columns)
    for row, col in list(zip(rows, cols))[:SHOWN_PER_TABLE]:
        named = ", ".join(f"{k}={a.at[row, k]}" for k in keys if k in a.columns and a.at[row, k] != "")
        lines.append(
            f"{name} row {row + 2} [{named}] {columns[col]}: {left[row, col] or '(empty)'} against "
            f"{right[row, col] or '(empty)'} (exact: the same text)"
        )
    if len(rows) > SHOWN_PER_TABLE:
        lines.append(f"{name}: {len(rows) - SHOWN_PER_TABLE} more cells differ (exact)")
    return lines
