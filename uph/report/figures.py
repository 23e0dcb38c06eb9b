"""The study's figures, drawn from its tables and curves alone (`uph.report.study.Study`).

One function per figure family draws into a given matplotlib Figure; `render(name, study)` makes
the Figure at its fixed paper size and `save` writes it as PNG (fixed dpi, so a figure is always
the same number of pixels) and PDF (no creation date, so reruns give identical bytes); `save_all` draws
and writes a set of them, a process each where given several. Figures are
built with `matplotlib.figure.Figure` directly: no pyplot state, no GUI backend. Colours come from
the Okabe-Ito palette (distinguishable with every common colour-vision deficiency), assigned to
names in a fixed order so a head, attention or method keeps its colour in every figure; the
cross-user heatmap uses ColorBrewer's diverging RdBu, also colour-blind safe.

Units: NLL changes are in 10^-3 nats per token (millinats), negative = the arm predicts the held-out
text better than its reference (the frozen model; the global theta for the personal gain beyond it). Spread over seeds is min to max.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from uph.config import schema_enum
from uph.io import atomic_path
from uph.report.answers import MATCHED_CONTROLS
from uph.report.catalog import FIGURES
from uph.report.study import (
    MILLI,
    Study,
    baselines_at,
    headline_solver,
    ordered,
    over_seeds,
    seed_counts,
    split_baselines,
)
from uph.stats import diagonal_dominance, p_text

OKABE_ITO = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
DPI = 200
# the names in their schema order (the code's registries, tests/test_registries.py), so colors stay put
HEADS, ATTENTIONS, METHODS = (
    schema_enum("fit", "heads"),
    schema_enum("attention", "attentions"),
    schema_enum("feedback", "methods"),
)
STYLE = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "legend.frameon": False,
    "pdf.fonttype": 42,
    "axes.prop_cycle": mpl.cycler(color=OKABE_ITO),
}


def literal(label) -> str:
    """A label that comes from data (a user id, a model, head or kind name) drawn as itself, on one line.
    Matplotlib reads a text with two unescaped `$` as mathtext (as its log-axis formatters write their
    ticks: 10^-1); outside mathtext `$` is the only special character, and it draws an escaped `\\$`
    as `$`. A line break shows as ↵ so that a label keeps to its line."""
    return re.sub(r"\r\n|\r|\n", "↵", str(label).replace("$", r"\$"))


def palette(names, order) -> dict:
    """name -> colour, by position in the known `order` so colours agree across figures."""
    return {name: OKABE_ITO[i % len(OKABE_ITO)] for i, name in enumerate(ordered(names, order))}


CONTROL_STYLE = {"linestyle": "--", "markerfacecolor": "none"}  # a matched control: dashed, open markers
ATTENTION_COLORS = [*(c for c in OKABE_ITO if c != "#F0E442"), "#F0E442"]  # the pale yellow last: 7 kinds need 7


def attention_styles(names) -> dict[str, dict]:
    """attention kind -> its line style, for the kinds in `names` in ATTENTIONS order. A kind's colour is
    fixed by its place in ATTENTIONS, whichever kinds ran, so it keeps its colour in every attention
    figure; a matched control (uph.report.answers.MATCHED_CONTROLS) takes its triple variant's colour,
    dashed with open markers (CONTROL_STYLE), so each pair reads at a glance. The nine kinds need seven
    colours."""
    variant_of = {control: variant for variant, control in MATCHED_CONTROLS.items()}
    kinds = ordered(names, ATTENTIONS)
    leaders = list(dict.fromkeys(variant_of.get(kind, kind) for kind in [*ATTENTIONS, *kinds]))
    colors = {kind: ATTENTION_COLORS[i % len(ATTENTION_COLORS)] for i, kind in enumerate(leaders)}
    return {
        kind: {"color": colors[variant_of.get(kind, kind)], **(CONTROL_STYLE if kind in variant_of else {})}
        for kind in kinds
    }


def _log2_axis(ax, ticks) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    if len(ticks) == 1:  # one tick: give the log axis some room either side
        ax.set_xlim(ticks[0] / 2, ticks[0] * 2)


def _dodge(i: int, n: int, spread: float = 0.12) -> float:
    """Multiplicative x offset of series i of n on a log axis, so error bars do not overlap."""
    return 2.0 ** (spread * (i - (n - 1) / 2))


def _mean_and_spread(ax, run: pd.DataFrame, x: str, y: str, color, label=None, linestyle="-") -> None:
    """Mean over seeds as a line, min to max over seeds as a band."""
    stats = run.groupby(x)[y].agg(["mean", "min", "max"])
    ax.plot(stats.index, stats["mean"], color=color, label=label, linestyle=linestyle)
    ax.fill_between(stats.index, stats["min"], stats["max"], color=color, alpha=0.2, linewidth=0)


COMPARISONS = {  # personalization.csv control -> what its delta_nll compares, drawn left to right
    "global": "base → global θ\n(domain adaptation)",
    "personal": "base → personal θ\n(grey: baselines)",
    "global+personal": "global → + residual θ\n(beyond global)",
    "own vs others": "others' residual → own\n(the personal gain)",
}


def _errorbar(ax, rows: pd.DataFrame, x, color, label=None, **style) -> None:
    """delta_nll of `rows` with its 95 % interval, in millinats."""
    y = rows["delta_nll"] * MILLI
    yerr = [y - rows["delta_nll_ci_low"] * MILLI, rows["delta_nll_ci_high"] * MILLI - y]
    ax.errorbar(x, y, yerr=yerr, color=color, capsize=2, label=label, **{"marker": "o", **style})


BASELINE_MARKERS = {"unigram": "D", "full_bias": "s", "neural_cache": "^"}  # the baselines, at their parameters


def _apart(values, factor: float = 2.0) -> list[int]:
    """The distinct `values` a log axis can label: each at least `factor` times the last kept (V + 1 is
    not labelled beside V)."""
    kept = []
    for value in sorted({int(v) for v in values}):
        if not kept or value >= factor * kept[-1]:
            kept.append(value)
    return kept


def line_styles(keys) -> dict:
    """A line style for each of `keys` (a figure's second key beside its colors: d, a layer), in order."""
    return dict(zip(keys, itertools.cycle(["-", "--", ":", "-."])))


def d_handles(styles: dict) -> list[Line2D]:
    """Legend entries naming each d's line style."""
    return [Line2D([], [], color="0.3", linestyle=style, label=f"d = {d:g}") for d, style in styles.items()]


def personalization(fig: Figure, study: Study) -> None:
    """Four comparisons side by side (columns), one row per alpha: held-out NLL change against the
    parameters per user, each method at its chosen capacity with its 95 % paired bootstrap interval over
    users: base -> global theta, base -> personal theta, global -> global + residual theta, and the others'
    mean residual -> the own residual (both on top of the global theta). The heads are lines over d; the
    baselines (the full bias, V parameters, the unigram, V + 1, and the neural cache, the user's stored
    train states) are grey points in the arms they have."""
    solver = headline_solver(study.personalization)
    heads, _ = split_baselines(study.personalization)
    table = heads[heads["solver"] == solver]
    baselines = {control: baselines_at(study.personalization, solver, control) for control in COMPARISONS}
    alphas = sorted(table["alpha"].unique())
    ticks = sorted(
        {int(d) for d in table["d"]} | set(_apart(p for rows in baselines.values() for p in rows["params_per_user"]))
    )
    colors = palette(table["head"], HEADS)
    axes = fig.subplots(len(alphas), len(COMPARISONS), sharex=True, sharey=True, squeeze=False)
    for row, alpha in enumerate(alphas):
        at_alpha = table[table["alpha"] == alpha]
        for ax, (control, title) in zip(axes[row], COMPARISONS.items()):
            for i, head in enumerate(colors):
                rows = at_alpha[(at_alpha["head"] == head) & (at_alpha["control"] == control)].sort_values("d")
                _errorbar(ax, rows, rows["d"] * _dodge(i, len(colors), spread=0.1), colors[head])
            for head, rows in baselines[control].groupby("head"):
                _errorbar(ax, rows, rows["params_per_user"], "0.35", marker=BASELINE_MARKERS.get(head, "o"))
            ax.axhline(0, color="0.4", linewidth=0.8)
            _log2_axis(ax, ticks)
            ax.tick_params(axis="x", labelrotation=90)
            if row == 0:
                ax.set_title(title)
        axes[row, 0].set_ylabel(f"Δ NLL, α = {alpha:g}\n(10⁻³ nats/token)")
    fig.supxlabel(
        "parameters per user: d for a head; V for the full bias, V + 1 for the unigram,\n"
        "(H + 1) × the user's train tokens for the neural cache (its stored states)"
    )
    handles = [Line2D([], [], color=color, marker="o", label=literal(head)) for head, color in colors.items()]
    handles += [
        Line2D(
            [],
            [],
            color="0.35",
            marker=BASELINE_MARKERS.get(head, "o"),
            linestyle="",
            label=literal(head),  # grey: a baseline (the panel titles say so)
        )
        for head in sorted({head for rows in baselines.values() for head in rows["head"]})
    ]
    fig.legend(handles=handles, loc="outside right center")
    users = int(table["n_users"].max())
    fig.suptitle(
        f"{literal(table['model'].iloc[0])}, {literal(solver)} solver, {users} users, each method at its capacity chosen on "
        "validation:\nmean over users with 95 % paired bootstrap interval (lower is better)"
    )


def capacity(fig: Figure, study: Study) -> None:
    """The capacity path: the mean validation NLL over users against the ball's radius (log axis), one
    panel per arm, a line per head (its color) and d (its line style, where the sweep has several) and
    the full bias at all of each user's train tokens, the chosen radius ringed (uph.lm.engine.capacity).
    The caches' lambda (and temperature) are other knobs: their curves are in the table."""
    solver = headline_solver(study.personalization)
    table = study.capacity[(study.capacity["solver"] == solver) & study.capacity["train_tokens"].isna()]
    table = table[~table["head"].isin(("unigram", "neural_cache"))]
    colors = palette(table["head"], (*HEADS, "full_bias"))
    ds = sorted(table.loc[table["head"] != "full_bias", "d"].dropna().unique())  # the full bias: d = V, its own color
    linestyles = line_styles(ds)
    axes = fig.subplots(1, 3, squeeze=False)[0]
    for ax, arm in zip(axes, ("global", "personal", "residual")):
        for (head, _alpha, d), rows in table[table["arm"] == arm].groupby(
            ["head", "alpha", "d"], sort=True, dropna=False
        ):
            rows, style = rows.sort_values("capacity"), {"color": colors[head], "linestyle": linestyles.get(d, "-")}
            ax.plot(rows["capacity"], rows["validation_nll"], marker=".", label=literal(head), **style)
            picked = rows[rows["chosen"]]
            ax.plot(picked["capacity"], picked["validation_nll"], marker="o", markersize=9, fillstyle="none", **style)
        ax.set_xscale("log")
        ax.set_xlabel("radius of the ball ‖θ‖ ≤ r")
        ax.set_title(arm)
    axes[0].set_ylabel("validation NLL (nats/token)")
    handles = [Line2D([], [], color=color, label=literal(head)) for head, color in colors.items()]
    if len(ds) > 1:
        handles += d_handles(linestyles)
    fig.legend(handles=handles, loc="outside right center")
    fig.suptitle(f"Capacity chosen on validation, {literal(solver)} solver: mean over users, ○ the chosen radius")


def dose_response(fig: Figure, study: Study) -> None:
    """The personal gain beyond global (global -> global + personal) against the user's train tokens
    the residual theta was fitted on, one panel per alpha: a line per head and d, its 95 % interval a band."""
    solver = headline_solver(study.personalization)
    table = study.dose_response[study.dose_response["solver"] == solver]
    if table.empty:
        fig.subplots().text(0.5, 0.5, f"no dose-response point for the {solver} solver", ha="center")
        return
    alphas = sorted(table["alpha"].unique())
    colors = palette(table["head"], HEADS)
    linestyles = line_styles(sorted(table["d"].unique()))
    ticks = sorted(round(tokens) for tokens in table["train_tokens"].unique())
    axes = fig.subplots(1, len(alphas), sharey=True, squeeze=False)[0]
    for ax, alpha in zip(axes, alphas):
        for (head, d), rows in table[table["alpha"] == alpha].groupby(["head", "d"], sort=True):
            rows, color = rows.sort_values("train_tokens"), colors[head]
            fixed, everything = rows[~rows["all_train_tokens"]], rows[rows["all_train_tokens"]]
            x = fixed["train_tokens"]
            ax.plot(x, fixed["delta_nll"] * MILLI, color=color, linestyle=linestyles[d], marker="o")
            ax.fill_between(
                x,
                fixed["delta_nll_ci_low"] * MILLI,
                fixed["delta_nll_ci_high"] * MILLI,
                color=color,
                alpha=0.2,
                linewidth=0,
            )
            ax.errorbar(
                everything["train_tokens"],
                everything["delta_nll"] * MILLI,
                yerr=[
                    (everything["delta_nll"] - everything["delta_nll_ci_low"]) * MILLI,
                    (everything["delta_nll_ci_high"] - everything["delta_nll"]) * MILLI,
                ],
                color=color,
                marker="*",
                markersize=10,
                linestyle="none",
            )
        ax.axhline(0, color="0.4", linewidth=0.8)
        _log2_axis(ax, ticks)
        ax.set_xlabel("first k train tokens (users with more than k); ★ all of each user's (at their mean)")
        ax.set_title(f"α = {alpha:g}")
    axes[0].set_ylabel("Δ NLL beyond global θ\n(10⁻³ nats/token)")
    handles = [Line2D([], [], color=color, label=literal(head)) for head, color in colors.items()]
    handles += d_handles(linestyles)
    fig.legend(handles=handles, loc="outside right center")
    fig.suptitle(f"Personal gain beyond the global θ, {literal(solver)} solver: mean over users, 95 % interval band")


NAMED_USERS = 40  # the cross-user matrix names up to this many users; beyond, the plays, each over its block of roles


def play_starts(users: list[str]) -> list[int]:
    """The index of each play's first user in `users` (sorted 'play/role' ids: a play's roles are
    consecutive); every user its own where ids name no play."""
    plays = [user.split("/")[0] if "/" in user else user for user in users]
    return [k for k in range(len(users)) if k == 0 or plays[k] != plays[k - 1]]


def user_ticks(users: list[str]) -> tuple[list[float], list[str]]:
    """Tick positions and labels for a matrix over `users`: each user up to NAMED_USERS; beyond, each
    play at the middle of its block of roles (alphabetical within it), or, where ids name no plays,
    every k-th user."""
    if len(users) <= NAMED_USERS:
        return list(range(len(users))), [literal(user) for user in users]
    starts = play_starts(users)
    if len(starts) > NAMED_USERS:  # no plays to group by: name every k-th user
        step = -(-len(users) // NAMED_USERS)
        return list(range(0, len(users), step)), [literal(users[k]) for k in range(0, len(users), step)]
    ends = [*starts[1:], len(users)]
    return [(a + b - 1) / 2 for a, b in zip(starts, ends)], [
        literal(f"{users[a].split('/')[0]} ({b - a})") for a, b in zip(starts, ends)
    ]


def cross_user(fig: Figure, study: Study) -> None:
    """Residual theta of user u (rows, on top of the global theta) scored on the held-out text of user v
    (columns), against the global theta alone; rows and columns in one user order, the diagonal (own
    theta on own text) outlined, the colour scale centred on 0. A personal gain shows as a diagonal
    bluer than the rest of its column. Each title carries the diagonal dominance (uph.stats.diagonal_dominance)."""
    points = list(study.cross_user.groupby(["head", "alpha", "d", "solver"], sort=True))
    if not points:
        fig.subplots().text(0.5, 0.5, "no cross-user point configured (fit.cross_user)", ha="center")
        return
    limit = study.cross_user["delta_nll"].abs().max() * MILLI or 1.0
    norm = mpl.colors.CenteredNorm(vcenter=0.0, halfrange=limit)
    axes = fig.subplots(1, len(points), squeeze=False)[0]
    for ax, ((head, alpha, d, solver), pairs) in zip(axes, points):
        users = sorted(pairs["theta_user"].unique())
        matrix = (pairs.pivot(index="theta_user", columns="text_user", values="delta_nll") * MILLI).loc[users, users]
        image = ax.imshow(matrix.to_numpy(), cmap="RdBu_r", norm=norm)
        ax.grid(False)
        n = len(users)
        for k in range(n):
            outline = 0.8 if n <= NAMED_USERS else 0.25
            ax.add_patch(Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=outline))
        ticks, names = user_ticks(users)
        size = min(6.0, 150 / max(len(ticks), 1))  # points: each name fits its row (or its play's block)
        ax.set_xticks(ticks, names, rotation=90, fontsize=size)
        ax.set_yticks(ticks, names if ax is axes[0] else [], fontsize=size)
        ax.tick_params(length=0)
        for start in play_starts(users)[1:] if n > NAMED_USERS else []:
            ax.axhline(start - 0.5, color="0.25", linewidth=0.4)
            ax.axvline(start - 0.5, color="0.25", linewidth=0.4)
        if n <= 12:
            for (row, col), value in np.ndenumerate(matrix.to_numpy()):
                color = "white" if abs(value) > 0.6 * limit else "black"
                ax.text(col, row, f"{value:.1f}", ha="center", va="center", fontsize=6, color=color)
        ax.set_xlabel("held-out text of user")
        if ax is axes[0]:
            ax.set_ylabel("residual θ fitted on user")
        dominance = diagonal_dominance(pairs)
        ax.set_title(
            f"{literal(head)}, α = {alpha:g}, d = {d:g} ({literal(solver)})\n"
            f"own θ (outlined): mean rank {dominance['mean_rank']:.2f} of {n}\n"
            f"(chance {dominance['mean_rank_chance']:g}, {p_text(dominance['mean_rank_p'], dominance['mean_rank_p_floor'])}), the best\n"
            f"on {round(dominance['frac_own_best'] * n)} of {n} texts (chance 1)"
        )
    fig.colorbar(image, ax=axes.tolist(), label="Δ NLL against the global θ (10⁻³ nats/token)", shrink=0.8)


def solver_gap(fig: Figure, study: Study) -> None:
    """How far seed 002's Adam schedule (solver `adam`) stops from the certified optimum (`exact`):
    the mean fit objective's excess, and the worst user's projected-gradient norm per solver."""
    heads, _ = split_baselines(study.personalization)
    table = heads[heads["control"] == "personal"]
    objective = table.pivot_table(index=["head", "alpha", "d"], columns="solver", values="fit_objective")
    colors = palette(table["head"], HEADS)
    markers = dict(zip(sorted(table["alpha"].unique()), itertools.cycle("os^Dv")))
    gap_ax, certificate_ax = fig.subplots(1, 2, width_ratios=[3, 2])
    if {"adam", "exact"} <= set(objective.columns):
        gap = (objective["adam"] - objective["exact"]) * MILLI
        ds = sorted(table["d"].astype(int).unique())
        for i, head in enumerate(colors):
            for alpha, marker in markers.items():
                rows = gap.xs((head, alpha), level=["head", "alpha"])
                gap_ax.plot(
                    rows.index * _dodge(i, len(colors)), rows, color=colors[head], marker=marker, linestyle="none"
                )
        _log2_axis(gap_ax, ds)
    else:
        gap_ax.set_axis_off()
        gap_ax.text(0.5, 0.5, "needs fit.solvers adam and exact", ha="center", transform=gap_ax.transAxes)
    gap_ax.set_xlabel("d (parameters per user)")
    gap_ax.set_ylabel("objective excess, adam − exact (10⁻³ nats)")
    gap_ax.set_title("mean fit objective J(θ) above the optimum")
    solvers = ordered(table["solver"], ("adam", "exact"))
    for i, solver in enumerate(solvers):
        rows = table[table["solver"] == solver]
        jitter = np.linspace(-0.15, 0.15, len(rows)) if len(rows) > 1 else np.zeros(1)
        certificate_ax.scatter(i + jitter, rows["fit_certificate_max"], c=rows["head"].map(colors), s=12)
    certificate_ax.set_yscale("log")
    certificate_ax.set_xticks(range(len(solvers)), map(literal, solvers))
    certificate_ax.set_xlim(-0.6, len(solvers) - 0.4)
    certificate_ax.set_xlabel("solver")
    certificate_ax.set_ylabel("projected-gradient norm, worst user")
    certificate_ax.set_title("optimality certificate")
    handles = [Line2D([], [], color=c, marker="o", linestyle="none", label=literal(h)) for h, c in colors.items()]
    handles += [Line2D([], [], color="0.3", marker=m, linestyle="none", label=f"α = {a:g}") for a, m in markers.items()]
    fig.legend(handles=handles, loc="outside right center")


def copy_task_curves(fig: Figure, study: Study) -> None:
    """Copy loss and token accuracy on the copied half at the training length along training."""
    curves = study.copy_task_curves
    colors = palette(curves["attention"], ATTENTIONS)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for attention, color in colors.items():
        run = curves[curves["attention"] == attention]
        _mean_and_spread(loss_ax, run, "step", "loss", color, label=literal(attention))
        _mean_and_spread(acc_ax, run, "step", "token_acc", color)
    acc_ax.axhline(1 / study.copy_task_vocab, color="0.4", linestyle=":", linewidth=0.8, label="chance (1/vocab)")
    loss_ax.set_yscale("log")
    loss_ax.yaxis.set_major_formatter("{x:g}")  # 0.1 and 2.1 rather than 10^-1 and 2.1x10^0
    loss_ax.yaxis.set_minor_formatter(mpl.ticker.LogFormatter(labelOnlyBase=False))
    loss_ax.set_ylabel("copy loss (nats/token)")
    acc_ax.set_ylabel("token accuracy on the copied half")
    acc_ax.set_ylim(0, 1.02)
    for ax in (loss_ax, acc_ax):
        ax.set_xlabel("training step")
    fig.legend(loc="outside right center")
    fig.suptitle(f"Copy task at the training length: mean and min–max over {seed_counts(curves)}")


def copy_task_lengths(fig: Figure, study: Study) -> None:
    """Token and whole-sequence accuracy on the copied half against the evaluation length."""
    table = study.copy_task
    colors = palette(table["attention"], ATTENTIONS)
    lengths = sorted(table["eval_len"].unique())
    axes = fig.subplots(1, 2, sharey=True)
    for ax, metric, title in zip(axes, ("token_acc", "seq_acc"), ("token accuracy", "whole-sequence accuracy")):
        for i, (attention, color) in enumerate(colors.items()):
            stats = table[table["attention"] == attention].groupby("eval_len")[metric].agg(["mean", "min", "max"])
            x = stats.index * _dodge(i, len(colors), spread=0.05)
            ax.errorbar(
                x,
                stats["mean"],
                yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                color=color,
                marker="o",
                capsize=2,
                label=literal(attention) if metric == "token_acc" else None,
            )
        ax.axvline(
            table["train_len"].iloc[0],
            color="0.4",
            linestyle="--",
            linewidth=0.8,
            label="training length" if metric == "token_acc" else None,
        )
        _log2_axis(ax, lengths)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_title(title)
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("accuracy on the copied half")
    axes[0].axhline(1 / study.copy_task_vocab, color="0.4", linestyle=":", linewidth=0.8, label="chance (1/vocab)")
    fig.legend(loc="outside right center")


def gram_resilience(fig: Figure, study: Study) -> None:
    """Seed 004's resilience table: a loud mismatch k = m e3 + 0.1 q keeps q·k = 0.1 at every
    magnitude m while the Gram score falls as -m²; the true match (in the q, r plane) scores 0."""
    table = study.gram_resilience
    loud = table[table["result"] != "True Match"]
    match = table[table["result"] == "True Match"]
    ax = fig.subplots()
    for column, color, label in (
        ("dot", OKABE_ITO[0], "dot product q·k"),
        ("gram", OKABE_ITO[1], "Gram score −det G(q, k, r)"),
    ):
        ax.plot(loud["magnitude"], loud[column], color=color, marker="o", label=f"{label}, loud mismatch")
        ax.plot(match["magnitude"], match[column], color=color, marker="*", markersize=9, linestyle="none")
    ax.plot([], [], color="0.3", marker="*", markersize=9, linestyle="none", label="true match (both scores)")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xlabel("mismatch magnitude m\n(|k| outside the q, r plane)")
    ax.set_ylabel("attention score (symlog)")
    fig.legend(loc="outside lower center")


LEVELS = {"loud_copy": "distractor loudness m", "mqar": "key-value pairs"}  # the swept quantity of a task
MODEL_MARKERS = {"residual": "o", "seed": "s"}  # several models: one marker each (line styles mark the controls)


def _interval(ax, stats: pd.DataFrame, x: str, color, label=None, **style) -> None:
    """Mean over seeds with its 95 % Student-t interval (uph.report.study.over_seeds)."""
    yerr = [stats["mean"] - stats["ci_low"], stats["ci_high"] - stats["mean"]]
    ax.errorbar(stats[x], stats["mean"], yerr=yerr, color=color, capsize=2, label=label, **{"marker": "o", **style})


def _attention_task(fig: Figure, study: Study, task: str) -> None:
    """Test token accuracy of `task` against the evaluation length (mean over its levels) and, for a
    task with levels, against the level at the training length; sequence accuracy otherwise. A kind's
    colour and line style come from attention_styles (a matched control dashed in its variant's colour);
    with several models, each model has its marker."""
    table = study.attention[study.attention["task"] == task] if study.attention is not None else pd.DataFrame()
    axes = fig.subplots(1, 2)
    if table.empty:
        for ax in axes:
            ax.text(0.5, 0.5, f"{task} not run (attention.tasks)", ha="center", va="center", transform=ax.transAxes)
        return
    lengths = sorted(table["eval_len"].unique())
    handles = _attention_kinds(axes, table, task)
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
    _log2_axis(axes[0], lengths)
    train_len = table.loc[table["eval_len"] == table["train_len"], "train_len"].iloc[0]
    axes[0].axvline(train_len, color="0.4", linestyle=":", linewidth=0.8)
    handles.append(Line2D([], [], color="0.4", linestyle=":", linewidth=0.8, label="training length"))
    axes[0].set_xlabel("evaluation length (tokens)")
    axes[0].set_ylabel("test token accuracy")
    if task in LEVELS:
        levels = sorted(table["level"].unique())
        axes[1].set_xscale("log" if task == "loud_copy" else "linear")
        axes[1].set_xticks(levels, [f"{level:g}" for level in levels])
        axes[1].minorticks_off()
        axes[1].set_xlabel(f"{LEVELS[task]} (at the training length)")
        axes[1].set_ylabel("test token accuracy")
    else:
        _log2_axis(axes[1], lengths)
        axes[1].set_xlabel("evaluation length (tokens)")
        axes[1].set_ylabel("whole-sequence accuracy")
    fig.legend(handles=handles, loc="outside right center")
    fig.suptitle(
        f"{literal(task)}: mean and 95 % Student-t interval over {seed_counts(table)}, each kind at its best validation lr"
    )


def _attention_kinds(axes, table: pd.DataFrame, task: str) -> list[Line2D]:
    """Each kind's and model's intervals: test token accuracy against the evaluation length (left), and
    against the level at the training length for a task with levels, else sequence accuracy against the
    evaluation length (right). Returns the legend's handles: the kinds, then the models where several."""
    styles = attention_styles(table["attention"])
    at_train = table[table["eval_len"] == table["train_len"]]
    x, metric, source = ("level", "token_acc", at_train) if task in LEVELS else ("eval_len", "seq_acc", table)
    models = ordered(table["model"], list(MODEL_MARKERS))
    markers = {model: MODEL_MARKERS.get(model, "^") if len(models) > 1 else "o" for model in models}
    handles = []
    for i, (attention, kind_style) in enumerate(styles.items()):
        rows = table[table["attention"] == attention]
        label = literal(attention)
        if task == "loud_copy" and rows.get("loudness_invariant", pd.Series([False])).any():
            label += " (m divides out)"
        handles.append(Line2D([], [], marker="o", label=label, **kind_style))
        for model in models:
            runs = rows[rows["model"] == model]
            if runs.empty:
                continue
            style = {**kind_style, "marker": markers[model]}
            stats = over_seeds(runs, ["eval_len"], "token_acc")
            dodged = stats.assign(eval_len=stats["eval_len"] * _dodge(i, len(styles), 0.05))
            _interval(axes[0], dodged, "eval_len", **style)
            stats = over_seeds(source[(source["model"] == model) & (source["attention"] == attention)], [x], metric)
            if x == "eval_len":
                stats[x] = stats[x] * _dodge(i, len(styles), 0.05)
            _interval(axes[1], stats, x, **style)
    if len(models) > 1:
        handles += [
            Line2D([], [], color="0.3", marker=markers[model], linestyle="none", label=f"{literal(model)} model")
            for model in models
        ]
    return handles


def attention_offset_copy(fig: Figure, study: Study) -> None:
    _attention_task(fig, study, "offset_copy")


def attention_loud_copy(fig: Figure, study: Study) -> None:
    _attention_task(fig, study, "loud_copy")


def attention_mqar(fig: Figure, study: Study) -> None:
    _attention_task(fig, study, "mqar")


def attention_dynamics(fig: Figure, study: Study) -> None:
    """Mean |score| over causal entries and the attention weights' gradient norm along training: top,
    seed 004's copy task (one-layer model); bottom, the attention study's first task at each kind's lr."""
    axes = fig.subplots(2, 2, sharex="row")
    study_curves = study.attention_curves if study.attention_curves is not None else pd.DataFrame()
    task = ordered(study_curves["task"], ["offset_copy"])[0] if not study_curves.empty else None
    task_curves = study_curves[study_curves["task"] == task] if task else study_curves
    title = f"{literal(task)}, {seed_counts(study_curves)}"
    if "model" in task_curves and task_curves["model"].nunique() > 1:  # one model, as the answers read
        model = "residual" if "residual" in set(task_curves["model"]) else sorted(task_curves["model"].unique())[0]
        task_curves = task_curves[task_curves["model"] == model]
        title = f"{literal(task)}, {literal(model)} model, {seed_counts(task_curves)}"
    rows = ((study.copy_task_curves, "seed 004 copy task"), (task_curves, title))
    names = pd.concat([curves["attention"] for curves, _ in rows if not curves.empty])
    styles, labeled = attention_styles(names), set()
    for (curves, title), (score_ax, grad_ax) in zip(rows, axes):
        if curves.empty or "score_abs" not in curves:
            score_ax.text(0.5, 0.5, "no curves", ha="center", va="center", transform=score_ax.transAxes)
            continue
        for attention in ordered(curves["attention"], ATTENTIONS):
            run = curves[curves["attention"] == attention].dropna(subset=["attention_grad_norm"])
            label = None if attention in labeled else literal(attention)
            labeled.add(attention)
            color, linestyle = styles[attention]["color"], styles[attention].get("linestyle", "-")
            _mean_and_spread(score_ax, run, "step", "score_abs", color, label=label, linestyle=linestyle)
            _mean_and_spread(grad_ax, run, "step", "attention_grad_norm", color, linestyle=linestyle)
        for ax in (score_ax, grad_ax):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter("{x:g}")
            ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
            ax.set_title(title)
        score_ax.set_ylabel("mean |score|")
        grad_ax.set_ylabel("attention grad norm")
    for ax in axes[1]:
        ax.set_xlabel("training step")
    fig.legend(loc="outside right center")


def feedback(fig: Figure, study: Study) -> None:
    """Held-out loss per learning rule, and the cosine between each hidden layer's feedback delta and
    the true gradient (backprop's is 1 by definition), over training."""
    curves = study.feedback_curves
    colors = palette(curves["method"], METHODS)
    layers = sorted(c for c in curves.columns if c.startswith("alignment_l"))
    linestyles = line_styles(layers)
    loss_ax, align_ax = fig.subplots(1, 2)
    for method, color in colors.items():
        run = curves[curves["method"] == method]
        label = literal(method) + (
            f"\n(g_hat: {literal(run['signal'].iloc[0])})" if method == "feedback_learned" else ""
        )
        _mean_and_spread(loss_ax, run, "step", "test_loss", color, label=label)
        for layer in layers:
            _mean_and_spread(align_ax, run, "step", layer, color, linestyle=linestyles[layer])
    loss_ax.set_ylabel("held-out loss (nats/character)")
    align_ax.set_ylabel("cos(feedback delta, true gradient)")
    align_ax.set_ylim(min(0.0, align_ax.get_ylim()[0]), 1.05)
    for ax in (loss_ax, align_ax):
        ax.set_xlabel("training step")
    layer_styles = [
        Line2D([], [], color="0.3", linestyle=style, label=f"hidden layer {layer.removeprefix('alignment_l')}")
        for layer, style in linestyles.items()
    ]
    fig.legend(handles=loss_ax.get_legend_handles_labels()[0] + layer_styles, loc="outside right center")
    fig.suptitle(f"Character MLP language model: mean and min–max over {seed_counts(curves)}")


DRAW: dict[str, Callable[[Figure, Study], None]] = {  # one per figure of uph.report.catalog.FIGURES
    "personalization": personalization,
    "capacity": capacity,
    "dose_response": dose_response,
    "cross_user": cross_user,
    "solver_gap": solver_gap,
    "copy_task_curves": copy_task_curves,
    "copy_task_lengths": copy_task_lengths,
    "gram_resilience": gram_resilience,
    "attention_offset_copy": attention_offset_copy,
    "attention_loud_copy": attention_loud_copy,
    "attention_mqar": attention_mqar,
    "attention_dynamics": attention_dynamics,
    "feedback": feedback,
}


def pixel_size(name: str) -> tuple[int, int]:
    """(width, height) in pixels of figure `name`'s PNG."""
    width, height = FIGURES[name].size
    return round(width * DPI), round(height * DPI)


def render(name: str, study: Study) -> Figure:
    spec = FIGURES[name]
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=spec.size, dpi=DPI, layout="constrained")
        DRAW[name](fig, study)
    return fig


def save(fig: Figure, png_path, pdf_path) -> None:
    """PNG at DPI and PDF, both written atomically and byte-for-byte reproducible."""
    logging.getLogger("fontTools").setLevel(logging.WARNING)  # it logs every PDF font subset at INFO
    with mpl.rc_context(STYLE):
        with atomic_path(png_path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)
        with atomic_path(pdf_path) as tmp:
            fig.savefig(tmp, format="pdf", metadata={"CreationDate": None})


def _render_and_save(name: str, study: Study, png_path, pdf_path) -> str:
    save(render(name, study), png_path, pdf_path)
    return name


def save_all(study: Study, paths: dict[str, tuple], processes: int = 1) -> Iterator[str]:
    """Draw and write every figure of `paths` (name -> (png, pdf)), `processes` at a time, yielding each
    name in `paths`' order once its files are written. The figures are independent and each is drawn
    from the same study in a fresh figure, so the bytes are the same at any count; writing is most of
    the cost (a PDF's font subsets, a PNG's rasterizing), and the aggregate job has the cores to itself
    (it is the DAG's last computation)."""
    if processes <= 1 or len(paths) <= 1:
        for name, (png, pdf) in paths.items():
            yield _render_and_save(name, study, png, pdf)
        return
    # fork where the platform has it: the workers start with the study's modules imported
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    with ProcessPoolExecutor(max_workers=min(processes, len(paths)), mp_context=context) as pool:
        done = [pool.submit(_render_and_save, name, study, png, pdf) for name, (png, pdf) in paths.items()]
        for future in done:
            yield future.result()
