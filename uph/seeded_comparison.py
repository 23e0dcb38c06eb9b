"""The seeded half of `make compare`: do two runs of seeded training (attention, attention_sweep,
copy_task, feedback) agree as samples of the same computation?

A run's float32 rounding changes its trajectory, so the same seed on another CPU is another draw, and
two regenerations agree only as samples. Each row (a table's keys, over its seeds) is judged in four
steps, each of which can fail:

1. **Structure.** The same rows, each seed once, the same seeds, the same number of NaNs per metric (a
   diverged run's NaN against a number is a change), the exact columns (family, lr_at_edge, the sweep's
   chosen and extended flags) identical. A change here is a disagreement, whatever the values.
2. **Means, per metric.** The difference of the two seed means d = mean_a - mean_b gets Welch's interval
   (unequal variances, Welch-Satterthwaite degrees of freedom), read against the metric's MARGIN:
     differ        Welch's interval at level 1 - 0.05 / m, Bonferroni over the m row-metric tests of the
                   whole seeded comparison, lies beyond the margin on one side: a change larger than the
                   study resolves. A regeneration that matches is called "differ" anywhere in it at most
                   5 % of the time, so a DISAGREE is evidence, not noise.
     agree         the two one-sided tests of equivalence (TOST, each at 0.05: Welch's 90 % interval)
                   put the difference within [-margin, +margin]: no difference the study resolves.
     undetermined  neither: too few seeds to tell (named by row, counted; exit 0).
   Seeds with no spread (every seed solved, accuracy 1.0) have a zero-width interval: agree within the
   margin, differ beyond it.
3. **Shares solved, per cell.** Where a cell's runs are bimodal (some seeds solve the task's
   validation set, token accuracy >= SOLVED, some do not: MQAR's triple kinds), a mean over a few seeds
   has a wide interval, and the share of seeds that solve is the quantity the study reports. The two
   runs' shares are compared by Boschloo's exact test (the uniformly more powerful cousin of Fisher's,
   for two binomials with small n), Bonferroni over the cells bimodal in either run: a share that moves
   from 10 of 10 to 5 of 10 gives p = 0.013, caught where at most three cells are bimodal; the default
   holds six, where 10 of 10 to 4 of 10 (p = 0.0032) is the smallest move caught.
4. **The protocol's own decisions.** A cell whose runs split at its chosen lr trains
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


def margin(metric: str) -> float:
    """The metric's MARGIN (module docstring), by the kind its name says."""
    if metric.endswith("acc") or metric == "diverged" or "alignment" in metric:
        return MARGIN["acc"]
    if metric.startswith("steps") or metric.endswith("step"):
        return MARGIN["steps"]
    return MARGIN["loss"]


def read_difference(a, b, margin: float, family: int) -> tuple[str, float, float, float]:
    """(verdict, d, low, high) of step 2 (module docstring): 'differ' where Welch's interval at Bonferroni's
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
    """One row-metric of step 2, judged once the family's size is known (judge_means)."""

    where: str
    metric: str
    a: np.ndarray
    b: np.ndarray


@dataclass
class SeededFindings:
    """What the seeded comparison found: disagreements (one line each), the undetermined row-metrics,
    the count that agree, and the values compared per table."""

    disagreements: list[str]
    undetermined: list[str]
    agreed: int
    compared: dict


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


def structure_and_means(
    name: str, reading: Comparison, a: pd.DataFrame, b: pd.DataFrame, out: SeededFindings
) -> list[MeanTest]:
    """Steps 1 and 2 up to the family's size: structure disagreements into `out`, and the mean tests of
    every row-metric both runs hold (their seeds with a number). `reading`: the table's comparison."""
    for frame, side in ((a, "RESULTS"), (b, "REFERENCE")):
        out.disagreements += duplicated_rows(name, (*reading.keys, "seed"), frame, side)
    groups = [dict(tuple(frame.groupby(list(reading.keys), dropna=False))) for frame in (a, b)]
    tests, compared = [], 0
    for key in sorted(set(groups[0]) | set(groups[1]), key=str):
        where = f"{name} [{row_name(reading.keys, key)}]"
        if key not in groups[0] or key not in groups[1]:
            out.disagreements.append(f"{where}: a row only {'RESULTS' if key in groups[0] else 'REFERENCE'} has")
            continue
        ra, rb = (
            group.drop_duplicates([*reading.keys, "seed"]).set_index("seed")
            for group in (groups[0][key], groups[1][key])
        )
        missing, extra = sorted(set(rb.index) - set(ra.index)), sorted(set(ra.index) - set(rb.index))
        if missing or extra:
            said = [f"seeds {missing} missing" if missing else "", f"seeds {extra} extra" if extra else ""]
            out.disagreements.append(
                f"{where}: {len(ra)} seeds against {len(rb)} ({', '.join(s for s in said if s)} in RESULTS)"
            )
        for column in reading.exact:
            compared += 1
            values = [sorted(map(str, frame[column].unique())) for frame in (ra, rb)]
            if values[0] != values[1]:
                out.disagreements.append(
                    f"{where} {column}: {'/'.join(values[0])} against {'/'.join(values[1])} (identical)"
                )
        for metric in reading.metrics:
            compared += 1
            va, vb = (frame[metric].astype(float) for frame in (ra, rb))
            nans = int(va.isna().sum()), int(vb.isna().sum())
            if nans[0] != nans[1]:
                out.disagreements.append(
                    f"{where} {metric}: NaN on {nans[0]} of {len(va)} seeds against {nans[1]} of {len(vb)} "
                    "(a run without a number, diverged, against one with: identical counts)"
                )
            tests.append(MeanTest(where, metric, va.dropna().to_numpy(), vb.dropna().to_numpy()))
    out.compared[name] = compared
    return tests


def judge_means(tests: list[MeanTest], out: SeededFindings) -> None:
    """Step 2: each test read with Bonferroni's family of all of them; the undetermined ones one line
    per row, naming its metrics."""
    undetermined: dict[str, list[str]] = {}
    for test in tests:
        m = margin(test.metric)
        if len(test.a) == 0 and len(test.b) == 0:
            out.agreed += 1
            continue
        if min(len(test.a), len(test.b)) < 2:
            undetermined.setdefault(test.where, []).append(f"{test.metric} ({len(test.a)} against {len(test.b)} seeds)")
            continue
        verdict, d, low, high = read_difference(test.a, test.b, m, len(tests))
        if verdict == "agree":
            out.agreed += 1
        elif verdict == "undetermined":
            undetermined.setdefault(test.where, []).append(f"{test.metric} {d:+.3g}")
        else:
            out.disagreements.append(
                f"{test.where} {test.metric}: {shown(float(test.a.mean()))} over {len(test.a)} seeds against "
                f"{shown(float(test.b.mean()))} over {len(test.b)}; difference {d:+.4g}, Welch interval "
                f"[{low:+.4g}, {high:+.4g}] (Bonferroni over {len(tests)}) beyond the margin {m:g}"
            )
    out.undetermined += [f"{where}: {', '.join(metrics)}" for where, metrics in undetermined.items()]


def solved_by_seed(attention: pd.DataFrame, cell: tuple[str, ...]) -> dict:
    """cell values -> per seed, whether its run at the chosen lr solved the validation set (val_token_acc
    >= SOLVED, not diverged), from the attention table's rows."""
    runs = attention.drop_duplicates([*cell, "seed"])
    solved = (runs["val_token_acc"].astype(float) >= SOLVED) & ~runs["diverged"].map(lambda v: str(v) == "True")
    return {key: group.tolist() for key, group in solved.groupby([runs[c] for c in cell])}


def shares_and_protocol(
    a: pd.DataFrame, b: pd.DataFrame, cell: tuple[str, ...], seeds_if_split, out: SeededFindings
) -> None:
    """Steps 3 and 4 on the attention table: the bimodal cells' shares solved, and each run's split
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
