"""results/summary.md: the study's answers on one screen, then the facts behind each figure.

The page opens with the answers table (uph.report.answers: question, yes / no / not shown / untested,
the number it rests on with its interval and n, the figure), then one short list of facts per figure
and a link to every table. Every fact is computed from the study's tables and curves
(`uph.report.study.Study`), never typed in: rerun the aggregate rule and the lines follow the numbers.
NLL changes are quoted in 10^-3 nats per token, negative = better than the reference (the frozen model;
the global theta for the personal gain beyond it); the personalization lines quote the solver
`headline_solver` picks, the copy-task, attention and feedback lines means over seeds with Student-t
intervals.
"""

from __future__ import annotations

import pandas as pd

from uph.feedback.comparison import paired_difference
from uph.report.answers import (
    MATCHED_CONTROLS,
    POINT,
    Answer,
    answers_markdown,
    at_point,
    attention_rows,
    bonferroni,
    cross_user_at_headline,
    delta_with_ci,
    dose_curve,
    loud_copy,
    milli,
    paired_text,
    point_label,
    seeds,
)
from uph.report.catalog import FIGURES, TABLES
from uph.report.study import (
    MILLI,
    Study,
    baselines_at,
    best_beyond_global,
    headline_solver,
    heads_at_headline,
    over_seeds,
    seed_counts,
    split_baselines,
)
from uph.stats import diagonal_dominance, p_text


def _dominance(cross: pd.DataFrame) -> str:
    stats = diagonal_dominance(cross)
    return (
        f"own θ mean rank {stats['mean_rank']:.2f} of {stats['n_users']} (chance {stats['mean_rank_chance']:g}, "
        f"permutation {p_text(stats['mean_rank_p'], stats['mean_rank_p_floor'])}), the best on {round(stats['frac_own_best'] * stats['n_users'])} "
        f"of {stats['n_users']} users' texts (1 by chance)"
    )


GAINS = {  # the personal gain's control -> what it compares (uph.report.study.best_beyond_global)
    "own vs others": "own residual θ against the other users' mean residual θ",
    "global+personal": "residual θ against the global θ alone",
}


def personalization_finding(study: Study) -> list[str]:
    """At the headline point (the headline solver's best personal gain: own residual against the others'
    mean residual): that gain, its users improved and sign test, how many points have an interval
    excluding 0, the other comparisons there, the best head base -> personal against the baselines, and
    the cross-user diagonal dominance."""
    solver, table = heads_at_headline(study.personalization)
    best, points = best_beyond_global(study.personalization)
    return [
        *_headline_facts(table, best, points, solver),
        *_baseline_facts(study, solver),
        *_cache_head_facts(table),
        _cross_user_fact(study, solver),
    ]


def _headline_facts(table: pd.DataFrame, best: pd.Series, points: int, solver: str) -> list[str]:
    """The best personal gain of `points` and its users, how many points' intervals exclude 0, the other
    comparisons at its point, and the best head base -> personal."""
    gains = table[table["control"] == best["control"]]
    below, above = (gains["delta_nll_ci_high"] < 0).sum(), (gains["delta_nll_ci_low"] > 0).sum()
    control = table[at_point(table, best)].set_index("control")
    personal = table[table["control"] == "personal"]
    best_personal = personal.loc[personal["delta_nll"].idxmin()]
    facts = [
        f"best of {points} points, {GAINS[best['control']]}: {point_label(best)} ({solver} solver), "
        f"{delta_with_ci(best)} × 10⁻³ nats/token",
        f"there: {int(best['n_users_improved'])} of {int(best['n_users'])} users improved, sign test "
        f"p = {best['sign_test_p']:.2g}, {bonferroni(best, points):.2g} after Bonferroni over the {points} points",
        f"{below + above} of {points} points have an interval excluding 0 ({below} below, {above} above)",
    ]
    if "others" in control.index:
        facts.append(
            f"there, against the global θ alone: own residual {delta_with_ci(control.loc['global+personal'])}, "
            f"the others' mean residual {delta_with_ci(control.loc['others'])}"
        )
    if "capacity" in control:  # each arm's radius, chosen on validation; where its ball still binds
        facts.append(_radii_fact(control, int(best["n_users"])))
    return facts + [
        f"there, against the frozen model: global θ {delta_with_ci(control.loc['global'])}, "
        f"personal θ {delta_with_ci(control.loc['personal'])}",
        f"base → personal, the best head: {point_label(best_personal)} {delta_with_ci(best_personal)}",
    ]


def _cross_user_fact(study: Study, solver: str) -> str:
    """The cross-user diagonal dominance of residual θs at the headline solver's cross-user point."""
    cross = cross_user_at_headline(study)
    if cross.empty:
        return f"no cross-user point at the {solver} solver (fit.cross_user)"
    return f"cross-user residual θs at {point_label(cross.iloc[0])}: {_dominance(cross)}"


def _radii_fact(control: pd.DataFrame, users: int) -> str:
    """Each arm's radius chosen on validation at the headline point, and how many users' θs its ball binds."""
    arms = {"global θ": "global", "personal θ": "personal", "residual θ": "global+personal"}
    return (
        "there, radii chosen on validation: "
        + ", ".join(f"{name} {_capacity(control.loc[arm])}" for name, arm in arms.items())
        + f"; on the ball: personal θs {round(control.loc['personal', 'frac_on_ball'] * users)} of {users} users, "
        f"residual θs {round(control.loc['global+personal', 'frac_on_ball'] * users)} of {users}; "
        f"mean ‖θ_g + θ_r‖ {control.loc['global+personal', 'sum_theta_norm']:.3g}"
    )


def _baseline_facts(study: Study, solver: str) -> list[str]:
    """Every baseline at `solver` in each arm: its change with interval and capacity."""
    arms = (
        ("global", "pooled"),
        ("personal", "personal"),
        ("global+personal", "beyond its pooled arm"),
        ("own vs others", "own against the same capacity from the other users"),
    )
    return [
        f"baseline {row['head']} ({row['solver']}), {what}: {delta_with_ci(row)}{_capacity_of_baseline(row)}"
        for arm, what in arms
        for _, row in baselines_at(study.personalization, solver, arm).iterrows()
    ]


def _cache_head_facts(table: pd.DataFrame) -> list[str]:
    """Each head fitted on a cache: its change against the cache alone, and own cache θ against the others'."""
    facts = []
    for cache, name in (("unigram", "cache"), ("neural", "neural cache")):
        for _, row in table[table["control"] == f"{name}+head"].iterrows():
            own = table[(table["control"] == f"{name} own vs others") & (table["head"] == row["head"])]
            facts.append(
                f"head on the {cache} cache, {point_label(row)}: {delta_with_ci(row)} against the cache alone "
                f"(radius {_capacity(row)}, {int(row['n_users_improved'])} of {int(row['n_users'])} users improved)"
                + (
                    f"; own cache θ against the other users' mean cache θ {delta_with_ci(own.iloc[0])}, "
                    f"sign test p = {own.iloc[0]['sign_test_p']:.2g}"
                    if not own.empty
                    else "; no others control (one user)"
                )
            )
    return facts


def _capacity(row) -> str:
    """A chosen capacity, with its grid edge when it sits at one."""
    return f"{row['capacity']:g}" + (
        f" (at the grid's {row['at_edge']} end)" if isinstance(row["at_edge"], str) and row["at_edge"] else ""
    )


def _capacity_of_baseline(row) -> str:
    if pd.isna(row["capacity"]):
        return ""
    if row["head"] == "neural_cache":
        return f" (T {row['temperature']:g}, λ {_capacity(row)})"
    return f" ({'λ' if row['head'] == 'unigram' else 'radius'} {_capacity(row)})"


def _knobs(row) -> str:
    """A choice's knob values: its capacity, and the neural cache's temperature beside it."""
    temperature = row.get("temperature", float("nan"))
    return f"{row['capacity']:g}" if pd.isna(temperature) else f"T {temperature:g}, λ {row['capacity']:g}"


def _edges(personalization) -> str:
    """Which arms' choices sit at an end of their grid (the grid did not bracket the optimum)."""
    edges = personalization[personalization["at_edge"].fillna("").astype(str) != ""]
    if edges.empty:
        return "every capacity chosen on validation lies inside its grid"
    labels = [
        f"{row['head']}{'' if pd.isna(row['d']) else f' α {row.alpha:g} d {row.d:g}'} {row['solver']} {row['control']} "
        f"at the {row['at_edge']} end ({_knobs(row)})"
        for _, row in edges.iterrows()
    ]
    return f"{len(labels)} choices at a grid edge: " + "; ".join(labels)


def capacity_finding(study: Study) -> list[str]:
    """The capacity chosen on validation per arm at the headline solver, method by method, and every
    choice at an end of its grid."""
    solver = headline_solver(study.personalization)
    table = study.personalization[study.personalization["solver"] == solver]
    facts = []
    for arm, what in (("global", "global θ"), ("personal", "personal θ"), ("global+personal", "residual θ")):
        rows = table[(table["control"] == arm) & table["capacity"].notna()]
        facts.append(
            f"chosen on validation ({solver}), {what}: "
            + ", ".join(
                f"{row['head']}{'' if pd.isna(row['d']) else f' d {row.d:g}'} {_capacity(row)}"
                + (f" at T {row['temperature']:g}" if pd.notna(row.get("temperature", float("nan"))) else "")
                for _, row in rows.iterrows()
            )
        )
    return [*facts, _edges(study.personalization)]


def dose_response_finding(study: Study) -> list[str]:
    """The personal gain beyond global against the user's train tokens at the headline point (else the
    dose-response point with the best gain on all train tokens): smallest and all train tokens, and at
    which train sizes the interval lies below 0."""
    curve = dose_curve(study)
    if curve.empty:
        return [f"no dose-response point at the {headline_solver(study.personalization)} solver"]
    first, last = curve.iloc[0], curve[curve["all_train_tokens"]].iloc[0]  # a fixed k can exceed the mean of all
    reliable = curve.loc[curve["delta_nll_ci_high"] < 0, "train_tokens"]
    return [
        f"personal gain beyond the global θ at {point_label(first)} ({first['solver']} solver)",
        f"from the first {first['train_tokens']:.0f} train tokens per user: {delta_with_ci(first)} × 10⁻³ nats/token",
        f"from all of them ({last['train_tokens']:.0f} on average): {delta_with_ci(last)}",
        "radii chosen on validation at each size: "
        + ", ".join(
            f"{row['train_tokens']:.0f} tokens {_capacity({**row, 'capacity': row['radius']})}"
            for _, row in curve.iterrows()
        ),
        f"the interval lies below 0 at {len(reliable)} of {len(curve)} train sizes, the smallest {reliable.iloc[0]:.0f} tokens"
        if len(reliable)
        else f"the interval lies below 0 at none of the {len(curve)} train sizes",
    ]


def cross_user_finding(study: Study) -> list[str]:
    """Per cross-user point: own residual theta (diagonal) against the other users' on the same text,
    both against the global theta alone, and the diagonal dominance (uph.stats.diagonal_dominance)."""
    facts = []
    for (head, alpha, d, solver), pairs in study.cross_user.groupby([*POINT, "solver"], sort=True):
        own = pairs["theta_user"] == pairs["text_user"]
        facts += [
            f"{head} at α = {alpha:g}, d = {d:g} ({solver}): own residual θ Δ NLL {milli(pairs.loc[own, 'delta_nll'].mean())} "
            f"vs other users' {milli(pairs.loc[~own, 'delta_nll'].mean())} × 10⁻³ nats/token against the global θ "
            "on the same texts",
            f"{head} at α = {alpha:g}, d = {d:g} ({solver}): {_dominance(pairs)}",
        ]
    return facts or ["no cross-user point configured (fit.cross_user)"]


def solver_gap_finding(study: Study) -> list[str]:
    """Mean and worst excess of the adam solver's objective over the exact optimum; worst certificates."""
    heads, _ = split_baselines(study.personalization)
    table = heads[heads["control"] == "personal"]
    if not {"adam", "exact"} <= set(table["solver"]):
        return ["needs both fit.solvers (adam and exact) to compare"]
    objective = table.pivot_table(index=POINT, columns="solver", values="fit_objective")
    gap = objective["adam"] - objective["exact"]
    head, alpha, d = gap.idxmax()
    certificate = table.groupby("solver")["fit_certificate_max"].max()
    return [
        f"seed 002's Adam schedule (adam) stops on average {gap.mean() * MILLI:.2f} × 10⁻³ nats above the certified "
        "optimum",
        f"most: {gap.max() * MILLI:.2f} at {head}, α = {alpha:g}, d = {d:g}",
        f"worst projected-gradient norm {certificate['adam']:.1e} (adam) vs {certificate['exact']:.1e} (exact)",
    ]


def _by_attention(table: pd.DataFrame, column: str) -> str:
    means = table.groupby("attention")[column].mean().sort_values(ascending=False)
    return ", ".join(f"{attention} {value:.3f}" for attention, value in means.items())


def copy_task_curves_finding(study: Study) -> list[str]:
    """Final accuracy at the training length per attention, and how far each run's loss ended above
    its best (a run that lost ground shows a ratio well above 1)."""
    table = study.copy_task[study.copy_task["eval_len"] == study.copy_task["train_len"]]
    ratio = study.copy_task_curves.groupby(["attention", "seed"])["loss"].agg(lambda loss: loss.iloc[-1] / loss.min())
    worst = ratio.groupby("attention").max().sort_values(ascending=False)
    return [
        f"at the training length ({table['train_len'].iloc[0]} tokens), mean over {seeds(table['seed'].nunique())}: "
        f"final token accuracy {_by_attention(table, 'token_acc')}",
        f"whole-sequence accuracy {_by_attention(table, 'seq_acc')}",
        "final over best copy loss, worst seed: " + ", ".join(f"{a} {value:.1f}×" for a, value in worst.items()),
    ]


def copy_task_lengths_finding(study: Study) -> list[str]:
    """Token accuracy beyond the training length per attention, against chance."""
    table = study.copy_task
    longer = table[table["eval_len"] > table["train_len"]]
    if longer.empty:
        return ["no evaluation length beyond the training length (copy_task.eval_lens)"]
    lengths = ", ".join(map(str, sorted(longer["eval_len"].unique())))
    return [
        f"beyond the training length ({lengths} tokens) token accuracy {_by_attention(longer, 'token_acc')}",
        f"chance: 1/{study.copy_task_vocab} = {1 / study.copy_task_vocab:.3f}",
    ]


def gram_resilience_finding(study: Study) -> list[str]:
    """The dot product and Gram score of the loud mismatches at the smallest and largest magnitude."""
    table = study.gram_resilience
    loud = table[table["result"] != "True Match"].sort_values("magnitude")
    match = table[table["result"] == "True Match"]
    first, last = loud.iloc[0], loud.iloc[-1]
    low, high = loud["dot"].min(), loud["dot"].max()
    dot = f"at {low:g}" if low == high else f"between {low:g} and {high:g}"
    return [
        f"from m = {first['magnitude']:g} to m = {last['magnitude']:g} a loud mismatch keeps q·k {dot}",
        f"its Gram score falls from {first['gram']:g} to {last['gram']:g}",
        f"the true match scores {match['gram'].iloc[0]:g}",
    ]


def _attention_cells(table: pd.DataFrame, metric: str = "token_acc") -> str:
    """'kind mean [95 % t CI]' per (model, attention), best first, from the seeds of `table`; where a kind's
    seeds split between solving (SOLVED) and not, how many of how many solve, since its mean is then a
    share of bimodal runs, not a typical run."""
    stats = over_seeds(table, ["model", "attention"], metric).sort_values("mean", ascending=False, kind="stable")
    several = stats["model"].nunique() > 1
    return ", ".join(
        f"{row.attention}{f' ({row.model})' if several else ''} {row.mean:.3f}"
        + (f" [{row.ci_low:.3f}, {row.ci_high:.3f}]" if row.seeds > 1 else "")
        + (f" ({row.solved} of {row.seeds} seeds solve it)" if 0 < row.solved < row.seeds else "")
        + (f", {row.diverged} diverged" if row.diverged else "")
        for row in stats.itertuples()
    )


def _lengths(table: pd.DataFrame) -> list[str]:
    """Test token accuracy at the training length, the chosen lrs, and at every longer length."""
    train_len = table["train_len"].iloc[0]
    lrs = table.groupby(["model", "attention"])[["lr", "lr_at_edge"]].first()
    levels = " (mean over its levels)" if table["level"].nunique() > 1 else ""
    facts = [
        f"at the training length ({train_len} tokens) test token accuracy{levels}, mean [95 % t CI] over "
        f"{seed_counts(table)}: " + _attention_cells(table[table["eval_len"] == train_len]),
        "best validation lrs: "
        + ", ".join(
            f"{attention} {row.lr:g}"
            + (
                f" (at the {row.lr_at_edge} end of the lrs tried)"
                if isinstance(row.lr_at_edge, str) and row.lr_at_edge
                else ""
            )
            for (_, attention), row in zip(lrs.index, lrs.itertuples())
        ),
    ]
    facts += [
        f"at {length} tokens: " + _attention_cells(table[table["eval_len"] == length])
        for length in sorted(table["eval_len"].unique())
        if length > train_len
    ]
    return facts


def _steps(table: pd.DataFrame) -> list[str]:
    """Per kind at its chosen lr: the steps its runs took (mean over seeds), how many stopped at the step
    limit rather than by patience, each by seed with why (its validation loss still fell within patience
    evaluations of the limit: its best step), and the mean first step at 0.99 validation accuracy over the
    seeds that reached it (sample efficiency)."""
    if "steps_run" not in table:
        return []
    runs = table.drop_duplicates(["model", "attention", "seed"])
    parts = []
    for (model, attention), kind in runs.groupby(["model", "attention"]):
        reached = kind["steps_to_99"].dropna()
        several = runs["model"].nunique() > 1
        parts.append(
            f"{attention}{f' ({model})' if several else ''} {kind['steps_run'].mean():.0f}"
            + (_at_limit(kind) if kind["at_step_limit"].any() else "")
            + (f", 0.99 at {reached.mean():.0f} ({len(reached)} of {len(kind)})" if len(reached) else ", never 0.99")
        )
    return ["steps run, mean over seeds (trained to convergence): " + "; ".join(parts)]


def _at_limit(kind: pd.DataFrame) -> str:
    """' (k of n at the step limit: seed s still improving, best at step b of its steps, ...)'."""
    stopped = kind[kind["at_step_limit"].astype(bool)]
    named = ", ".join(
        f"seed {row.seed} still improving, best at step {row.best_step:.0f} of {row.steps_run:.0f}"
        for row in stopped.itertuples()
    )
    return f" ({len(stopped)} of {len(kind)} at the step limit: {named})"


def _solved(table: pd.DataFrame, threshold: float = 0.99) -> list[str]:
    """Whether standard attention reaches `threshold` token accuracy at the training length (mean over seeds)."""
    at_train = table[(table["eval_len"] == table["train_len"]) & (table["attention"] == "standard")]
    if at_train.empty:
        return []
    mean = over_seeds(at_train, ["model"], "token_acc").set_index("model")["mean"]
    return [
        f"standard attention {'reaches' if value >= threshold else 'does not reach'} {threshold} ({model} model)"
        for model, value in mean.items()
    ]


def attention_offset_copy_finding(study: Study) -> list[str]:
    table = attention_rows(study, "offset_copy")
    if table.empty:
        return ["not run (attention.tasks)"]
    return _lengths(table) + _steps(table) + _solved(table)


def _levels(table: pd.DataFrame, name: str) -> list[str]:
    """Token accuracy at the training length at the lowest and the highest level of the task."""
    at_train = table[table["eval_len"] == table["train_len"]]
    return [
        f"at the training length, {name} {level:g}: {_attention_cells(at_train[at_train['level'] == level])}"
        for level in (at_train["level"].min(), at_train["level"].max())
    ]


def _drops(study: Study) -> list[str]:
    """Each kind's token accuracy drop from the lowest m to the highest at the training length, mean over
    seeds, smallest first, and each triple variant beside its matched control (what the answers compare)."""
    loud = loud_copy(study)
    if loud is None:
        return []
    drops = loud.drop.mean().sort_values(kind="stable")
    facts = [
        f"token accuracy drop from m = {loud.low:g} to m = {loud.high:g} at the training length ({loud.model} "
        "model), mean over seeds, smallest first: " + ", ".join(f"{kind} {drop:.3f}" for kind, drop in drops.items())
    ]
    pairs = [
        f"{v} {drops[v]:.3f} vs {c} {drops[c]:.3f}" for v, c in MATCHED_CONTROLS.items() if {v, c} <= set(drops.index)
    ]
    return facts + (["matched pairs, variant vs its control: " + ", ".join(pairs)] if pairs else [])


def attention_loud_copy_finding(study: Study) -> list[str]:
    table = attention_rows(study, "loud_copy")
    if table.empty:
        return ["not run (attention.tasks)"]
    return _levels(table, "loudness m") + _drops(study) + _lengths(table) + _steps(table)


def attention_mqar_finding(study: Study) -> list[str]:
    table = attention_rows(study, "mqar")
    if table.empty:
        return ["not run (attention.tasks)"]
    return _levels(table, "pairs") + _lengths(table) + _steps(table) + _solved(table)


def attention_dynamics_finding(study: Study) -> list[str]:
    """On seed 004's copy task: each kind's mean |score| and attention gradient norm at its best copy
    loss and at the end, the mean over seeds."""
    curves = study.copy_task_curves
    if "score_abs" not in curves:
        return ["the copy-task curves hold no score magnitude"]
    facts = []
    for attention, runs in curves.groupby("attention"):
        best = runs.loc[runs.groupby("seed")["loss"].idxmin()]
        last = runs.loc[runs.groupby("seed")["step"].idxmax()]
        facts.append(
            f"seed 004 copy task, {attention}: mean |score| {best['score_abs'].mean():.3g} at its best copy loss (step "
            f"{best['step'].mean():.0f} on average) and {last['score_abs'].mean():.3g} at the end "
            f"(×{last['score_abs'].mean() / best['score_abs'].mean():.2f}), gradient norm "
            f"{best['attention_grad_norm'].mean():.3g} -> {last['attention_grad_norm'].mean():.3g}"
        )
    return facts


def feedback_finding(study: Study) -> list[str]:
    """Methods in order of final held-out loss; backprop-free feedback_learned against dfa and
    feedback_frozen, backprop and the oracle (paired over seeds, Student-t intervals); mean alignment
    with the true gradient."""
    table = study.feedback
    means = table.groupby("method")[["final_loss", "mean_alignment"]].mean()
    facts = [
        f"held-out loss after {study.feedback_curves['step'].max()} steps, mean over {seeds(table['seed'].nunique())}: "
        + " < ".join(f"{m} {v:.3f}" for m, v in means["final_loss"].sort_values().items())
        + " nats/character"
    ]
    learned = table[table["method"] == "feedback_learned"]
    if not learned.empty:
        names = {
            "backprop": "backprop",
            "feedback_learned_oracle": "the oracle feedback_learned_oracle (U trained on the true gradient)",
        }
        for reference in ("dfa", "feedback_frozen", "backprop", "feedback_learned_oracle"):
            difference = paired_difference(table, "feedback_learned", reference)
            if difference is not None:
                facts.append(
                    f"backprop-free feedback_learned ({learned['signal'].iloc[0]}) minus "
                    f"{names.get(reference, reference)}: {paired_text(difference, 'nats/character')}"
                )
    alignment = means["mean_alignment"].drop("backprop", errors="ignore").sort_values(ascending=False)
    facts.append(f"mean alignment with the true gradient: {', '.join(f'{m} {v:.2f}' for m, v in alignment.items())}")
    return facts


FINDINGS = {
    "personalization": personalization_finding,
    "capacity": capacity_finding,
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


def summary_markdown(study: Study, rows: list[Answer]) -> str:
    """The page, opening with the answers `rows` (uph.report.answers.answers of the study), with links
    relative to the results folder it is written into."""
    model = study.personalization["model"].iloc[0]
    users = study.personalization["n_users"].max()
    lines = [
        "# Study summary",
        "",
        f"Model {model}, {users} users. Written by the `aggregate` rule from `tables/` and the training "
        "curves; every line below is computed from those numbers. Rebuild with "
        "`snakemake --forcerun aggregate`.",
        "",
        "## Answers",
        "",
        "*not shown*: the comparison ran and its 95 % interval (or, for a point picked as the best of several, "
        "its Bonferroni-corrected sign test) does not decide; *untested*: the config did not run it. "
        "Intervals over users are paired bootstrap, over seeds paired Student-t (for an attention kind picked as "
        "the best of several, at Bonferroni's level over them).",
        "",
        *answers_markdown(rows),
        "",
        "## Figures",
    ]
    for name, spec in FIGURES.items():
        lines += ["", f"### [{spec.title}](figures/{name}.png) ([PDF](figures/{name}.pdf))", ""]
        lines += [f"- {fact}" for fact in FINDINGS[name](study)]
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
