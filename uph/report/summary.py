"""results/summary.md: one page that links every figure and table with one line of finding each.

Every finding is computed from the study's tables and curves (`uph.report.study.Study`), never typed in:
rerun the aggregate rule and the lines follow the numbers. NLL changes are quoted in 10^-3 nats per
token, negative = better than the reference (the frozen model; the global theta for the personal gain
beyond it); the personalization lines quote the solver
`headline_solver` picks, the copy-task and feedback lines means over seeds.
"""

from __future__ import annotations

import pandas as pd

from uph.feedback.comparison import paired_difference
from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import MILLI
from uph.report.study import Study, baselines_at, headline_solver, over_seeds, split_baselines
from uph.stats import diagonal_dominance


def _milli(value: float) -> str:
    return f"{value * MILLI:+.2f}"


POINT = ["head", "alpha", "d"]  # a sweep point


def _point(row) -> str:
    return f"{row['head']} at α = {row['alpha']:g}, d = {row['d']:g}"


def _at(table: pd.DataFrame, row) -> pd.Series:
    """Which rows of `table` are at the sweep point of `row`."""
    return (table[POINT] == row[POINT]).all(axis=1)


def _delta(row) -> str:
    """A comparison's mean change with its interval, in millinats."""
    return (
        f"{_milli(row['delta_nll'])} (95 % CI {_milli(row['delta_nll_ci_low'])} to {_milli(row['delta_nll_ci_high'])})"
    )


def _answer(row) -> str:
    """Does the arm beat its reference? Only an interval that excludes 0 says yes (or no, it is worse)."""
    if row["delta_nll_ci_high"] < 0:
        return "yes"
    if row["delta_nll_ci_low"] > 0:
        return "no, it is worse"
    return "no, not distinguishable from 0"


def _answer_at_best_of(row, points: int) -> str:
    """_answer for the best of `points` points: picked after looking, so its interval says yes only if its
    sign test also survives a Bonferroni correction over the points it was picked from."""
    corrected = min(1.0, row["sign_test_p"] * points)
    if row["delta_nll_ci_high"] < 0 and corrected >= 0.05:
        return (
            f"not shown: the best point's interval excludes 0, but picked from {points} points its sign test "
            f"gives p = {corrected:.2g} after Bonferroni"
        )
    return _answer(row)


def _dominance(cross: pd.DataFrame) -> str:
    stats = diagonal_dominance(cross)
    return (
        f"own θ mean rank {stats['mean_rank']:.2f} of {stats['n_users']} (chance {stats['mean_rank_chance']:g}, "
        f"permutation p = {stats['mean_rank_p']:.2g}), the best on {round(stats['frac_own_best'] * stats['n_users'])} "
        f"of {stats['n_users']} users' texts (1 by chance)"
    )


def personalization_finding(study: Study) -> str:
    """The answer at the headline point (the headline solver's best personal-beyond-global point):
    the gain of the user's residual theta over the global theta, its users improved and sign test,
    how many points have an interval excluding 0, the cross-user diagonal dominance, and the
    unigram / full_bias baselines against the best head, base -> personal."""
    solver = headline_solver(study.personalization)
    heads, _ = split_baselines(study.personalization)
    table = heads[heads["solver"] == solver]
    beyond = table[table["control"] == "global+personal"]
    best = beyond.loc[beyond["delta_nll"].idxmin()]
    below, above = (beyond["delta_nll_ci_high"] < 0).sum(), (beyond["delta_nll_ci_low"] > 0).sum()
    control = table[_at(table, best)].set_index("control")
    personal = table[table["control"] == "personal"]
    best_personal = personal.loc[personal["delta_nll"].idxmin()]
    baselines = "; ".join(
        f"{row['head']} {_delta(row)}" for _, row in baselines_at(study.personalization, solver).iterrows()
    )
    line = (
        f"does a personal head help beyond domain adaptation? {_answer_at_best_of(best, len(beyond))}: at the "
        f"best of {len(beyond)} "
        f"points ({_point(best)}, {solver} solver) the user's residual θ on top of the global θ changes held-out "
        f"NLL by {_delta(best)} × 10⁻³ nats/token, {int(best['n_users_improved'])} of {int(best['n_users'])} "
        f"users improved, sign test p = {best['sign_test_p']:.2g}; {below + above} of {len(beyond)} points have "
        f"an interval excluding 0 ({below} below, {above} above). At that point, against the frozen model: "
        f"global θ {_delta(control.loc['global'])}, personal θ {_delta(control.loc['personal'])}. "
        f"Base → personal, the best head ({_point(best_personal)}) {_delta(best_personal)}"
        + (f" vs the baselines {baselines}" if baselines else "")
        + "."
    )
    cross = study.cross_user[study.cross_user["solver"] == solver]
    if cross.empty:
        return line + f" No cross-user point at the {solver} solver (fit.cross_user)."
    cross = cross[_at(cross, best if _at(cross, best).any() else cross.iloc[0])]
    return line + f" Cross-user residual θs at {_point(cross.iloc[0])}: {_dominance(cross)}."


def dose_response_finding(study: Study) -> str:
    """The personal gain beyond global against the user's train tokens at the headline point (else
    the dose-response point with the best gain on all train tokens): smallest and all train tokens,
    and at which train sizes the interval lies below 0."""
    solver = headline_solver(study.personalization)
    table = study.dose_response[study.dose_response["solver"] == solver]
    if table.empty:
        return f"no dose-response point at the {solver} solver."
    heads, _ = split_baselines(study.personalization)
    beyond = heads[(heads["solver"] == solver) & (heads["control"] == "global+personal")]
    point = beyond.loc[beyond["delta_nll"].idxmin()]
    if not _at(table, point).any():
        all_tokens = table[table["all_train_tokens"]]
        point = all_tokens.loc[all_tokens["delta_nll"].idxmin()]
    curve = table[_at(table, point)].sort_values("train_tokens")
    first, last = curve.iloc[0], curve[curve["all_train_tokens"]].iloc[0]  # a fixed k can exceed the mean of all
    reliable = curve.loc[curve["delta_nll_ci_high"] < 0, "train_tokens"]
    where = (
        f"the interval lies below 0 at {len(reliable)} of {len(curve)} train sizes, the smallest {reliable.iloc[0]:.0f} tokens"
        if len(reliable)
        else f"the interval lies below 0 at none of the {len(curve)} train sizes"
    )
    return (
        f"personal gain beyond the global θ at {_point(first)} ({solver} solver): {_delta(first)} × 10⁻³ "
        f"nats/token from the first {first['train_tokens']:.0f} train tokens per user, {_delta(last)} from all of "
        f"them ({last['train_tokens']:.0f} on average); {where}."
    )


def cross_user_finding(study: Study) -> str:
    """Per cross-user point: own residual theta (diagonal) against the other users' on the same text,
    both against the global theta alone, and the diagonal dominance (uph.stats.diagonal_dominance)."""
    parts = []
    for (head, alpha, d, solver), pairs in study.cross_user.groupby([*POINT, "solver"], sort=True):
        own = pairs["theta_user"] == pairs["text_user"]
        parts.append(
            f"{head} at α = {alpha:g}, d = {d:g} ({solver}): own residual θ Δ NLL {_milli(pairs.loc[own, 'delta_nll'].mean())} "
            f"vs other users' {_milli(pairs.loc[~own, 'delta_nll'].mean())} × 10⁻³ nats/token against the global θ "
            f"on the same texts; {_dominance(pairs)}"
        )
    return "; ".join(parts) + "." if parts else "no cross-user point configured (fit.cross_user)."


def solver_gap_finding(study: Study) -> str:
    """Mean and worst excess of the adam solver's objective over the exact optimum; worst certificates."""
    heads, _ = split_baselines(study.personalization)
    table = heads[heads["control"] == "personal"]
    if not {"adam", "exact"} <= set(table["solver"]):
        return "needs both fit.solvers (adam and exact) to compare."
    objective = table.pivot_table(index=POINT, columns="solver", values="fit_objective")
    gap = objective["adam"] - objective["exact"]
    head, alpha, d = gap.idxmax()
    certificate = table.groupby("solver")["fit_certificate_max"].max()
    return (
        f"seed 002's Adam schedule (adam) stops on average {gap.mean() * MILLI:.2f} × 10⁻³ nats above the certified "
        f"optimum (most: {gap.max() * MILLI:.2f} at {head}, α = {alpha:g}, d = {d:g}); worst projected-gradient "
        f"norm {certificate['adam']:.1e} (adam) vs {certificate['exact']:.1e} (exact)."
    )


def _by_attention(table: pd.DataFrame, column: str) -> str:
    means = table.groupby("attention")[column].mean().sort_values(ascending=False)
    return ", ".join(f"{attention} {value:.3f}" for attention, value in means.items())


def copy_task_curves_finding(study: Study) -> str:
    """Final accuracy at the training length per attention, and how far each run's loss ended above
    its best (a run that lost ground shows a ratio well above 1)."""
    table = study.copy_task[study.copy_task["eval_len"] == study.copy_task["train_len"]]
    ratio = study.copy_task_curves.groupby(["attention", "seed"])["loss"].agg(lambda loss: loss.iloc[-1] / loss.min())
    worst = ratio.groupby("attention").max().sort_values(ascending=False)
    return (
        f"at the training length ({table['train_len'].iloc[0]} tokens) final token accuracy {_by_attention(table, 'token_acc')}; "
        f"whole-sequence accuracy {_by_attention(table, 'seq_acc')}; final over best copy loss, worst seed: "
        + ", ".join(f"{attention} {value:.1f}×" for attention, value in worst.items())
        + "."
    )


def copy_task_lengths_finding(study: Study) -> str:
    """Token accuracy beyond the training length per attention, against chance."""
    table = study.copy_task
    longer = table[table["eval_len"] > table["train_len"]]
    if longer.empty:
        return "no evaluation length beyond the training length (copy_task.eval_lens)."
    lengths = ", ".join(map(str, sorted(longer["eval_len"].unique())))
    return (
        f"beyond the training length ({lengths} tokens) token accuracy {_by_attention(longer, 'token_acc')}, "
        f"against chance 1/{study.copy_task_vocab} = {1 / study.copy_task_vocab:.3f}."
    )


def gram_resilience_finding(study: Study) -> str:
    """The dot product and Gram score of the loud mismatches at the smallest and largest magnitude."""
    table = study.gram_resilience
    loud = table[table["result"] != "True Match"].sort_values("magnitude")
    match = table[table["result"] == "True Match"]
    first, last = loud.iloc[0], loud.iloc[-1]
    low, high = loud["dot"].min(), loud["dot"].max()
    dot = f"at {low:g}" if low == high else f"between {low:g} and {high:g}"
    return (
        f"from m = {first['magnitude']:g} to m = {last['magnitude']:g} a loud mismatch keeps q·k {dot} while "
        f"its Gram score falls from {first['gram']:g} to {last['gram']:g}; the true match scores "
        f"{match['gram'].iloc[0]:g}."
    )


def _attention_cells(table: pd.DataFrame, metric: str = "token_acc") -> str:
    """'kind mean [95 % CI]' per (model, attention), best first, from the seeds of `table`."""
    stats = over_seeds(table, ["model", "attention"], metric).sort_values("mean", ascending=False, kind="stable")
    several = stats["model"].nunique() > 1
    return ", ".join(
        f"{row.attention}{f' ({row.model})' if several else ''} {row.mean:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
        + (f", {row.diverged} diverged" if row.diverged else "")
        for row in stats.itertuples()
    )


def _attention_task(study: Study, task: str) -> pd.DataFrame:
    return study.attention[study.attention["task"] == task] if study.attention is not None else pd.DataFrame()


def _lengths(table: pd.DataFrame) -> str:
    """Test token accuracy at the training length, with the chosen lrs, and at every longer length."""
    train_len = table["train_len"].iloc[0]
    lrs = table.groupby(["model", "attention"])["lr"].first()
    levels = " (mean over its levels)" if table["level"].nunique() > 1 else ""
    parts = [
        f"at the training length ({train_len} tokens) test token accuracy{levels}, mean [95 % bootstrap CI] over seeds: "
        + _attention_cells(table[table["eval_len"] == train_len])
        + " (best validation lrs: "
        + ", ".join(f"{attention} {lr:g}" for (_, attention), lr in lrs.items())
        + ")"
    ]
    for length in sorted(table["eval_len"].unique()):
        if length > train_len:
            parts.append(f"at {length} tokens: " + _attention_cells(table[table["eval_len"] == length]))
    return "; ".join(parts)


def _solved(table: pd.DataFrame, threshold: float = 0.95) -> str:
    """Whether standard attention reaches `threshold` token accuracy at the training length (mean over seeds)."""
    at_train = table[(table["eval_len"] == table["train_len"]) & (table["attention"] == "standard")]
    if at_train.empty:
        return ""
    mean = over_seeds(at_train, ["model"], "token_acc").set_index("model")["mean"]
    return "; standard attention " + ", ".join(
        f"{'reaches' if value >= threshold else 'does not reach'} {threshold} ({model} model)"
        for model, value in mean.items()
    )


def attention_offset_copy_finding(study: Study) -> str:
    table = _attention_task(study, "offset_copy")
    if table.empty:
        return "not run (attention.tasks)."
    return _lengths(table) + _solved(table) + "."


def _levels(table: pd.DataFrame, name: str) -> str:
    """Token accuracy at the training length at the lowest and the highest level of the task."""
    at_train = table[table["eval_len"] == table["train_len"]]
    low, high = at_train["level"].min(), at_train["level"].max()
    return (
        f"at the training length, {name} {low:g}: {_attention_cells(at_train[at_train['level'] == low])}; "
        f"{name} {high:g}: {_attention_cells(at_train[at_train['level'] == high])}"
    )


def attention_loud_copy_finding(study: Study) -> str:
    table = _attention_task(study, "loud_copy")
    if table.empty:
        return "not run (attention.tasks)."
    return _levels(table, "loudness m") + "; " + _lengths(table) + "."


def attention_mqar_finding(study: Study) -> str:
    table = _attention_task(study, "mqar")
    if table.empty:
        return "not run (attention.tasks)."
    return _levels(table, "pairs") + "; " + _lengths(table) + _solved(table) + "."


def attention_dynamics_finding(study: Study) -> str:
    """On seed 004's copy task: each kind's mean |score| and attention gradient norm at its best copy
    loss and at the end, the mean over seeds."""
    curves = study.copy_task_curves
    if "score_abs" not in curves:
        return "the copy-task curves hold no score magnitude."
    parts = []
    for attention, runs in curves.groupby("attention"):
        best = runs.loc[runs.groupby("seed")["loss"].idxmin()]
        last = runs.loc[runs.groupby("seed")["step"].idxmax()]
        parts.append(
            f"{attention} mean |score| {best['score_abs'].mean():.3g} at its best copy loss (step "
            f"{best['step'].mean():.0f} on average) and {last['score_abs'].mean():.3g} at the end "
            f"(×{last['score_abs'].mean() / best['score_abs'].mean():.2f}), gradient norm "
            f"{best['attention_grad_norm'].mean():.3g} -> {last['attention_grad_norm'].mean():.3g}"
        )
    return "seed 004 copy task: " + "; ".join(parts) + "."


def _paired(difference) -> str:
    return (
        f"{difference.mean:+.3f} nats/character (95 % paired bootstrap CI {difference.ci_low:+.3f} to "
        f"{difference.ci_high:+.3f}; lower on {difference.lower} of {difference.seeds} seeds, sign test "
        f"p = {difference.sign_test_p:.2g})"
    )


def feedback_finding(study: Study) -> str:
    """Methods in order of final held-out loss; whether backprop-free feedback_learned beats dfa and
    feedback_frozen (paired over seeds: yes only when the whole interval of the difference is below 0);
    how far it stays above backprop and the oracle; mean alignment with the true gradient."""
    table = study.feedback
    means = table.groupby("method")[["final_loss", "mean_alignment"]].mean()
    steps = study.feedback_curves["step"].max()
    line = (
        f"held-out loss after {steps} steps, mean over {table['seed'].nunique()} seeds: "
        + " < ".join(f"{m} {v:.3f}" for m, v in means["final_loss"].sort_values().items())
        + " nats/character"
    )
    learned = table[table["method"] == "feedback_learned"]
    if not learned.empty:
        signal = learned["signal"].iloc[0]
        answers = {
            "lower": "yes",
            "higher": "no, it is worse",
            "undecided": "no, the interval includes 0",
            "one seed": "not decided, one seed gives no interval",
        }
        for reference in ("dfa", "feedback_frozen"):
            difference = paired_difference(table, "feedback_learned", reference)
            if difference is not None:
                line += (
                    f"; does backprop-free feedback_learned ({signal}) beat {reference}? "
                    f"{answers[difference.verdict()]}: {_paired(difference)}"
                )
        for reference, name in (
            ("backprop", "backprop"),
            ("feedback_learned_oracle", "the oracle feedback_learned_oracle (U trained on the true gradient)"),
        ):
            difference = paired_difference(table, "feedback_learned", reference)
            if difference is not None:
                line += f"; its distance to {name}: {_paired(difference)}"
    alignment = means["mean_alignment"].drop("backprop", errors="ignore").sort_values(ascending=False)
    return f"{line}; mean alignment with the true gradient: {', '.join(f'{m} {v:.2f}' for m, v in alignment.items())}."


FINDINGS = {
    "personalization": personalization_finding,
    "dose_response": dose_response_finding,
    "cross_user": cross_user_finding,
    "solver_gap": solver_gap_finding,
    "copy_task_curves": copy_task_curves_finding,
    "copy_task_lengths": copy_task_lengths_finding,
    "gram_resilience": gram_resilience_finding,
    "attention_offset_copy": attention_offset_copy_finding,
    "attention_loud_copy": attention_loud_copy_finding,
    "attention_mqar": attention_mqar_finding,
    "attention_dynamics": attention_dynamics_finding,
    "feedback": feedback_finding,
}


def summary_markdown(study: Study) -> str:
    """The page, with links relative to the results folder it is written into."""
    model = study.personalization["model"].iloc[0]
    users = study.personalization["n_users"].max()
    lines = [
        "# Study summary",
        "",
        f"Model {model}, {users} users. Written by the `aggregate` rule from `tables/` and the training "
        "curves; every line below is computed from those numbers. Rebuild with "
        "`snakemake --forcerun aggregate`.",
        "",
        "## Figures",
        "",
    ]
    for name, spec in FIGURES.items():
        lines.append(f"- [{spec.title}](figures/{name}.png) ([PDF](figures/{name}.pdf)): {FINDINGS[name](study)}")
    lines += ["", "## Tables", ""]
    lines += [
        f"- [{name}.csv](tables/{name}.csv) ([Markdown](tables/{name}.md), [LaTeX](tables/{name}.tex))"
        for name in TABLES
    ]
    lines += [
        "",
        "Provenance (config, commit, versions, model hash, seeds, wall time per rule): "
        "[provenance.json](provenance.json). Snakemake's report of the run: [report.html](report.html).",
        "",
    ]
    return "\n".join(lines)
