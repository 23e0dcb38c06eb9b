"""What `make compare` catches: single changes planted into copies of a committed reference run, each
judged by uph.compare.compare_folders in both of its modes.

    .venv/bin/python benchmarks/compare_plants.py [--reference reference/default] [--out FOLDER]

Each plant is one pair of folders, RESULTS and REFERENCE, each a copy of the reference's tables/ and
provenance.json, with one change planted into RESULTS: seeds collapsed onto another seed, a metric shifted
on every seed of a cell or method, two kinds' rows swapped, a seed's lr changed, a bimodal cell's share of
solving seeds moved, a language-model NLL moved around its tolerance, every float rounded, a file missing
or extra. Every plant edits the CSVs' text with the csv module, only in the planted cells (a new value
written with "%.6g", as uph.io.write_table writes them): a pandas round trip would rewrite every number's
text, which the exact mode reads as a change everywhere. Both modes then read the same planted files.

Per plant: the exit code of compare_folders in mode "statistical" and in mode "exact" (0 agree, 1 differ,
with the count of disagreement lines, 2 cannot compare) and the first line the statistical mode gives (or
the exact mode's, where the statistical one has none). An unmodified pair comes first, as the control: its
statistical report also gives the smallest shift each seeded table's metric catches (`report.power`) and
the count of rows undetermined. Writes the Markdown table and those lines, with the git commit and hashes of
the comparison modules measured, to FOLDER/plants.md (default benchmarks/measured/2026-12-06-amd-compare-plants/).
About 3 s a statistical compare: some 4 minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uph.attention.study_config import SOLVED
from uph.compare import Report, compare_folders
from uph.io import read_table
from uph.tables import TABLES

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "measured" / "2026-12-06-amd-compare-plants"
MODES = ("statistical", "exact")
SEEDED = ("attention", "attention_sweep", "attention_curves", "copy_task", "feedback")

SHOWN = 160  # characters of a first line in the table
MEASURED = ("compare.py", "seeded_comparison.py", "exact_comparison.py", "tables.py", "stats.py")  # under uph/


# -- a results folder's tables as text -----------------------------------------------------------------------


class Run:
    """A RESULTS folder being planted: each table read as text rows (dicts of column -> cell text) on first
    use, written back by save(), which counts the cells the plant changed."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.headers: dict[str, list[str]] = {}
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.original: dict[str, list[list[str]]] = {}

    def path(self, name: str) -> Path:
        return self.folder / "tables" / f"{name}.csv"

    def __getitem__(self, name: str) -> list[dict[str, str]]:
        if name not in self.tables:
            with self.path(name).open(newline="") as file:
                reader = csv.DictReader(file)
                self.tables[name] = list(reader)
                self.headers[name] = list(reader.fieldnames or [])
            self.original[name] = [list(row.values()) for row in self.tables[name]]
        return self.tables[name]

    def rename(self, name: str, old: str, new: str) -> None:
        """Column `old` of table `name` renamed `new`, its cells kept."""
        rows = self[name]
        self.headers[name] = [new if column == old else column for column in self.headers[name]]
        self.tables[name] = [{(new if key == old else key): value for key, value in row.items()} for row in rows]

    def save(self) -> int:
        """Write every table read back; the count of cells whose text changed."""
        changed = 0
        for name, rows in self.tables.items():
            with self.path(name).open("w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.headers[name], lineterminator="\n")
                writer.writeheader()
                writer.writerows(rows)
            changed += sum(a != b for new, old in zip(rows, self.original[name]) for a, b in zip(new.values(), old))
        return changed


def where(rows: list[dict], **values) -> list[dict]:
    """The rows whose cells read `values` (compared as text)."""
    return [row for row in rows if all(row[column] == str(value) for column, value in values.items())]


def chosen(rows: list[dict], **values) -> list[dict]:
    """The sweep's chosen rows among `where(rows, **values)`: the runs its attention table reports."""
    return where(rows, chosen="True", **values)


def edit(rows: list[dict], column: str, change: Callable[[float], float], form: str = "%.6g") -> None:
    """Each row's `column` (a number; an empty cell stays empty) replaced by change(value), printed with `form`."""
    for row in rows:
        if row[column] != "":
            row[column] = form % change(float(row[column]))


def keys_of(name: str) -> list[str]:
    """The columns that name one seed's row of seeded table `name` (its Comparison keys and the seed)."""
    return [*TABLES[name].compared.keys, "seed"]


# -- the plants ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plant:
    family: str
    what: str
    apply: Callable[[Run], None]


def collapse(rows: list[dict], keys: list[str], copies, source) -> None:
    """Seeds `copies` of `rows` given seed `source`'s every value, row by row (rows matched on `keys` less
    the seed)."""
    same = [k for k in keys if k != "seed"]
    sources = {tuple(row[k] for k in same): row for row in rows if row["seed"] == str(source)}
    for row in rows:
        if row["seed"] in {str(seed) for seed in copies}:
            row.update({c: v for c, v in sources[tuple(row[k] for k in same)].items() if c not in keys})


def collapse_plant(task: str, attention: str, with_sweep: bool, copies=(1, 2), source=3) -> Plant:
    def apply(run: Run) -> None:
        collapse(where(run["attention"], task=task, attention=attention), keys_of("attention"), copies, source)
        if with_sweep:
            rows = chosen(run["attention_sweep"], task=task, attention=attention)
            collapse(rows, keys_of("attention_sweep"), copies, source)

    tables = "attention and the sweep's chosen rows" if with_sweep else "attention only"
    return Plant("1 seeds collapsed", f"{task}/{attention}: seeds {list(copies)} := seed {source} ({tables})", apply)


def seed_plants() -> list[Plant]:
    cells = [("mqar", "standard"), ("mqar", "triple_capped"), ("loud_copy", "triple_capped"), ("offset_copy", "diff")]
    plants = [collapse_plant(task, attention, False) for task, attention in cells]
    return plants + [collapse_plant(task, attention, True) for task, attention in cells]


def shift_plant(family: str, table: str, match: dict, column: str, change, said: str) -> Plant:
    """`column` of every row (every seed) of `table` matching `match` changed by `change`."""
    where_said = "/".join(str(v) for v in match.values())
    return Plant(
        family, f"{table} {where_said}: {column} {said}", lambda run: edit(where(run[table], **match), column, change)
    )


def shift_plants() -> list[Plant]:
    family = "2 shift"
    plants = []
    for task, attention in [("mqar", "standard"), ("loud_copy", "triple_capped"), ("offset_copy", "diff")]:
        cell = {"task": task, "attention": attention}
        for delta in (0.02, 0.05, 0.10):
            plants.append(shift_plant(family, "attention", cell, "token_acc", lambda x, d=delta: x - d, f"-{delta:g}"))
        plants.append(shift_plant(family, "attention", cell, "loss", lambda x: x * 1.1, "x 1.1"))
        plants.append(shift_plant(family, "attention", cell, "loss", lambda x: x + 0.05, "+0.05"))
    for attention in ("standard", "triple"):
        match = {"attention": attention}
        for share in (0.05, 0.10):
            plants.append(
                shift_plant(family, "copy_task", match, "token_acc", lambda x, s=share: x * (1 - s), f"-{share:.0%}")
            )
        plants.append(shift_plant(family, "copy_task", match, "final_loss", lambda x: x * 1.1, "+10%"))
    for method in ("backprop", "dfa"):
        for share in (0.02, 0.05, 0.10):
            change = lambda x, s=share: x * (1 - s)  # noqa: E731
            plants.append(shift_plant(family, "feedback", {"method": method}, "final_acc", change, f"-{share:.0%}"))
    for method in ("feedback_learned", "dfa"):
        for share in (0.05, 0.10):
            change = lambda x, s=share: x * (1 - s)  # noqa: E731
            plants.append(
                shift_plant(family, "feedback", {"method": method}, "mean_alignment", change, f"-{share:.0%}")
            )
    return plants


def bimodal_plants() -> list[Plant]:
    cell = {"task": "mqar", "attention": "triple_capped"}
    return [shift_plant("3 bimodal shift", "attention", cell, "token_acc", lambda x: x - 0.10, "-0.1 (9 of 10 solve)")]


def swap_plant(task: str, x: str, y: str, tables: tuple[str, ...]) -> Plant:
    """Kinds `x` and `y` of `task` trade names in `tables` (their family columns are the same)."""

    def apply(run: Run) -> None:
        for name in tables:
            for row in where(run[name], task=task):
                row["attention"] = {x: y, y: x}.get(row["attention"], row["attention"])

    return Plant("4 kinds swapped", f"{task}: {x} <-> {y} in {' + '.join(tables)}", apply)


def swap_plants() -> list[Plant]:
    pairs = [
        ("mqar", "standard", "standard_qknorm"),
        ("offset_copy", "standard", "standard_capped"),
        ("loud_copy", "triple_capped", "triple_qknorm"),
        ("mqar", "triple_capped", "triple_qknorm"),
    ]
    every = ("attention", "attention_sweep", "attention_curves")
    return [swap_plant(task, x, y, tables) for task, x, y in pairs for tables in (("attention",), every)]


def lr_plant(task: str, attention: str, seed: int, lr: float) -> Plant:
    def apply(run: Run) -> None:
        for row in where(run["attention"], task=task, attention=attention, seed=seed):
            row["lr"] = f"{lr:g}"

    return Plant("5 one seed's lr", f"attention {task}/{attention} seed {seed}: lr := {lr:g} (attention only)", apply)


def unsolve_plant(task: str, attention: str, n: int) -> Plant:
    """`n` of a cell's solving seeds set to val_token_acc 0.5 in attention and in the sweep's chosen rows."""

    def apply(run: Run) -> None:
        rows = where(run["attention"], task=task, attention=attention)
        solving = sorted({int(row["seed"]) for row in rows if float(row["val_token_acc"]) >= SOLVED})[:n]
        for seed in solving:
            for row in [
                *where(rows, seed=seed),
                *chosen(run["attention_sweep"], task=task, attention=attention, seed=seed),
            ]:
                row["val_token_acc"] = "0.5"

    return Plant("6 share solved", f"{task}/{attention}: {n} solving seeds' val_token_acc := 0.5 (+ sweep)", apply)


def choice_plants() -> list[Plant]:
    return [
        lr_plant("mqar", "standard", 2, 0.03),
        lr_plant("loud_copy", "triple_capped", 4, 0.003),
        unsolve_plant("mqar", "triple_capped", 3),
        unsolve_plant("mqar", "triple_capped", 5),
        unsolve_plant("loud_copy", "triple_capped", 3),
        unsolve_plant("loud_copy", "triple_capped", 5),
        unsolve_plant("loud_copy", "triple_qknorm", 5),  # 10 of 10 solve in the reference
        unsolve_plant("loud_copy", "triple_qknorm", 6),
    ]


def nll_plant(delta: float) -> Plant:
    row = {"head": "cvh", "control": "personal", "reference": "base"}
    return shift_plant("7 language model", "personalization", row, "delta_nll", lambda x: x + delta, f"{delta:+g} nats")


def float_columns(run: Run, name: str) -> list[str]:
    """The computed float columns of seeded table `name`: not its keys, choices, exact columns nor lr."""
    reading = TABLES[name].compared
    fixed = {*reading.keys, *reading.choices, *reading.exact, *reading.cell, "lr", "seed"}
    dtypes = read_table(run.path(name)).dtypes
    return [column for column, dtype in dtypes.items() if dtype.kind == "f" and column not in fixed]


def rounding_plant(form: str, said: str) -> Plant:
    def apply(run: Run) -> None:
        for name in SEEDED:
            for column in float_columns(run, name):
                edit(run[name], column, lambda x: x * (1 + 1e-6), form)

    return Plant("8 rounding", f"every computed float of every seeded table x (1 + 1e-6), {said}", apply)


def without_config(run: Run) -> None:
    path = run.folder / "provenance.json"
    provenance = json.loads(path.read_text())
    del provenance["config"]
    path.write_text(json.dumps(provenance, indent=1))


def structural_plants() -> list[Plant]:
    family = "9 structure"
    provenance = lambda run: run.folder / "provenance.json"  # noqa: E731
    return [
        Plant(family, "provenance.json deleted", lambda run: provenance(run).unlink()),
        Plant(family, "provenance.json without its config", without_config),
        Plant(
            family,
            "attention_curves: score_abs renamed score_max",
            lambda run: run.rename("attention_curves", "score_abs", "score_max"),
        ),
        Plant(
            family,
            "tables/extra.csv (a copy of gram_resilience)",
            lambda run: shutil.copy(run.path("gram_resilience"), run.path("extra")),
        ),
        Plant(family, "tables/feedback.csv deleted", lambda run: run.path("feedback").unlink()),
    ]


def plants() -> list[Plant]:
    """Every plant, the control (nothing planted) first."""
    control = Plant("0 control", "nothing planted (an unmodified copy)", lambda run: None)
    rounding = [rounding_plant("%.6g", "written to 6 digits as the tables are"), rounding_plant("%r", "full precision")]
    return [
        control,
        *seed_plants(),
        *shift_plants(),
        *bimodal_plants(),
        *swap_plants(),
        *choice_plants(),
        *(nll_plant(delta) for delta in (2e-5, 5e-5, 1e-4, 1e-3)),
        *rounding,
        *structural_plants(),
    ]


# -- measuring -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    plant: Plant
    results: Path  # the planted folder, named RESULTS in the table
    cells: int  # cells whose text the plant changed
    reports: dict  # mode -> Report, or the traceback's last line where compare_folders raised


def copy_run(reference: Path, folder: Path) -> None:
    """`folder` as a copy of `reference`'s tables/ and provenance.json."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(reference / "tables", folder / "tables")
    shutil.copy(reference / "provenance.json", folder)


def judge(results: Path, reference: Path, mode: str) -> Report | str:
    try:
        return compare_folders(results, reference, mode=mode)
    except Exception:  # a traceback is a finding: recorded, and the next plant measured
        traceback.print_exc()
        return f"traceback: {traceback.format_exc().strip().splitlines()[-1]}"


def measure(plant: Plant, reference: Path, scratch: Path) -> Outcome:
    results = scratch / "results"
    copy_run(reference, results)
    run = Run(results)
    plant.apply(run)
    cells = run.save()
    return Outcome(plant, results, cells, {mode: judge(results, reference, mode) for mode in MODES})


def exit_cell(report: Report | str) -> str:
    if isinstance(report, str):
        return "error"
    return f"1 ({len(report.disagreements)})" if report.exit_code == 1 else str(report.exit_code)


def first_line(outcome: Outcome) -> str:
    """The statistical mode's first line (a reason it cannot compare, or a disagreement), else the exact's."""
    for mode in MODES:
        report = outcome.reports[mode]
        lines = [report] if isinstance(report, str) else [*report.incomparable, *report.disagreements]
        if lines:
            line = lines[0].replace(str(outcome.results), "RESULTS")
            line = line if mode == MODES[0] else f"exact: {line}"
            return (line if len(line) <= SHOWN else line[: SHOWN - 3] + "...").replace("|", "\\|")
    return ""


def markdown_row(outcome: Outcome) -> str:
    what = outcome.plant.what + (f" [{outcome.cells} cells]" if outcome.cells else "")
    exits = [exit_cell(outcome.reports[mode]) for mode in MODES]
    return f"| {outcome.plant.family} | {what} | {exits[0]} | {exits[1]} | {first_line(outcome)} |"


def code_state() -> str:
    """The comparison code measured: git HEAD, whether the tree is dirty, and the sha256 (12 digits) of each
    module of MEASURED, which a dirty tree may hold otherwise than HEAD."""

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout

    dirty = " (working tree dirty)" if git("status", "--porcelain", "--untracked-files=no").strip() else ""
    hashes = [f"uph/{n} {hashlib.sha256((REPO / 'uph' / n).read_bytes()).hexdigest()[:12]}" for n in MEASURED]
    return f"git HEAD {git('rev-parse', '--short', 'HEAD').strip()}{dirty}; sha256: {', '.join(hashes)}"


def document(outcomes: list[Outcome], reference: Path, seconds: float, code: str) -> str:
    control = outcomes[0].reports["statistical"]
    reference = reference.resolve().relative_to(REPO) if reference.resolve().is_relative_to(REPO) else reference
    lines = [
        f"# What `make compare` catches: plants in copies of {reference}",
        "",
        f"Code measured: {code}.",
        "",
        f"`.venv/bin/python benchmarks/compare_plants.py --reference {reference}`: {len(outcomes)} pairs, "
        f"{seconds:.0f} s. Each row plants one change into a copy of the reference's tables (CSV text, planted "
        "cells only, new values printed with %.6g unless said; [n cells]: cells whose text changed) and compares "
        "it with another copy in both modes of uph.compare.compare_folders. Exit: 0 agree, 1 differ (disagreement "
        "lines), 2 cannot compare. First line: the statistical mode's, or the exact mode's where it has none.",
        "",
        "| family | plant | statistical exit | exact exit | first line |",
        "|---|---|---|---|---|",
        *(markdown_row(outcome) for outcome in outcomes),
        "",
        "## Power: the smallest shift each seeded table's metric catches (statistical, unmodified pair)",
        "",
        *(f"- {line}" for line in control.power),
        "",
        f"Undetermined rows of the unmodified pair: {len(control.undetermined)}; "
        f"row-metrics that agree: {control.agreed}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=REPO / "reference" / "default", help="a committed reference")
    parser.add_argument("--out", type=Path, default=OUT, help="where plants.md goes")
    args = parser.parse_args(argv)
    start, code = time.perf_counter(), code_state()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="compare-plants-") as scratch:
        reference = Path(scratch) / "reference"
        copy_run(args.reference, reference)
        for plant in plants():
            outcomes.append(measure(plant, reference, Path(scratch)))
            print(markdown_row(outcomes[-1]), flush=True)
    if code_state() != code:  # another hand edited uph/ meanwhile: the modules imported at the start were measured
        code += f" (at the start; at the end: {code_state()})"
    text = document(outcomes, args.reference, time.perf_counter() - start, code)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plants.md").write_text(text)


if __name__ == "__main__":
    main()
