"""The seeded half of `make compare`'s statistical mode: do two runs of seeded training (attention,
attention_sweep, copy_task, feedback) agree as samples of the same computation?

A run's float32 rounding changes its trajectory, so the same seed on another CPU is another draw, and
two regenerations agree only as samples (on the same numerics they agree to the byte:
uph.exact_comparison). Each row (a table's keys, over its seeds) is judged in five steps, each of which can
fail:

1. **Structure.** The same rows, each seed once, the same seeds, the same number of NaNs per metric (a
   diverged run's NaN against a number is a change), the exact columns (family, lr_at_edge, the sweep's
   chosen and extended flags) identical seed by seed, one lr for all of a cell's rows. And the seeds'
   spread: a seed whose every metric repeats another seed's values in more rows than the other run shows
   (a seed that was not applied trains the same run twice) is a change, whatever the means.
2. **Each run's own tables agree** (consistent_runs): its attention rows are its sweep's chosen runs (the
   same validation accuracy, steps and best step, seed by seed), each with its training curve. Rows moved
   between cells or seeds in one table, not in the others, show here on any machine.
3. **Means, per metric.** The difference of the two seed means d = mean_a - mean_b gets Welch's interval
   (unequal variances, Welch-Satterthwaite degrees of freedom), read against the metric's MARGIN:
     differ        Welch's interval at level 1 - 0.05 / m, Bonferroni over the m mean tests of the
                   whole seeded comparison, lies beyond the margin on one side: a change larger than the
                   study resolves. A regeneration that matches is called "differ" anywhere in it at most
                   5 % of the time, so a DISAGREE is evidence, not noise.
     agree         the two one-sided tests of equivalence (TOST, each at 0.05: Welch's 90 % interval)
                   put the difference within [-margin, +margin]: no difference the study resolves.
     undetermined  neither: too few seeds to tell (named by row with the smallest shift its test would
                   catch, margin + the Bonferroni interval's half-width; exit 0).
   Each row is tested, and each training run's rows (a cell's test lengths and levels: Comparison.runs)
   averaged per seed, which sees a shift of a whole run through the rows' noise. Where a cell is bimodal
   (some seeds solve its validation set, val_token_acc >= SOLVED, some stall: MQAR's triple kinds), its
   solving and its stalling seeds are tested apart: a mixture's mean over a few seeds has a wide interval,
   each component's a narrow one. Seeds with no spread have a zero-width interval: agree within the
   margin, differ beyond it. The smallest shift each table's metric catches is printed (`power`).
4. **Shares solved, per cell.** The two runs' shares of seeds that solve a bimodal cell are compared by
   Boschloo's exact test (the uniformly more powerful cousin of Fisher's, for two binomials with small n),
   Bonferroni over the cells bimodal in either run: a share that moves from 10 of 10 to 5 of 10 gives
   p = 0.013, caught where at most three cells are bimodal; reference/default holds four, where 10 of 10 to 4 of
   10 (p = 0.0032) is the smallest move caught.
5. **The protocol's own decisions.** A cell whose runs split at its chosen lr trains
   `attention.seeds_if_split` seeds; a table whose split cell holds fewer was not made by this protocol
   (two of five seeds collapsed, with nothing else changed, reads so). Seed counts must match between
   the runs; the chosen lr is compared by uph.compare.lr_choices.

MARGIN, the smallest difference the study resolves, by the kind of metric (the end of its name):
- accuracies and cosines (acc, alignment; `diverged` as a share): 0.01. The study counts a run as
  solved from 0.99 (SOLVED), so 0.01 is the width of its finest decision; its figures read to 0.01.
- losses: 0.01 nats, the loss-axis resolution of the figures (training curves span 0.001 to 10 nats).
- steps: 50, one evaluation interval (attention.log_every): steps are known only to that grain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from uph.attention.study_config import SOLVED
from uph.stats import SIGNIFICANCE, welch_interval
from uph.tables import Comparison

MARGIN = {"acc": 0.01, "loss": 0.01, "steps": 50.0}
SAME_RUN = ("val_token_acc", "diverged", "steps_run", "best_step")  # an attention row's run, as its sweep has it
COMPONENTS = {True: "solving seeds", False: "stalling seeds"}


def margin(metric: str) -> float:
    """The metric's MARGIN (module docstring), by the kind its name says."""
    if metric.endswith("acc") or metric == "diverged" or "alignment" in metric:
        return MARGIN["acc"]
    if metric.startswith("steps") or metric.endswith("step"):
        return MARGIN["steps"]
    return MARGIN["loss"]


def read_difference(a, b, margin: float, family: int) -> tuple[str, float, float, float]:
    """(verdict, d, low, high) of step 3 (module docstring): 'differ' where Welch's interval at Bonferroni's
    level over `family` tests lies beyond the margin, 'agree' where the 90 % one (TOST) lies within it,
    else 'undetermined'; low and high are the Bonferroni interval's."""
    d, low, high = welch_interval(a, b, 1 - SIGNIFICANCE / family)
    if low > margin or high < -margin:
        return "differ", d, low, high
    _, tost_low, tost_high = welch_interval(a, b, 1 - 2 * SIGNIFICANCE)
    return ("agree" if -margin <= tost_low and tost_high <= margin else "undetermined"), d, low, high


def share_test(solved_a: int, n_a: int, solved_b: int, n_b: int) -> float:
    """Two-sided p of Boschloo's exact test that two runs solve with the same probability."""
    from scipy import stats

    if solved_a * n_b == solved_b * n_a:  # the same share: nothing to test (scipy warns on some)
        return 1.0
    return float(stats.boschloo_exact([[solved_a, n_a - solved_a], [solved_b, n_b - solved_b]]).pvalue)


@dataclass(frozen=True)
class MeanTest:
    """One mean test of step 3, judged once the family's size is known (judge_means): a row's or a run's
    metric over its seeds, or over one component's seeds of a bimodal cell."""

    table: str
    where: str
    metric: str
    a: np.ndarray
    b: np.ndarray
    level: str = "rows"  # "rows", or "runs": a run's rows averaged per seed


@dataclass
class SeededFindings:
    """What the seeded comparison found: disagreements (one line each), the undetermined row-metrics,
    the count that agree, the values compared per table and the smallest shift each table's metrics catch."""

    disagreements: list[str]
    undetermined: list[str]
    agreed: int
    compared: dict
    power: list[str]


def shown(value) -> str:
    """A table value as a disagreement line shows it: floats to 6 digits, NaN as NaN."""
    if isinstance(value, (float, np.floating)):
        return "NaN" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def row_name(keys, values) -> str:
    """'key=value, ...' of a row, NaN keys left out."""
    return ", ".join(f"{k}={shown(v)}" for k, v in zip(keys, values) if not (isinstance(v, float) and math.isnan(v)))


def duplicated_rows(name: str, columns, frame: pd.DataFrame, side: str) -> list[str]:
    """A line per row (its values of `columns`) that `frame` holds more than once."""
    twice = frame[list(columns)][frame[list(columns)].map(str).duplicated(keep="first")]
    return [
        f"{name} [{row_name(columns, row)}]: {side} holds this row more than once"
        for row in twice.itertuples(index=False)
    ]


def solving(frame: pd.DataFrame) -> pd.Series | None:
    """Per row of a run's table, whether its run solved the validation set (val_token_acc >= SOLVED, not
    diverged); None for a table without validation accuracy."""
    if "val_token_acc" not in frame.columns:
        return None
    diverged = written_true(frame["diverged"]) if "diverged" in frame.columns else False
    return (frame["val_token_acc"].astype(float) >= SOLVED) & ~diverged


def written_true(values: pd.Series) -> pd.Series:
    """Whether each value of a flag column reads True (a CSV's True, bool or text; NaN is not)."""
    return values.map(lambda v: str(v) == "True")


def repeated_seeds(frame: pd.DataFrame, metrics) -> list:
    """The seeds of one row (`frame` indexed by seed) whose every metric equals another seed's (NaN equal NaN)."""
    return sorted(frame.index[frame[list(metrics)].duplicated(keep=False)].tolist())


def per_seed_structure(where: str, reading: Comparison, ra: pd.DataFrame, rb: pd.DataFrame) -> list[str]:
    """Step 1 on one row, seeds indexed: the same seeds, the exact columns seed by seed, the NaNs."""
    lines = []
    missing, extra = sorted(set(rb.index) - set(ra.index)), sorted(set(ra.index) - set(rb.index))
    if missing or extra:
        said = [f"seeds {missing} missing" if missing else "", f"seeds {extra} extra" if extra else ""]
        lines.append(f"{where}: {len(ra)} seeds against {len(rb)} ({', '.join(s for s in said if s)} in RESULTS)")
    both = sorted(set(ra.index) & set(rb.index))
    for column in reading.exact:
        seeds = [seed for seed in both if shown(ra.at[seed, column]) != shown(rb.at[seed, column])]
        if seeds:
            values = ["/".join(dict.fromkeys(shown(frame.at[s, column]) for s in seeds)) for frame in (ra, rb)]
            lines.append(
                f"{where} {column}: {values[0]} against {values[1]} on seeds {seeds} (identical, seed by seed)"
            )
    for metric in reading.metrics:
        nans = int(ra[metric].isna().sum()), int(rb[metric].isna().sum())
        if nans[0] != nans[1]:
            lines.append(
                f"{where} {metric}: NaN on {nans[0]} of {len(ra)} seeds against {nans[1]} of {len(rb)} "
                "(a run without a number, diverged, against one with: identical counts)"
            )
    return lines


def mean_tests(
    name: str, where: str, metrics, ra: pd.DataFrame, rb: pd.DataFrame, level: str, solved
) -> list[MeanTest]:
    """Step 3's tests of one row or run (`ra`, `rb` indexed by seed): each metric over all seeds or, where
    the cell is bimodal in either run (`solved`: per run, whether each seed solves, or None), over its
    solving and its stalling seeds apart."""
    bimodal = solved[0] is not None and any(0 < int(s.sum()) < len(s) for s in solved)
    groups = (
        [(f"{where} ({COMPONENTS[c]})", ra[solved[0] == c], rb[solved[1] == c]) for c in (True, False)]
        if bimodal
        else [(where, ra, rb)]
    )
    return [
        MeanTest(name, label, metric, *(f[metric].astype(float).dropna().to_numpy() for f in (fa, fb)), level)
        for label, fa, fb in groups
        for metric in metrics
    ]


def one_choice_per_cell(name: str, reading: Comparison, frame: pd.DataFrame, side: str) -> list[str]:
    """A line per cell whose rows hold more than one value of a choice (its lr): a cell trains at one."""
    lines = []
    for column in reading.choices:
        for key, group in frame.groupby(list(reading.cell), dropna=False):
            values = group[column].map(shown)
            if values.nunique() > 1:
                odd = sorted(group.loc[values != values.mode().iloc[0], "seed"].unique().tolist())
                lines.append(
                    f"{name} [{row_name(reading.cell, key)}] {column}: {side} holds {'/'.join(sorted(values.unique()))} "
                    f"(seeds {odd} apart): a cell's runs share one {column}"
                )
    return lines


def structure_and_means(
    name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame, out: SeededFindings
) -> list[MeanTest]:
    """Steps 1 and 3 up to the family's size: structure disagreements into `out`, and the mean tests of
    every row-metric and run-metric both runs hold (their seeds with a number)."""
    for frame, side in ((a, "RESULTS"), (b, "REFERENCE")):
        out.disagreements += duplicated_rows(name, (*reading.keys, "seed"), frame, side)
        out.disagreements += one_choice_per_cell(name, reading, frame, side)
    groups = [dict(tuple(frame.groupby(list(reading.keys), dropna=False))) for frame in (a, b)]
    tests, repeats = [], {}
    for key in sorted(set(groups[0]) | set(groups[1]), key=str):
        where = f"{name} [{row_name(reading.keys, key)}]"
        if key not in groups[0] or key not in groups[1]:
            out.disagreements.append(f"{where}: a row only {'RESULTS' if key in groups[0] else 'REFERENCE'} has")
            continue
        ra, rb = (
            g.drop_duplicates([*reading.keys, "seed"]).set_index("seed") for g in (groups[0][key], groups[1][key])
        )
        out.disagreements += per_seed_structure(where, reading, ra, rb)
        seeds = tuple(tuple(repeated_seeds(frame, reading.metrics)) for frame in (ra, rb))
        if seeds[0] != seeds[1]:
            cell = tuple(key[reading.keys.index(c)] for c in reading.cell)
            repeats.setdefault((cell, seeds), []).append(key)
        tests += mean_tests(name, where, reading.metrics, ra, rb, "rows", [solving(f) for f in (ra, rb)])
    for (cell, seeds), rows in repeats.items():
        out.disagreements.append(
            f"{name} [{row_name(reading.cell, cell)}]: seeds {list(seeds[0])} of RESULTS hold one another's every value "
            f"in {len(rows)} rows, seeds {list(seeds[1])} of REFERENCE (a seed not applied trains one run twice)"
        )
    tests += run_tests(name, reading, a, b)
    out.compared[name] = len(tests) + sum(len(g) for g in groups[0].values()) * len(reading.exact)
    return tests


def run_tests(name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame) -> list[MeanTest]:
    """Step 3's run-level tests: each training run's rows (Comparison.runs names a run) averaged per seed over
    the rows both runs hold, metric by metric (a seed with a NaN row has no average)."""
    if not reading.runs:
        return []
    rows = [k for k in reading.keys if k not in reading.runs]
    runs = [dict(tuple(frame.groupby(list(reading.runs), dropna=False))) for frame in (a, b)]
    tests = []
    for key in sorted(set(runs[0]) & set(runs[1]), key=str):
        frames = [g.drop_duplicates([*reading.keys, "seed"]) for g in (runs[0][key], runs[1][key])]
        common = set.intersection(*(set(f[rows].itertuples(index=False, name=None)) for f in frames))
        kept = [f[[row in common for row in f[rows].itertuples(index=False, name=None)]] for f in frames]
        averaged = [
            f.groupby("seed")[list(reading.metrics)].agg(lambda v: v.astype(float).mean(skipna=False)) for f in kept
        ]
        solved = [None if (s := solving(f)) is None else s.groupby(f["seed"]).first() for f in kept]
        where = f"{name} [{row_name(reading.runs, key)}, its {len(common)} rows averaged]"
        tests += mean_tests(name, where, reading.metrics, *averaged, "runs", solved)
    return tests


def consistent_runs(attention: pd.DataFrame, sweep: pd.DataFrame, curves: pd.DataFrame, side: str) -> list[str]:
    """Step 2 on one run's tables: each attention run (cell, lr, seed) is a sweep row chosen there, with its
    validation accuracy, divergence, steps and best step (SAME_RUN), and has a training curve; the sweep
    chooses no other run. A line per cell where not."""
    run = ["task", "model", "attention", "lr", "seed"]
    runs = attention.drop_duplicates(run).set_index(run)
    chosen = sweep[written_true(sweep["chosen"])].set_index(run)
    curved = set(curves[run].drop_duplicates().itertuples(index=False, name=None))
    odd = {}
    for key in sorted(set(runs.index) | set(chosen.index), key=str):
        if key not in runs.index or key not in chosen.index:
            why = "not an attention run" if key not in runs.index else "not chosen in its sweep"
        elif differing := [c for c in SAME_RUN if shown(runs.at[key, c]) != shown(chosen.at[key, c])]:
            why = f"other values than its sweep's run ({', '.join(differing)})"
        elif key not in curved:
            why = "no training curve"
        else:
            continue
        odd.setdefault((key[:3], why, shown(key[3])), []).append(key[4])
    return [
        f"attention [{row_name(run[:3], cell)}]: {side}'s runs at lr {lr}, seeds {seeds}: {why}: the tables of one "
        "run disagree"
        for (cell, why, lr), seeds in odd.items()
    ]


def judge_means(tests: list[MeanTest], out: SeededFindings) -> None:
    """Step 3: each test read with Bonferroni's family of all of them; the undetermined ones one line per
    row, naming its metrics with the smallest shift each would catch; per table and metric the smallest
    shift caught on every row (and run) into `out.power`."""
    undetermined: dict[str, list[str]] = {}
    reach: dict[tuple, list[float]] = {}
    for test in tests:
        m = margin(test.metric)
        if len(test.a) == 0 and len(test.b) == 0:
            out.agreed += 1
            continue
        if min(len(test.a), len(test.b)) < 2:
            undetermined.setdefault(test.where, []).append(f"{test.metric} ({len(test.a)} against {len(test.b)} seeds)")
            continue
        verdict, d, low, high = read_difference(test.a, test.b, m, len(tests))
        caught = m + (high - low) / 2  # a shift of every seed by more is called differ
        reach.setdefault((test.table, test.metric, test.level), []).append(caught)
        if verdict == "agree":
            out.agreed += 1
        elif verdict == "undetermined":
            undetermined.setdefault(test.where, []).append(f"{test.metric} {d:+.3g} (catches {caught:.3g})")
        else:
            out.disagreements.append(
                f"{test.where} {test.metric}: {shown(float(test.a.mean()))} over {len(test.a)} seeds against "
                f"{shown(float(test.b.mean()))} over {len(test.b)}; difference {d:+.4g}, Welch interval "
                f"[{low:+.4g}, {high:+.4g}] (Bonferroni over {len(tests)}) beyond the margin {m:g}"
            )
    out.undetermined += [f"{where}: {', '.join(metrics)}" for where, metrics in undetermined.items()]
    out.power += [
        f"{table} {metric}, {len(shifts)} {level}: a shift of every seed is caught beyond {min(shifts):.3g} on the "
        f"best measured, {float(np.median(shifts)):.3g} on the median, {max(shifts):.3g} on every one"
        for (table, metric, level), shifts in reach.items()
    ]


def solved_by_seed(attention: pd.DataFrame, cell: tuple[str, ...]) -> dict:
    """cell values -> per seed, whether its run at the chosen lr solved the validation set (val_token_acc
    >= SOLVED, not diverged), from the attention table's rows."""
    runs = attention.drop_duplicates([*cell, "seed"])
    solved = solving(runs)
    return {key: group.tolist() for key, group in solved.groupby([runs[c] for c in cell])}


def shares_and_protocol(
    a: pd.DataFrame, b: pd.DataFrame, cell: tuple[str, ...], seeds_if_split, out: SeededFindings
) -> None:
    """Steps 4 and 5 on the attention table: the bimodal cells' shares solved, and each run's split
    cells holding the seeds the protocol gives them."""
    solved = [solved_by_seed(frame, cell) for frame in (a, b)]
    for runs, side in zip(solved, ("RESULTS", "REFERENCE")):
        for key, seeds in sorted(runs.items(), key=str):
            if seeds_if_split and 0 < sum(seeds) < len(seeds) < seeds_if_split:
                out.disagreements.append(
                    f"attention [{row_name(cell, key)}]: {side}'s runs split at its lr ({sum(seeds)} of {len(seeds)} "
                    f"seeds solve validation) but it holds {len(seeds)} seeds where the protocol trains "
                    f"attention.seeds_if_split = {seeds_if_split}: not a run of this config"
                )
    bimodal = [k for k in set(solved[0]) & set(solved[1]) if any(0 < sum(s[k]) < len(s[k]) for s in solved)]
    for key in sorted(bimodal, key=str):
        sa, sb = solved[0][key], solved[1][key]
        p = share_test(sum(sa), len(sa), sum(sb), len(sb))
        if p < SIGNIFICANCE / len(bimodal):
            out.disagreements.append(
                f"attention [{row_name(cell, key)}] share of seeds solving validation: {sum(sa)} of {len(sa)} against "
                f"{sum(sb)} of {len(sb)} (Boschloo p = {p:.2g}, below {SIGNIFICANCE:g} / {len(bimodal)} bimodal cells)"
            )
    out.compared["attention shares"] = len(bimodal)
