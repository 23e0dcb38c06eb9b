"""The attention study's stopping and seed protocol replayed on a finished run's recorded tables: what a
solved-stop rule and sweeping the split kinds on fewer seeds would change, before either is built.

    .venv/bin/python benchmarks/replay_attention_protocol.py [--tables reference/default/tables]
        [--provenance reference/default/provenance.json]
        [--benchmarks benchmarks/measured/2026-11-29-amd-cold-default/after-1ef7cff/benchmarks]
        [--write-benchmarks DIR]

The rules replayed (uph.attention.training builds the first two as its default protocol):

- **solved stop** (accuracy a, count k): a run stops at the first evaluation that ends k evaluations in a row
  at validation token accuracy >= a, and keeps its best evaluation (lowest validation loss, min_delta) as
  every run does. Variants: a 1.0 or 0.99, k 2 to 4.
- **split kinds on their first seeds**: a kind of attention.split_kinds sweeps its lrs on `seeds` (0 to 4),
  not on all seeds_if_split (0 to 9); seeds 5 to 9 train at the chosen lr only (10 seeds still reported).
  Against it, on 3 seeds (0 to 2).
- **both together**, and two rules not taken: patience 3 (not 4) and a step limit of 2,000 (not 4,000).
- the lrs 0.003, 0.01, 0.03 listed in `attention.lrs` (the recorded run listed 0.003 and 0.01 and tried 0.03
  as an extension): which cells' sweeps the recorded runs replay.

What the tables can replay. The curves (attention_curves.csv) hold the chosen lr's runs only, every
evaluation: there a rule that stops a run sooner (solved stop, patience, step limit) is replayed exactly,
the evaluations before its stop being those it had (a run is the run it would be alone, up to float32
rounding). The sweep rows (attention_sweep.csv) of the other lrs hold a run's final validation accuracy, steps
run, best step and first step at 0.99 (steps_to_99), not its curve. There a run that never reached 0.99 cannot
meet a stop at a >= 0.99 and is unchanged; a run that did can stop no sooner than steps_to_99 + (k - 1)
log_every, and no later than it stopped: its run-steps are given as bounds, and its validation accuracy
taken as 1.0 where it ended at 1.0 (as every replayed chosen-lr run that stops as solved keeps its accuracy,
checked below) and as either its own or 1.0 where it ended below: an lr choice is "kept" only where every
combination keeps it. A sweep that would try an lr the run never trained is reported as such, not guessed.

Job-seconds (--benchmarks: the measured run's benchmark files): each attention_train job's seconds times its
cell's run-steps after / before (each cell's own cost per run-step, which holds its start-up, its tests and
its batching: a stage of fewer runs costs a little more per run-step). --write-benchmarks DIR copies the
benchmark files with the attention_train jobs' seconds so projected, for benchmarks/makespan.py --results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from uph.attention.study_config import SOLVED
from uph.attention.training import best_lr, extension

KEYS = ["task", "model", "attention"]
NEW_LRS = (0.003, 0.01, 0.03)


@dataclass(frozen=True)
class Rule:
    """A stopping rule replayed on a run's evaluations."""

    patience: int
    min_delta: float
    limit: int
    solved_accuracy: float | None = None
    solved_evaluations: int = 3

    def stop_at_least(self, steps_to_99: float, log_every: int) -> float:
        """The earliest step a run whose first 0.99 evaluation is `steps_to_99` can stop as solved."""
        if self.solved_accuracy is None or math.isnan(steps_to_99):
            return math.inf
        return steps_to_99 + (self.solved_evaluations - 1) * log_every


def replay_run(curve: pd.DataFrame, rule: Rule) -> dict:
    """A chosen-lr run under `rule` from its recorded evaluations, as uph.attention.training.log_step reads
    them: steps_run, best_step, val_token_acc, val_loss, stopped (solved, patience, step_limit)."""
    best, waited, streak = None, 0, 0
    for row in curve.itertuples():
        if row.step > rule.limit:
            break
        if best is None or row.val_loss < best.val_loss - rule.min_delta:
            best, waited = row, 0
        else:
            waited += 1
        streak = streak + 1 if rule.solved_accuracy is not None and row.val_token_acc >= rule.solved_accuracy else 0
        stop = (
            "solved"
            if rule.solved_accuracy is not None and streak >= rule.solved_evaluations
            else "patience"
            if waited >= rule.patience
            else None
        )
        last = row
        if stop:
            break
    else:
        stop = "step_limit"
    if stop is None:
        stop = "step_limit"
    return {
        "steps_run": last.step,
        "best_step": best.step,
        "val_token_acc": best.val_token_acc,
        "val_loss": best.val_loss,
        "stopped": stop,
    }


def lr_match(lr: float, recorded) -> float | None:
    return next((r for r in recorded if math.isclose(lr, r, rel_tol=1e-9)), None)


def protocol(rows: pd.DataFrame, lrs, lr_step: float, extensions: int, sweep_seeds) -> tuple[float | None, list, str]:
    """The sweep uph.attention.training.sweep_lrs runs, on the recorded `rows` (lr, seed, val_token_acc,
    diverged) of `sweep_seeds`: (chosen lr, lrs tried, "" or the untried lr it would need)."""
    recorded = sorted(rows["lr"].unique())
    tried = []
    for lr in lrs:
        match = lr_match(lr, recorded)
        if match is None:
            return None, tried, f"{lr:g}"
        tried.append(match)
    on_seeds = rows[rows["seed"].isin(sweep_seeds)]

    def choice():
        return best_lr(on_seeds[on_seeds["lr"].isin(tried)])

    for _ in range(extensions):
        chosen = choice()
        nxt = None if chosen is None else extension(chosen, tried, lr_step)
        if nxt is None:
            break
        match = lr_match(nxt, recorded)
        if match is None:
            return None, tried, f"{nxt:g}"
        tried.append(match)
    return choice(), tried, ""


@dataclass
class Cell:
    """One cell's recorded sweep rows (lr, seed) and its chosen lr's curves."""

    name: str
    sweep: pd.DataFrame  # indexed by (lr, seed)
    curves: dict  # (lr, seed) -> its evaluations
    split_kind: bool
    chosen: float


def cells(tables: Path, split_kinds) -> list[Cell]:
    sweep = pd.read_csv(tables / "attention_sweep.csv")
    curves = pd.read_csv(tables / "attention_curves.csv")
    out = []
    for key, rows in sweep.groupby(KEYS, sort=True):
        where = (curves[KEYS] == pd.Series(dict(zip(KEYS, key)))).all(axis=1)
        runs = {run: c.sort_values("step") for run, c in curves[where].groupby(["lr", "seed"])}
        chosen = float(rows.loc[rows["chosen"], "lr"].iloc[0])
        out.append(Cell("/".join(key), rows.set_index(["lr", "seed"]), runs, key[2] in split_kinds, chosen))
    return out


@dataclass
class Replayed:
    """A cell's runs under a stopping rule: rows (lr, seed) with val_token_acc, diverged, steps_run bounds
    (low, high, estimate), and the runs whose validation accuracy is not known (lr, seed) -> its choices."""

    rows: pd.DataFrame
    unknown: dict


def replay_cell(cell: Cell, rule: Rule | None, log_every: int, share: float) -> Replayed:
    """Every recorded run of `cell` under `rule` (None: as recorded). `share`: the estimate's part of the
    most run-steps a run without a curve can save (high - low), as the replayed chosen-lr runs save it."""
    rows = cell.sweep[["val_token_acc", "diverged", "steps_run", "best_step", "steps_to_99"]].copy()
    rows["low"] = rows["high"] = rows["estimate"] = rows["steps_run"].astype(float)
    rows["stopped"] = "as recorded"
    unknown = {}
    if rule is None:
        return Replayed(rows.reset_index(), unknown)
    for run, row in cell.sweep.iterrows():
        if run in cell.curves:
            replayed = replay_run(cell.curves[run], rule)
            for column in ("val_token_acc", "steps_run", "best_step", "stopped"):
                rows.loc[run, column] = replayed[column]
            rows.loc[run, ["low", "high", "estimate"]] = replayed["steps_run"]
            continue
        earliest = rule.stop_at_least(row["steps_to_99"], log_every)
        if earliest >= row["steps_run"] and row["steps_run"] <= rule.limit:
            continue  # cannot stop sooner: unchanged
        if row["steps_run"] > rule.limit and earliest >= rule.limit:
            rows.loc[run, ["low", "high", "estimate"]] = rule.limit
            unknown[run] = sorted({row["val_token_acc"]})  # stopped at the limit: its best up to it is not known
            continue
        high = min(row["steps_run"], rule.limit)
        rows.loc[run, "low"] = earliest
        rows.loc[run, "high"] = high
        rows.loc[run, "estimate"] = high - share * (high - earliest)
        if row["val_token_acc"] < 1.0:
            unknown[run] = sorted({row["val_token_acc"], 1.0})
    return Replayed(rows.reset_index(), unknown)


def choices(replayed: Replayed, lrs, lr_step, extensions, sweep_seeds, limit: int = 256):
    """The set of (chosen lr or the untried lr it needs) over every combination of the unknown runs'
    accuracies that matter (those of `sweep_seeds`), at most `limit` combinations (else None)."""
    unknown = {run: values for run, values in replayed.unknown.items() if run[1] in sweep_seeds}
    rows = replayed.rows.set_index(["lr", "seed"])
    combos = list(itertools.product(*unknown.values()))
    if len(combos) > limit:
        return None
    out = set()
    for combo in combos:
        trial = rows.copy()
        for run, value in zip(unknown, combo):
            trial.loc[run, "val_token_acc"] = value
        chosen, _, untried = protocol(trial.reset_index(), lrs, lr_step, extensions, sweep_seeds)
        out.add(f"needs {untried}" if untried else chosen)
    return out


def trained(replayed: Replayed, chosen: float, tried, sweep_seeds, report_seeds) -> pd.DataFrame:
    """The rows of the runs a protocol trains: every lr tried on the sweep seeds, the chosen lr on every
    reported seed."""
    runs = {(lr, seed) for lr in tried for seed in sweep_seeds} | {(chosen, seed) for seed in report_seeds}
    rows = replayed.rows.set_index(["lr", "seed"])
    missing = runs - set(rows.index)
    if missing:
        raise SystemExit(f"runs the recorded tables lack: {sorted(missing)}")
    return rows.loc[sorted(runs)]


def solved_seeds(rows: pd.DataFrame, chosen: float, seeds) -> int:
    at = rows.loc[[(chosen, seed) for seed in seeds]]
    return int(((at["val_token_acc"] >= SOLVED) & ~at["diverged"].astype(bool)).sum())


def job_seconds(benchmarks: Path | None) -> dict[str, float]:
    """cell name -> its attention_train job's measured seconds."""
    if benchmarks is None:
        return {}
    out = {}
    for path in sorted(benchmarks.glob("attention_train-*.tsv")):
        wildcards = dict(part.split("~") for part in path.stem.removeprefix("attention_train-").split("-"))
        name = "/".join(wildcards[key] for key in ("task", "model", "attention"))
        out[name] = float(pd.read_csv(path, sep="\t")["s"].iloc[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, default=Path("reference/default/tables"))
    parser.add_argument("--provenance", type=Path, default=Path("reference/default/provenance.json"))
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=Path("benchmarks/measured/2026-11-29-amd-cold-default/after-1ef7cff/benchmarks"),
    )
    parser.add_argument("--write-benchmarks", type=Path, help="write the projected benchmark files here")
    args = parser.parse_args()
    cfg = json.loads(args.provenance.read_text())["config"]["attention"]
    seeds, wanted = list(cfg["seeds"]), cfg["seeds_if_split"]
    every = [*seeds, *range(max(seeds) + 1, max(seeds) + 1 + wanted - len(seeds))]
    lrs, step, extensions = cfg["lrs"], cfg["lr_step"], cfg["lr_extensions"]
    log_every, limit = cfg["log_every"], max(cfg["max_steps"], cfg["max_steps_extended"] or 0)
    recorded_rule = Rule(cfg["patience"], cfg["min_delta"], limit)
    all_cells = cells(args.tables, cfg["split_kinds"])
    seconds = job_seconds(args.benchmarks if args.benchmarks and args.benchmarks.is_dir() else None)

    print(
        f"tables: {args.tables}; settings: {args.provenance} (lrs {lrs}, lr_extensions {extensions}, "
        f"patience {cfg['patience']}, min_delta {cfg['min_delta']}, log_every {log_every}, step limit {limit}, "
        f"seeds {seeds}, sweep_seeds {cfg['sweep_seeds']}, seeds_if_split {wanted}, split_kinds {cfg['split_kinds']})"
    )
    n_curves = sum(len(c.curves) for c in all_cells)
    n_runs = sum(len(c.sweep) for c in all_cells)
    print(
        f"{len(all_cells)} cells, {n_runs} runs, {n_curves} with curves (the chosen lr's); "
        f"{sum(c.sweep['steps_run'].sum() for c in all_cells):,} run-steps"
    )

    # 0. the replay reproduces the recorded run: the stops of the chosen lr's runs, and every lr choice
    wrong = [
        (c.name, run)
        for c in all_cells
        for run, curve in c.curves.items()
        if (
            lambda r, row: (
                (r["steps_run"], r["best_step"], r["val_token_acc"])
                != (row["steps_run"], row["best_step"], row["val_token_acc"])
            )
        )(replay_run(curve, recorded_rule), c.sweep.loc[run])
    ]
    print(
        f"\ncheck: the recorded rule replayed on the curves gives each chosen-lr run's steps_run, best_step and "
        f"val_token_acc: {n_curves - len(wrong)} of {n_curves}" + (f" (not: {wrong})" if wrong else "")
    )
    mismatched = []
    for c in all_cells:
        sweep_seeds = every if c.split_kind else seeds[: cfg["sweep_seeds"]]
        chosen, _, untried = protocol(c.sweep.reset_index(), lrs, step, extensions, sweep_seeds)
        if untried or not math.isclose(chosen, c.chosen):
            mismatched.append(c.name)
    print(
        f"check: the recorded protocol replayed on the sweep rows chooses each cell's recorded lr: "
        f"{len(all_cells) - len(mismatched)} of {len(all_cells)}" + (f" (not: {mismatched})" if mismatched else "")
    )

    # 1. stopping rules on the chosen lr's runs (exact)
    rules = {
        "solved stop at 1.0 x 3": Rule(cfg["patience"], cfg["min_delta"], limit, 1.0, 3),
        "solved stop at 1.0 x 2": Rule(cfg["patience"], cfg["min_delta"], limit, 1.0, 2),
        "solved stop at 1.0 x 4": Rule(cfg["patience"], cfg["min_delta"], limit, 1.0, 4),
        "solved stop at 0.99 x 3": Rule(cfg["patience"], cfg["min_delta"], limit, 0.99, 3),
        "patience 3": Rule(3, cfg["min_delta"], limit),
        "step limit 2000": Rule(cfg["patience"], cfg["min_delta"], 2000),
    }
    print("\n1. stopping rules on the chosen lr's runs, replayed exactly on their curves")
    shares = {}
    for name, rule in rules.items():
        same_acc = same_best = lower = higher = steps_before = steps_after = 0
        saved = most = outside = 0
        solved_changed = []
        for c in all_cells:
            before_solved = after_solved = 0
            for run, curve in c.curves.items():
                row, replayed = c.sweep.loc[run], replay_run(curve, rule)
                steps_before += row["steps_run"]
                steps_after += replayed["steps_run"]
                same_acc += replayed["val_token_acc"] == row["val_token_acc"]
                lower += replayed["val_token_acc"] < row["val_token_acc"]
                higher += replayed["val_token_acc"] > row["val_token_acc"]
                same_best += replayed["best_step"] == row["best_step"]
                before_solved += row["val_token_acc"] >= SOLVED
                after_solved += replayed["val_token_acc"] >= SOLVED
                earliest = rule.stop_at_least(row["steps_to_99"], log_every)
                if earliest < row["steps_run"]:  # the bounds a run without a curve gets, against the exact stop
                    saved += row["steps_run"] - replayed["steps_run"]
                    most += row["steps_run"] - earliest
                    outside += not earliest <= replayed["steps_run"] <= row["steps_run"]
            if before_solved != after_solved:
                solved_changed.append(f"{c.name} {before_solved} -> {after_solved} of {len(c.curves)}")
        shares[name] = saved / most if most else 0.0
        print(
            f"  {name}: run-steps {steps_before:,} -> {steps_after:,} ({1 - steps_after / steps_before:.1%} saved); "
            f"validation accuracy the same in {same_acc} of {n_curves} (lower {lower}, higher {higher}), "
            f"the same best evaluation in {same_best}; seeds solving (val >= {SOLVED}) changed in "
            f"{len(solved_changed)} cells"
            + (f": {'; '.join(solved_changed)}" if solved_changed else "")
            + (
                f"; of the most a run could save by its sweep row's bounds ({most:,.0f} run-steps), "
                f"{shares[name]:.0%} saved ({outside} runs outside their bounds)"
                if most
                else ""
            )
        )

    # 2. the protocols over every run
    print("\n2. protocols over every run (the other lrs' runs: bounds, see the docstring)")
    solved_rule = rules["solved stop at 1.0 x 3"]
    variants = {
        "recorded": (None, "every"),
        "(a) solved stop 1.0 x 3": (solved_rule, "every"),
        "(a') solved stop 0.99 x 3": (rules["solved stop at 0.99 x 3"], "every"),
        "(b) split kinds sweep on seeds 0-4": (None, 5),
        "(b') split kinds sweep on seeds 0-2": (None, 3),
        "(c) both: (a) and (b)": (solved_rule, 5),
    }
    total_before = sum(c.sweep["steps_run"].sum() for c in all_cells)
    projected = {}
    for name, (rule, split_seeds) in variants.items():
        share = shares["solved stop at 1.0 x 3" if rule is solved_rule else "solved stop at 0.99 x 3"]
        low = high = estimate = 0.0
        kept, changed, undecided, notes = 0, [], [], []
        per_cell = {}
        for c in all_cells:
            replayed = replay_cell(c, rule, log_every, share)
            sweep_seeds = (
                (every if split_seeds == "every" else seeds[:split_seeds])
                if c.split_kind
                else seeds[: cfg["sweep_seeds"]]
            )
            report = every if c.split_kind else seeds
            options = choices(replayed, lrs, step, extensions, sweep_seeds)
            chosen, tried, untried = protocol(replayed.rows, lrs, step, extensions, sweep_seeds)
            if options is None or len(options) > 1:
                undecided.append(f"{c.name}: {sorted(map(str, options)) if options else 'too many combinations'}")
            elif untried or not math.isclose(chosen, c.chosen):
                changed.append(f"{c.name}: {c.chosen:g} -> {untried and 'an untried lr ' + untried or f'{chosen:g}'}")
            else:
                kept += 1
            if untried:
                chosen, tried = c.chosen, sorted(c.sweep.reset_index()["lr"].unique())
            rows = trained(replayed, chosen, tried, sweep_seeds, report)
            low, high, estimate = low + rows["low"].sum(), high + rows["high"].sum(), estimate + rows["estimate"].sum()
            per_cell[c.name] = (rows["estimate"].sum(), rows["low"].sum(), rows["high"].sum())
            at = replayed.rows.set_index(["lr", "seed"])
            if solved_seeds(at, c.chosen, report) != solved_seeds(c.sweep, c.chosen, report):
                notes.append(
                    f"{c.name} seeds solving {solved_seeds(c.sweep, c.chosen, report)} -> {solved_seeds(at, c.chosen, report)}"
                )
        projected[name] = per_cell
        span = f" ({1 - high / total_before:.1%} to {1 - low / total_before:.1%})" if low != high else ""
        print(
            f"  {name}: run-steps {total_before:,} -> {estimate:,.0f}, {1 - estimate / total_before:.1%} saved{span}; "
            f"lr choices kept in {kept} of {len(all_cells)}"
            + (f"; changed: {'; '.join(changed)}" if changed else "")
            + (f"; open (the unknown runs' accuracies decide): {'; '.join(undecided)}" if undecided else "")
            + (f"; {'; '.join(notes)}" if notes else "")
        )

    # 3. the lrs listed
    print(f"\n3. attention.lrs {list(NEW_LRS)} (lr_extensions {extensions}), the sweep replayed on the recorded rows:")
    same, other = [], []
    for c in all_cells:
        sweep_seeds = every if c.split_kind else seeds[: cfg["sweep_seeds"]]
        chosen, tried, untried = protocol(c.sweep.reset_index(), NEW_LRS, step, extensions, sweep_seeds)
        recorded_tried = sorted(float(lr) for lr in c.sweep.reset_index()["lr"].unique())
        if not untried and math.isclose(chosen, c.chosen) and sorted(tried) == recorded_tried:
            same.append(c.name)
        else:
            tried_now = [float(lr) for lr in tried]
            other.append(
                f"{c.name}: {'needs the untried lr ' + untried if untried else f'{chosen:g} of {tried_now}'} "
                f"(recorded: {c.chosen:g} of {recorded_tried})"
            )
    print(f"  {len(same)} cells train the lrs they trained, in one stage, and choose the same lr; {'; '.join(other)}")

    # 4. job-seconds
    if seconds:
        print(
            f"\n4. job-seconds: each attention_train job's measured seconds ({args.benchmarks}) x its cell's "
            "run-steps after / before"
        )
        measured = {c.name: c.sweep["steps_run"].sum() for c in all_cells}
        total = sum(seconds.values())
        longest = max(seconds, key=seconds.get)
        print(f"  measured: {total:,.0f} job-seconds, the longest job {longest} {seconds[longest]:.0f} s")
        for name in ("(a) solved stop 1.0 x 3", "(b) split kinds sweep on seeds 0-4", "(c) both: (a) and (b)"):
            per_cell = projected[name]
            est = {cell: seconds[cell] * per_cell[cell][0] / measured[cell] for cell in seconds}
            lo = sum(seconds[cell] * per_cell[cell][1] / measured[cell] for cell in seconds)
            hi = sum(seconds[cell] * per_cell[cell][2] / measured[cell] for cell in seconds)
            top = sorted(est, key=est.get, reverse=True)[:3]
            bounds = {cell: [seconds[cell] * per_cell[cell][i] / measured[cell] for i in (1, 2)] for cell in top}
            print(
                f"  {name}: {sum(est.values()):,.0f} job-seconds ({lo:,.0f} to {hi:,.0f}), saving "
                f"{total - sum(est.values()):,.0f} ({total - hi:,.0f} to {total - lo:,.0f}); the longest jobs: "
                + ", ".join(
                    f"{cell} {est[cell]:.0f} s ({bounds[cell][0]:.0f} to {bounds[cell][1]:.0f})" for cell in top
                )
            )
        if args.write_benchmarks:
            per_cell = projected["(c) both: (a) and (b)"]
            args.write_benchmarks.mkdir(parents=True, exist_ok=True)
            for path in sorted(args.benchmarks.glob("*.tsv")):
                target = args.write_benchmarks / path.name
                shutil.copyfile(path, target)
                if path.name.startswith("attention_train-"):
                    wildcards = dict(p.split("~") for p in path.stem.removeprefix("attention_train-").split("-"))
                    cell = "/".join(wildcards[k] for k in ("task", "model", "attention"))
                    table = pd.read_csv(path, sep="\t")
                    table.loc[table.index[-1], "s"] = round(seconds[cell] * per_cell[cell][0] / measured[cell], 2)
                    table.to_csv(target, sep="\t", index=False)
            print(f"  the benchmark files with (c)'s projected attention_train seconds: {args.write_benchmarks}")


if __name__ == "__main__":
    main()
