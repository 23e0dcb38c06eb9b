"""Successive halving replayed on a finished run's attention sweeps: which lr each cell would choose, and
the run-steps it would save, had the sweep stopped its losing lrs early.

    .venv/bin/python benchmarks/sweep_halving.py --results results [--rungs 250 500 1000] [--margins 0.05 0.2]

The rule (Li et al.'s successive halving, with the sweep's own test of "behind" in place of a fixed
fraction kept): at each rung step s, every lr of the cell is scored by its sweep seeds' best validation
token accuracy up to s (a run that stopped before s keeps its final). The lr of the best mean is the
leader; an lr is stopped at s where the seeds separate it from the leader by more than `margin`, by
best_lr's own test (the lower end of Welch's 90 % interval of leader - lr above the margin; one seed a
side: the difference itself). A stopped run's sweep row is its best up to s, and it trains no further.
The chosen lr is then best_lr of those rows, as the full sweep chooses it. An lr the sweep tried beyond
the config's lrs (an extension) is replayed where the rows say the rule would still try it; a cell whose
replay asks for an lr the run never tried is reported as such, not guessed.

Reads every results/attention/**/sweep.parquet, its curves.parquet and its job record (the settings it ran with); prints, per rule, the cells whose
choice changes and the sweep's run-steps before and after. No training: a check of a rule on recorded
curves, before it is built into uph.attention.training.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from uph.attention.training import best_lr, extension, separated


def best_so_far(curves: pd.DataFrame, step: int) -> pd.Series:
    """(lr, seed) -> the best validation token accuracy of the rows at or before `step`."""
    return curves[curves["step"] <= step].groupby(["lr", "seed"])["val_token_acc"].max()


def stopped_lrs(curves, sweep_seeds, lrs, rungs, margin) -> dict[float, int]:
    """lr -> the rung it is stopped at, for the lrs `lrs` trained on `sweep_seeds`."""
    stopped: dict[float, int] = {}
    for rung in rungs:
        scores = best_so_far(curves, rung)
        alive = [lr for lr in lrs if lr not in stopped]
        accuracy = {lr: scores.reindex([(lr, s) for s in sweep_seeds]).to_numpy() for lr in alive}
        accuracy = {lr: a for lr, a in accuracy.items() if not pd.isna(a).any()}
        if len(accuracy) < 2:
            continue
        leader = accuracy[max(accuracy, key=lambda lr: accuracy[lr].mean())]
        for lr, runs in accuracy.items():
            if separated(leader, runs, margin):
                stopped[lr] = rung
    return stopped


def replay(sweep, curves, config_lrs, lr_step, extensions, rungs, margin):
    """(chosen lr of the replay or None where it needs an untried lr, run-steps of the sweep before,
    after) for one cell."""
    tried_all = sorted(sweep["lr"].unique())
    sweep_seeds = sorted(set.intersection(*(set(sweep.loc[sweep["lr"] == lr, "seed"]) for lr in tried_all)))
    runs = sweep[sweep["seed"].isin(sweep_seeds)].set_index(["lr", "seed"])
    tried = list(config_lrs)
    for _ in range(extensions + 1):
        stopped = stopped_lrs(curves, sweep_seeds, tried, rungs, margin)
        rows = runs.loc[[(lr, s) for lr in tried for s in sweep_seeds]].copy()
        for lr, rung in stopped.items():
            scores = best_so_far(curves, rung)
            for seed in sweep_seeds:
                if rows.loc[(lr, seed), "steps_run"] > rung:
                    rows.loc[(lr, seed), ["val_token_acc", "steps_run"]] = [scores[(lr, seed)], rung]
        chosen = best_lr(rows.reset_index())
        nxt = None if chosen is None else extension(chosen, tried, lr_step)
        if nxt is None or len(tried) - len(config_lrs) == extensions:
            break
        if not any(math.isclose(nxt, lr) for lr in tried_all):
            return None, runs["steps_run"].sum(), math.nan
        tried.append(next(lr for lr in tried_all if math.isclose(nxt, lr)))
    return chosen, runs["steps_run"].sum(), rows["steps_run"].sum()


def settings(results: Path, sweep_path: Path) -> dict:
    """The attention settings the cell's job ran with, from its record (uph.records)."""
    wildcards = dict(part.split("~") for part in sweep_path.parts[-4:-1])
    name = "-".join(f"{key}~{wildcards[key]}" for key in sorted(wildcards))
    return json.loads((results / "records/attention_train" / f"{name}.json").read_text())["settings"]["attention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--rungs", type=int, nargs="+", default=[250, 500, 1000])
    parser.add_argument("--margins", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
    args = parser.parse_args()
    cells = sorted(args.results.glob("attention/*/*/*/sweep.parquet"))
    print(f"{len(cells)} cells, rungs {args.rungs}")
    for margin in args.margins:
        before = after = 0
        changed = []
        for path in cells:
            sweep, curves = pd.read_parquet(path), pd.read_parquet(path.with_name("curves.parquet"))
            cfg = settings(args.results, path)
            actual = float(sweep.loc[sweep["chosen"], "lr"].iloc[0])
            chosen, steps, steps_after = replay(
                sweep, curves, cfg["lrs"], cfg["lr_step"], cfg["lr_extensions"], args.rungs, margin
            )
            name = "/".join(part.split("~")[1] for part in path.parts[-4:-1])
            before += steps
            after += steps if math.isnan(steps_after) else steps_after
            if chosen is None or not math.isclose(chosen, actual):
                changed.append(f"{name}: {actual:g} -> {'an untried lr' if chosen is None else f'{chosen:g}'}")
        print(
            f"margin {margin}: sweep run-steps {before:,} -> {after:,} ({after / before:.2f}); "
            f"choice changed in {len(changed)} of {len(cells)}: {'; '.join(changed) or 'none'}"
        )


if __name__ == "__main__":
    main()
