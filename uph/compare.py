"""`make compare`: does a regeneration of the study agree with a reference run of the same config?

    python -m uph.compare RESULTS [--reference REFERENCE]

RESULTS is a results folder; REFERENCE another, or a committed reference (reference/<name>/: its tables/,
summary.md and provenance.json, which holds the config that made it). Without --reference, the committed
reference made with RESULTS' config is used. Each disagreement is one line (table, row, column, both
values, the tolerance), then a verdict. Exit 0: they agree; 1: they do not; 2: they cannot be compared, one
line a reason, each naming its file (another config; a provenance.json missing, damaged or without its
config; a table missing, extra, unreadable or with other columns).

Two modes (--mode; auto picks):
- **exact**, where both runs' provenance records the same numerics: CPU model and extensions, torch, kernel
  caps, CPU kernels, threads, dtypes, every job on the CPU (uph.exact_comparison). The study repeats bit for
  bit there, so every table, seeded ones included, must be the same text, cell by cell (timings aside); the
  verdict names the first differing row and column of each table.
- **statistical** otherwise, and the verdict names which numerics differ. Every table of uph.tables.TABLES
  and every answer of the summary is compared as below.

What "agree" means in the statistical mode, per kind of number (each table's Comparison, uph.tables, says
which column is which):

- **The language-model tables** (personalization, capacity, dose_response, cross_user) are float32
  computations whose kernels, and so summation order, differ across CPUs and devices. Each hidden state
  comes out of about layers x width multiply-adds (30 x 576 for the embedded model), whose rounding
  errors of 2^-24 accumulate like a random walk: sqrt(17,280) x 6e-8 = 8e-6 relative, and the exact
  solver stops anywhere within fit.tol (1e-5) of the optimum, which moves an NLL in its fifth decimal
  (docs/performance.md). So NLLs, their changes and intervals agree within NLL_RTOL = 1e-5 of the table's NLL
  scale (its largest |NLL|, about 5 nats: 5e-5, against effects of 1e-3 to 1e-1); theta norms within
  1e-3 relative; certificates are no worse than max(fit.tol, twice the reference's); users counted
  (improved, on the ball) within one user, who may sit within rounding of the threshold; the rest
  (users, parameters) exactly.
- **Choices made on validation**: a radius, a temperature or an edge flag that differs is reported with
  its validation margin, the two choices' validation NLLs in each run: within the tolerance above in
  both runs it is a near tie, named and not counted (its point is compared no further); a larger margin
  is a disagreement. An attention cell's lr that differs is a disagreement, its margin (the two lrs'
  paired validation accuracies over the sweep seeds) shown: the lr decides every number of the cell.
- **Seeded training** (attention, attention_sweep, copy_task, feedback): uph.seeded_comparison. Each
  row, and each run's rows averaged per seed, reads agree, differ or undetermined by a Welch interval of
  its seeds' means against the metric's margin (Bonferroni over every test), a bimodal cell's solving and
  stalling seeds apart; the shares of seeds that solve a bimodal cell are compared by an exact test; rows,
  seeds, NaNs, every row's lr and exact columns, the seeds' spread (no seed repeating another's values)
  and the protocol's seed counts must match, and each run's tables must agree with one another (its
  attention rows are its sweep's chosen runs). Undetermined rows are named with the smallest shift they
  would catch and do not fail the comparison. Training curves (attention_curves) are not compared row by
  row: their summaries are, in attention.
- **Exact tables** (gram_resilience): within float32's relative rounding.
- **Answers**: identical (yes, no, not shown, untested), question by question.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from uph.exact_comparison import CUTS, exact_differences, numerics, numerics_differences, read_text_table
from uph.io import read_table
from uph.seeded_comparison import (
    SeededFindings,
    consistent_runs,
    duplicated_rows,
    judge_means,
    row_name,
    shares_and_protocol,
    shown,
    structure_and_means,
    written_true,
)
from uph.stats import t_interval
from uph.tables import POINT, TABLES, Comparison

REPO = Path(__file__).resolve().parent.parent
REFERENCES = REPO / "reference"
NLL_RTOL = 1e-5  # of the table's NLL scale (module docstring)
NORM_RTOL = 1e-3
FLOAT32_RTOL = 2.0**-23


class CannotCompare(Exception):
    """A run that cannot be compared as it stands: the message is one line naming the file."""


@dataclass
class Report:
    """What a comparison found: disagreements (one line each), near ties (named, not counted), the
    seeded row-metrics that agree and those undetermined (named, not counted), notes (what was compared
    how), the mode (exact or statistical) with the numerics that kept it from exact, and whether the two
    could be compared at all."""

    disagreements: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    undetermined: list[str] = field(default_factory=list)  # seeded rows with metrics too few seeds tell apart
    power: list[str] = field(default_factory=list)  # per seeded table and metric, the smallest shift caught
    agreed: int = 0  # seeded row-metrics that agree within their margin
    incomparable: list[str] = field(default_factory=list)
    compared: dict = field(default_factory=dict)  # table -> values compared
    mode: str = ""  # "exact" or "statistical", once the runs could be compared
    numerics: list[str] = field(default_factory=list)  # why not exact (uph.exact_comparison)

    @property
    def exit_code(self) -> int:
        return 2 if self.incomparable else 1 if self.disagreements else 0


# -- which config made a folder ------------------------------------------------------------------------------


def read_provenance(folder: Path) -> dict:
    """`folder`'s provenance.json, which must hold the config that made the folder; CannotCompare where it
    is missing, damaged or without it."""
    path = folder / "provenance.json"
    if not path.is_file():
        raise CannotCompare(f"{path}: no such file: which config made '{folder}'?")
    try:
        provenance = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise CannotCompare(f"{path}: not JSON ({error})") from None
    if not isinstance(provenance, dict) or not isinstance(provenance.get("config"), dict):
        raise CannotCompare(f"{path}: holds no 'config' (the config that made the run)")
    return provenance


def flat_settings(provenance: dict) -> dict:
    """'section.key' -> value of the config in a provenance, less where the results go, the devices and
    kernel caps (rounding only, as CUTS) and CUTS."""
    flat = {}
    for section, value in provenance["config"].items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        flat.update({section if key is None else f"{section}.{key}": item for key, item in items})
    cut = {*CUTS, "results", "device", "cpu_kernels"}
    return {key: value for key, value in sorted(flat.items()) if key not in cut and not key.endswith(".device")}


def settings(folder: Path) -> dict | None:
    """flat_settings of the config that made the folder; None where its provenance cannot say."""
    try:
        return flat_settings(read_provenance(folder))
    except CannotCompare:
        return None


def setting_differences(a: dict, b: dict) -> list[str]:
    """Each setting the two configs hold differently, or only one of them holds, as 'key: a against b'."""
    return [
        f"{key}: {json.dumps(a.get(key, '(not recorded)'))} against {json.dumps(b.get(key, '(not recorded)'))}"
        for key in sorted(set(a) | set(b))
        if a.get(key, "(not recorded)") != b.get(key, "(not recorded)")
    ]


def find_reference(results: Path, references: Path = REFERENCES) -> Path | None:
    """The committed reference (a folder of `references`) made with `results`' config; CannotCompare where
    `results`' provenance cannot say which config that is."""
    own = flat_settings(read_provenance(results))
    for folder in sorted(path for path in references.glob("*") if path.is_dir()):
        if settings(folder) == own:
            return folder
    return None


# -- language-model tables -----------------------------------------------------------------------------------


def _aligned(name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame, report: Report):
    """The two tables' rows matched on reading.keys (NaN keys match NaN; the reference's columns suffixed
    _ref); rows only one has are disagreements. Their columns are the same (read_tables checked)."""
    for frame, side in ((a, "RESULTS"), (b, "REFERENCE")):
        report.disagreements += duplicated_rows(name, reading.keys, frame, side)
    keyed = [frame.assign(**{f"_k_{k}": frame[k].map(str) for k in reading.keys}) for frame in (a, b)]
    merged = keyed[0].merge(
        keyed[1], on=[f"_k_{k}" for k in reading.keys], how="outer", suffixes=("", "_ref"), indicator=True
    )
    for side, label in (("left_only", "RESULTS"), ("right_only", "REFERENCE")):
        for _, row in merged[merged["_merge"] == side].iterrows():
            values = [row[k] if side == "left_only" else row[f"{k}_ref"] for k in reading.keys]
            report.disagreements.append(f"{name} [{row_name(reading.keys, values)}]: a row only {label} has")
    return merged[merged["_merge"] == "both"]


def _differs(x, y) -> bool:
    """Whether two table values differ as text would (NaN equals NaN; 1 equals 1.0)."""
    if pd.isna(x) and pd.isna(y):
        return False
    try:
        return float(x) != float(y)
    except (TypeError, ValueError):
        return str(x) != str(y)


def compare_lm(name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame, tol: float, ties: set, report: Report):
    """A language-model table (module docstring): NLLs within NLL_RTOL of the reference table's NLL
    scale, norms, certificates, counts and exact columns; rows at a near-tie point (`ties`: POINT values)
    are left out of the numeric comparison."""
    merged = _aligned(name, reading, a, b, report)
    nll_columns = [
        c
        for c in a.columns
        if c
        not in (*reading.keys, *reading.choices, *reading.counts, *reading.exact, *reading.norms, *reading.certificates)
        and c not in reading.skipped
        and pd.api.types.is_numeric_dtype(a[c])
    ]
    scale = max((float(b[c].abs().max()) for c in nll_columns if b[c].notna().any()), default=1.0)
    n_users = merged["n_users_ref"] if "n_users" in a.columns else None
    compared = 0
    for _, row in merged.iterrows():
        point = tuple(str(row[k]) for k in POINT if k in reading.keys)
        where = f"{name} [{row_name(reading.keys, [row[k] for k in reading.keys])}]"
        if point in ties:
            continue
        for column in a.columns:
            if column in reading.keys or column in reading.skipped:
                continue
            x, y = row[column], row[f"{column}_ref"]
            compared += 1
            if pd.isna(x) and pd.isna(y):
                continue
            if column in reading.certificates:
                allowed = max(tol, 2 * float(y))
                if not float(x) <= allowed:
                    report.disagreements.append(
                        f"{where} {column}: {shown(x)} against {shown(y)} (at most max(fit.tol, 2 x reference) = {allowed:.3g})"
                    )
            elif column in reading.norms:
                if not abs(float(x) - float(y)) <= NORM_RTOL * abs(float(y)):
                    report.disagreements.append(
                        f"{where} {column}: {shown(x)} against {shown(y)} (within {NORM_RTOL:g} relative)"
                    )
            elif column in reading.counts:
                users = float(n_users[row.name]) if n_users is not None else 1.0
                unit = 1.0 if column.startswith("n_") else 1.0 / users
                if not abs(float(x) - float(y)) <= unit * (1 + 1e-5):  # a share's CSV digits (6) round it
                    report.disagreements.append(
                        f"{where} {column}: {shown(x)} against {shown(y)} (within one user: {unit:.3g})"
                    )
            elif column in nll_columns:
                if not abs(float(x) - float(y)) <= NLL_RTOL * scale:
                    report.disagreements.append(
                        f"{where} {column}: {shown(x)} against {shown(y)} "
                        f"(within {NLL_RTOL:g} x {scale:.3g} = {NLL_RTOL * scale:.2g} nats)"
                    )
            elif _differs(x, y):  # a choice (a near tie's rows are skipped above: capacity_ties names it) or exact
                what = "a choice made on validation, identical" if column in reading.choices else "identical"
                report.disagreements.append(f"{where} {column}: {shown(x)} against {shown(y)} ({what})")
    report.compared[name] = compared


def capacity_ties(a: pd.DataFrame, b: pd.DataFrame, report: Report) -> set:
    """The sweep points whose radius chosen on validation differs between the two capacity tables: each
    reported with its margin, the validation NLLs of the two radii in each run. A near tie (both margins
    within NLL_RTOL of the scale) is named and its point returned (its rows rest on the choice); a larger
    margin is a disagreement."""
    group = [*POINT, "arm", "train_tokens", "temperature"]
    scale = max(float(b["validation_nll"].abs().max()), 1.0)
    ties = set()
    chosen = {side: frame[written_true(frame["chosen"])] for side, frame in (("a", a), ("b", b))}
    key = lambda frame: frame[group].map(str).agg("|".join, axis=1)  # noqa: E731  (map: NaN as "nan")
    picks = [dict(zip(key(chosen[s]), chosen[s]["capacity"])) for s in ("a", "b")]
    curves = [frame.assign(_g=key(frame)) for frame in (a, b)]
    for g in sorted(set(picks[0]) & set(picks[1])):
        ra, rb = picks[0][g], picks[1][g]
        if ra == rb:
            continue
        margins = []
        for curve in curves:
            rows = curve[curve["_g"] == g].set_index("capacity")["validation_nll"]
            margins.append(float(rows.get(rb, math.nan) - rows.get(ra, math.nan)))
        what = (
            f"capacity [{g.replace('|', ', ')}]: radius {ra:g} chosen against {rb:g}; validation NLL of "
            f"{rb:g} minus {ra:g}: {margins[0]:+.2g} in RESULTS, {margins[1]:+.2g} in REFERENCE"
        )
        if all(abs(m) <= NLL_RTOL * scale for m in margins):
            report.near_ties.append(f"{what} (a near tie: within {NLL_RTOL * scale:.2g} nats)")
            ties.add(tuple(g.split("|")[: len(POINT)]))
        else:
            report.disagreements.append(f"{what} (beyond {NLL_RTOL * scale:.2g} nats: a real change)")
    return ties


# -- seeded training -----------------------------------------------------------------------------------------


def lr_choices(a: pd.DataFrame, b: pd.DataFrame, sweep_a, sweep_b, report: Report) -> None:
    """Each attention cell whose chosen lr differs: a disagreement (the lr decides every number of the
    cell), with its margin in each run, the paired differences of validation token accuracy between the
    two lrs over the sweep seeds both trained (mean and 95 % t interval)."""
    cell = ["task", "model", "attention"]
    lrs = [frame.groupby(cell)["lr"].unique() for frame in (a, b)]  # more than one: a structure disagreement
    for key in sorted(set(lrs[0].index) & set(lrs[1].index)):
        if len(lrs[0][key]) != 1 or len(lrs[1][key]) != 1:
            continue
        la, lb = float(lrs[0][key][0]), float(lrs[1][key][0])
        if la == lb:
            continue
        margins = []
        for sweep in (sweep_a, sweep_b):
            runs = sweep[(sweep[cell] == pd.Series(key, index=cell)).all(axis=1)]
            per = runs.pivot_table(index="seed", columns="lr", values="val_token_acc")
            if la not in per or lb not in per:
                margins.append("not both tried")
                continue
            diff = (per[la] - per[lb]).dropna()
            low, high = t_interval(diff) if len(diff) > 1 else (math.nan, math.nan)
            margins.append(f"{diff.mean():+.3f} [{low:+.3f}, {high:+.3f}] over {len(diff)} seeds")
        report.disagreements.append(
            f"attention [{row_name(tuple(cell), key)}]: lr {la:g} chosen against {lb:g} (a choice made on "
            f"validation, identical); validation token accuracy of {la:g} minus {lb:g}: {margins[0]} in RESULTS, "
            f"{margins[1]} in REFERENCE"
        )


def compare_seeded(tables: dict, seeds_if_split, report: Report) -> None:
    """The seeded tables of `tables` (uph.seeded_comparison; the curves are read for each run's consistency
    alone): structure, each run's tables against one another, means
    per row-metric and per run at Bonferroni's level over all of them, the bimodal cells' shares solved and
    the protocol's seed counts."""
    found = SeededFindings([], [], 0, {}, [])
    tests = []
    for name, (a, b) in tables.items():
        if TABLES[name].compared.kind == "seeded":
            tests += structure_and_means(name, TABLES[name].compared, a, b, found)
    for side, index in (("RESULTS", 0), ("REFERENCE", 1)):
        found.disagreements += consistent_runs(
            tables["attention"][index], tables["attention_sweep"][index], tables["attention_curves"][index], side
        )
    judge_means(tests, found)
    shares_and_protocol(*tables["attention"], TABLES["attention"].compared.cell, seeds_if_split, found)
    report.disagreements += found.disagreements
    report.undetermined += found.undetermined
    report.power += found.power
    report.agreed += found.agreed
    report.compared.update(found.compared)


def compare_float32(name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame, report: Report) -> None:
    """A table of exact arithmetic (Comparison kind "exact"): each value within float32's relative rounding."""
    merged = _aligned(name, reading, a, b, report)
    for _, row in merged.iterrows():
        for column in a.columns:
            if column in reading.keys:
                continue
            x, y = row[column], row[f"{column}_ref"]
            number = pd.api.types.is_numeric_dtype(a[column]) and not pd.api.types.is_bool_dtype(a[column])
            if pd.isna(x) or pd.isna(y):
                bad = not (pd.isna(x) and pd.isna(y))  # NaN against a number
            else:
                bad = abs(float(x) - float(y)) > FLOAT32_RTOL * abs(float(y)) if number else _differs(x, y)
            if bad:
                report.disagreements.append(
                    f"{name} [{row_name(reading.keys, [row[k] for k in reading.keys])}] {column}: {shown(x)} against "
                    f"{shown(y)} (within float32 rounding)"
                )
    report.compared[name] = len(merged) * (len(a.columns) - len(reading.keys))


# -- answers -------------------------------------------------------------------------------------------------


def tables_answers(tables: dict[str, pd.DataFrame]) -> list:
    """The study's answers (uph.report.answers), computed from its tables alone (no training curves)."""
    from uph.report.answers import answers
    from uph.report.study import Study

    return answers(Study(**tables, copy_task_curves=pd.DataFrame(), feedback_curves=pd.DataFrame(), copy_task_vocab=0))


def study_answers(tables: dict[str, pd.DataFrame]) -> dict[str, tuple[str, str]]:
    """question -> (answer, what it rests on) of tables_answers."""
    return {row.question: (row.answer, row.rests_on) for row in tables_answers(tables)}


def compare_answers(a: dict, b: dict, report: Report) -> None:
    """Each question whose answer differs between the two runs (or that only one asks)."""
    for question in sorted(set(a) | set(b)):
        if question not in a or question not in b:
            report.disagreements.append(
                f"answers [{question}]: asked only in {'RESULTS' if question in a else 'REFERENCE'}"
            )
        elif a[question][0] != b[question][0]:
            report.disagreements.append(
                f"answers [{question}] answer: {a[question][0]} ({a[question][1]}) against {b[question][0]} "
                f"({b[question][1]}) (identical)"
            )
    report.compared["answers"] = len(set(a) & set(b))


# -- a committed reference -----------------------------------------------------------------------------------


def make_reference(results: Path, folder: Path, figures: bool = False) -> None:
    """Write `folder` as a committed reference of `results`: its tables (CSV), summary.md, provenance.json
    (with the config that made it), reference.json (reference_record) and answers.md (write_answers), and
    with `figures` its figures (PNG): kilobytes to megabytes, no caches or weights."""
    import shutil

    if settings(results) is None:
        raise SystemExit(f"compare: '{results}' is no finished run (no provenance.json)")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "tables").mkdir(parents=True)
    for name in TABLES:
        shutil.copy(results / "tables" / f"{name}.csv", folder / "tables")
    shutil.copy(results / "summary.md", folder)
    shutil.copy(results / "provenance.json", folder)
    if figures:
        (folder / "figures").mkdir()
        for png in sorted((results / "figures").glob("*.png")):
            shutil.copy(png, folder / "figures")
    (folder / "reference.json").write_text(json.dumps(reference_record(folder / "provenance.json"), indent=1) + "\n")
    write_answers(folder)


def reference_record(provenance_path: Path) -> dict:
    """reference.json, all of it from the study's provenance.json: commit, the machine that ran the study
    (CPU model and vector extensions; the CPU or GPU names, torch's CPU kernels and threads its jobs
    recorded), torch, and per rule the
    job-seconds, CPU seconds and peak RSS gathered from its benchmark files. What a provenance written
    before it recorded them lacks reads None ("not recorded" for the machine)."""
    provenance = json.loads(provenance_path.read_text())
    rules = provenance["wall_seconds_per_rule"]
    cpu = [entry.get("cpu_seconds") for entry in rules.values()]
    devices = provenance.get("devices_per_rule", {})
    return {
        "commit": provenance["git"]["commit"],
        "dirty": provenance["git"]["dirty"],
        "code_sha256": provenance["code_sha256"],
        "machine": provenance.get("machine", "not recorded (a provenance written before it recorded the machine)"),
        "device_names": sorted({n for entry in devices.values() for n in entry.get("device_name", [])}) or None,
        "cpu_kernels": sorted({k for entry in devices.values() for k in entry.get("cpu_capability", [])}) or None,
        "threads": sorted({t for entry in devices.values() for t in entry.get("threads", [])}) or None,
        "torch": provenance["packages"]["torch"],
        "job_seconds": round(sum(entry["seconds"] for entry in rules.values())),
        "cpu_seconds": None if None in cpu else round(sum(cpu)),
        "peak_rss_mb": round(max((entry.get("peak_rss_mb") or 0.0 for entry in rules.values()), default=0.0)) or None,
        "rules": {
            rule: {
                "job_seconds": round(entry["seconds"], 1),
                "cpu_seconds": entry.get("cpu_seconds"),
                "peak_rss_mb": round(entry["peak_rss_mb"]) if entry.get("peak_rss_mb") else None,
            }
            for rule, entry in sorted(rules.items())
        },
    }


def write_answers(folder: Path) -> None:
    """answers.md of a reference: the study's answers (uph.report.answers, from its tables alone) as a
    Markdown table with each answer's evidence and n, which the README links and its answers block is written
    from (uph.report.readme): no number typed by hand."""
    from uph.report.answers import answers_markdown

    rows = tables_answers({name: read_table(folder / "tables" / f"{name}.csv") for name in TABLES})
    table = "\n".join(answers_markdown(rows, linked=(folder / "figures").is_dir()))
    (folder / "answers.md").write_text(
        f"# The study's answers: reference/{folder.name}\n\n"
        "Written by `make reference` (uph.compare.write_answers) from this folder's tables, made with the config "
        "in provenance.json: no number here is typed by hand. Each answer's evidence is in summary.md.\n\n"
        f"{table}\n"
    )


# -- the whole comparison ------------------------------------------------------------------------------------


def read_tables(results: Path, reference: Path, reader) -> dict:
    """name -> (RESULTS' table, REFERENCE's) of every table of TABLES, read with `reader`; CannotCompare
    for the first table missing, unreadable, extra (a CSV TABLES does not name) or with other columns."""
    tables = {}
    for folder in (results, reference):
        extra = sorted({path.stem for path in (folder / "tables").glob("*.csv")} - set(TABLES))
        if extra:
            raise CannotCompare(f"{folder / 'tables' / extra[0]}.csv: a table the study does not make")
    for name in TABLES:
        pair = []
        for folder in (results, reference):
            path = folder / "tables" / f"{name}.csv"
            if not path.is_file():
                raise CannotCompare(f"{path}: no such table")
            try:
                pair.append(reader(path))
            except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
                raise CannotCompare(f"{path}: not a readable table ({str(error).splitlines()[0]})") from None
        if list(pair[0].columns) != list(pair[1].columns):
            changed = [f"{x} against {y}" for x, y in zip(pair[0].columns, pair[1].columns) if x != y]
            said = ", ".join(changed) or f"{len(pair[0].columns)} columns against {len(pair[1].columns)}"
            raise CannotCompare(f"{results / 'tables' / name}.csv: other columns than the reference's ({said})")
        tables[name] = tuple(pair)
    return tables


def compare_folders(results: Path, reference: Path, mode: str = "auto") -> Report:
    """Every table of `results` against `reference` (module docstring); `mode`: auto, exact or statistical."""
    report = Report()
    try:
        provenances = [read_provenance(folder) for folder in (results, reference)]
        theirs = flat_settings(provenances[1])
        report.incomparable += [
            f"another config: {line}" for line in setting_differences(flat_settings(provenances[0]), theirs)
        ]
        if report.incomparable:
            return report
        report.numerics = numerics_differences(*(numerics(p) for p in provenances))
        report.mode = "exact" if mode == "exact" or (mode == "auto" and not report.numerics) else "statistical"
        if report.mode == "exact":
            for name, (a, b) in read_tables(results, reference, read_text_table).items():
                report.disagreements += exact_differences(name, a, b)
                report.compared[name] = a.size
            return report
        compare_statistically(read_tables(results, reference, read_table), theirs, report)
    except CannotCompare as error:
        report.incomparable.append(str(error))
    return report


def compare_statistically(tables: dict, theirs: dict, report: Report) -> None:
    """The statistical mode (module docstring) on the two runs' tables; `theirs`: the reference's settings."""
    ties = capacity_ties(*tables["capacity"], report)
    lr_choices(*tables["attention"], tables["attention_sweep"][0], tables["attention_sweep"][1], report)
    for name, (a, b) in tables.items():
        reading = TABLES[name].compared
        if reading.kind == "summarized":
            report.notes.append(f"{name}: not compared row by row ({reading.why})")
        elif reading.kind == "lm":
            compare_lm(name, reading, a, b, float(theirs.get("fit.tol", 1e-5)), ties, report)
        elif reading.kind == "exact":
            compare_float32(name, reading, a, b, report)
    compare_seeded(tables, theirs.get("attention.seeds_if_split"), report)
    mine_answers, their_answers = (study_answers({n: t[i] for n, t in tables.items()}) for i in (0, 1))
    compare_answers(mine_answers, their_answers, report)


def verdict(report: Report, results: Path, reference: Path) -> str:
    """The one-screen verdict: the mode, what was compared, the near ties and undetermined rows, and agree /
    disagree / incomparable."""
    if report.incomparable:  # one line a reason, each naming its file or setting
        return "\n".join(f"compare: cannot compare (exit 2): {line}" for line in report.incomparable)
    lines = [f"compare: {results} against {reference}"]
    if report.mode == "exact":
        lines.append(
            "  mode: exact (the same numerics: CPU, torch, kernel caps, dtypes, threads): every table to the byte"
        )
    else:
        lines.append(
            "  mode: statistical, as numerics differ:" if report.numerics else "  mode: statistical (asked for)"
        )
        lines += [f"    {line}" for line in report.numerics]
    lines += [f"  {name}: {n} values compared" for name, n in report.compared.items()]
    lines += [f"  near tie: {line}" for line in report.near_ties]
    lines += [f"  undetermined: {line}" for line in report.undetermined]
    lines += [f"  power: {line}" for line in report.power]
    if report.agreed or report.undetermined:
        lines.append(
            f"  seeded: {report.agreed} tests agree within their margin; {len(report.undetermined)} rows hold "
            "undetermined ones (too few seeds to tell: named above with the smallest shift each would catch)"
        )
    lines += [f"  note: {line}" for line in report.notes[:10]]
    if len(report.notes) > 10:
        lines.append(f"  ... and {len(report.notes) - 10} more notes")
    if report.disagreements:
        what = "cells differ" if report.mode == "exact" else "values beyond tolerance"
        return "\n".join([*lines, f"verdict: DISAGREE ({report.mode}): {len(report.disagreements)} {what} (exit 1)"])
    if report.mode == "exact":
        return "\n".join([*lines, "verdict: AGREE (exact): every table the same to the byte (exit 0)"])
    ties = f", {len(report.near_ties)} near ties named above" if report.near_ties else ""
    ties += f", {len(report.undetermined)} seeded rows undetermined" if report.undetermined else ""
    return "\n".join([*lines, f"verdict: AGREE (statistical) within the tolerances of uph/compare.py{ties} (exit 0)"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results folder (config.yaml's `results`)")
    parser.add_argument(
        "--reference",
        type=Path,
        help="a results folder or reference/<name>/; default: the committed reference of its config",
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "exact", "statistical"),
        default="auto",
        help="auto (default): exact where both runs recorded the same numerics, else statistical",
    )
    parser.add_argument(
        "--make-reference",
        type=Path,
        metavar="FOLDER",
        help="write RESULTS as a committed reference (reference/default: README.md's answers block too)",
    )
    parser.add_argument("--with-figures", action="store_true", help="with --make-reference: its figures (PNG) too")
    args = parser.parse_args(argv)
    if args.make_reference:
        make_reference(args.results, args.make_reference, args.with_figures)
        print(f"compare: {args.make_reference} holds the reference of {args.results}")
        if args.make_reference.resolve() == (REFERENCES / "default").resolve():  # the README shows its answers
            from uph.report.readme import README, write_readme_answers

            changed = write_readme_answers(README, args.make_reference)
            print(f"compare: {README.name}'s answers block {'rewritten' if changed else 'unchanged'}")
        return 0
    report, reference = Report(), args.reference
    try:
        if not (args.results / "tables").is_dir():
            raise CannotCompare(f"{args.results / 'tables'}: no such folder: run the study first")
        reference = reference or find_reference(args.results)
        if reference is None:
            available = ", ".join(sorted(p.name for p in REFERENCES.glob("*") if p.is_dir())) or "none"
            raise CannotCompare(
                f"no committed reference under {REFERENCES} was made with the config recorded in "
                f"{args.results / 'provenance.json'} (references: {available}); name one with REFERENCE="
            )
        report = compare_folders(args.results, reference, args.mode)
    except CannotCompare as error:
        report.incomparable.append(str(error))
    except Exception as error:  # a value no check foresaw (text in a number column): no verdict, not a traceback
        report.incomparable.append(f"{args.results} against {reference}: {type(error).__name__}: {error}")
    for line in report.disagreements:
        print(line)
    print(verdict(report, args.results, reference))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
