"""The study's questions and their answers, computed from its tables: the table summary.md opens with.

Each question is a function of the Study that returns an Answer: yes, no, not shown (the comparison ran
and its interval, or its correction for picking, does not decide) or untested (the config did not run
it). It rests on one number with its 95 % interval and n, and names the figure that shows it. Over users
the intervals are the tables' paired bootstrap; over seeds the paired Student-t of uph.stats
(paired_over_seeds), with the sign test quoted only where n lets it reject.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from uph.feedback.comparison import paired_difference
from uph.report.study import (
    MILLI,
    Study,
    baselines_at,
    best_beyond_global,
    headline_solver,
    heads_at_headline,
)
from uph.stats import SIGNIFICANCE, PairedDifference, diagonal_dominance, p_text, paired_over_seeds

ANSWERS = ("yes", "no", "not shown", "untested")
POINT = ["head", "alpha", "d"]  # a sweep point of the LM heads


@dataclass(frozen=True)
class Answer:
    question: str
    answer: str  # one of ANSWERS
    rests_on: str  # the number the answer rests on, with its interval
    n: str  # what the interval is over: "24 users", "5 seeds"
    figure: str  # uph.report.catalog.FIGURES name

    def __post_init__(self):
        if self.answer not in ANSWERS:
            raise ValueError(f"answer {self.answer!r} is not one of {ANSWERS}")


def milli(value: float) -> str:
    return f"{value * MILLI:+.2f}"


def point_label(row) -> str:
    return f"{row['head']} at α = {row['alpha']:g}, d = {row['d']:g}"


def at_point(table: pd.DataFrame, row) -> pd.Series:
    """Which rows of `table` are at the sweep point of `row`."""
    return (table[POINT] == row[POINT]).all(axis=1)


def delta_with_ci(row) -> str:
    """A personalization-table comparison's mean change with its interval, in millinats."""
    return f"{milli(row['delta_nll'])} (95 % CI {milli(row['delta_nll_ci_low'])} to {milli(row['delta_nll_ci_high'])})"


def _by_interval(low: float, high: float) -> str:
    """An NLL change (lower is better): yes when its whole interval lies below 0, no when above, else not
    shown."""
    return "yes" if high < 0 else "no" if low > 0 else "not shown"


def bonferroni(row, points: int) -> float:
    return min(1.0, row["sign_test_p"] * points)


def personal_beyond_global(study: Study) -> Answer:
    """The best of K points is picked after looking: yes only if its interval lies below 0 and its sign
    test survives a Bonferroni correction over the K points (fit.heads is never empty: always tested).
    The gain is the own residual against the other users' mean residual, where the study has others."""
    question = (
        "Does a personal head help beyond domain adaptation (the user's own residual θ against the other "
        "users' mean residual θ, both on top of the global θ)?"
    )
    best, points = best_beyond_global(study.personalization)
    corrected = bonferroni(best, points)
    answer = _by_interval(best["delta_nll_ci_low"], best["delta_nll_ci_high"])
    if answer == "yes" and corrected >= SIGNIFICANCE:
        answer = "not shown"
    against = "the others' mean residual" if best["control"] == "own vs others" else "the global θ (no others)"
    return Answer(
        question,
        answer,
        f"{delta_with_ci(best)} × 10⁻³ nats/token against {against} at the best of {points} points "
        f"({point_label(best)}, {best['solver']}); {int(best['n_users_improved'])} users improved, sign test "
        f"p = {best['sign_test_p']:.2g} ({corrected:.2g} after Bonferroni over {points})",
        f"{int(best['n_users'])} users",
        "personalization",
    )


def cross_user_at_headline(study: Study) -> pd.DataFrame:
    """The cross-user matrix at the headline point (else the first one at the headline solver)."""
    solver = headline_solver(study.personalization)
    cross = study.cross_user[study.cross_user["solver"] == solver]
    if cross.empty:
        return cross
    best, _ = best_beyond_global(study.personalization)
    return cross[at_point(cross, best if at_point(cross, best).any() else cross.iloc[0])]


def own_theta_on_own_text(study: Study) -> Answer:
    question = "Is a user's own residual θ better on their text than the other users' θs (cross-user matrix)?"
    cross = cross_user_at_headline(study)
    if cross.empty:
        return Answer(
            question, "untested", "no cross-user point at the headline solver (fit.cross_user)", "", "cross_user"
        )
    stats = diagonal_dominance(cross)
    return Answer(
        question,
        "yes" if stats["mean_rank_p"] < SIGNIFICANCE else "not shown",
        f"own θ mean rank {stats['mean_rank']:.2f} (chance {stats['mean_rank_chance']:g}), one-sided permutation "
        f"{p_text(stats['mean_rank_p'], stats['mean_rank_p_floor'])}, at {point_label(cross.iloc[0])}",
        f"{stats['n_users']} users",
        "cross_user",
    )


def dose_curve(study: Study) -> pd.DataFrame:
    """The dose-response rows at the headline point (else the point with the best gain on all train
    tokens), at the headline solver, by train size; empty when none ran."""
    solver = headline_solver(study.personalization)
    table = study.dose_response[study.dose_response["solver"] == solver]
    if table.empty:
        return table
    point, _ = best_beyond_global(study.personalization)
    if not at_point(table, point).any():
        all_tokens = table[table["all_train_tokens"]]
        point = all_tokens.loc[all_tokens["delta_nll"].idxmin()]
    return table[at_point(table, point)].sort_values("train_tokens")


def little_text(study: Study) -> Answer:
    curve = dose_curve(study)
    if curve.empty:
        question = "Does a user's residual θ help beyond global from a little of their text?"
        return Answer(question, "untested", "no dose-response point (fit.dose_response)", "", "dose_response")
    first = curve.iloc[0]
    return Answer(
        f"Does a user's residual θ help beyond global from only their first {first['train_tokens']:.0f} train tokens?",
        _by_interval(first["delta_nll_ci_low"], first["delta_nll_ci_high"]),
        f"{delta_with_ci(first)} × 10⁻³ nats/token at {point_label(first)} ({first['solver']})",
        f"{int(first['n_users'])} users",
        "dose_response",
    )


def head_against_baselines(study: Study) -> Answer:
    """The best head (base -> personal) against every baseline's row, by their intervals: yes when the
    head's lies wholly below every baseline's, no when wholly above one's (intervals of two separate
    paired comparisons with the base model: separated intervals are a conservative test)."""
    question = (
        "Does the best personal head beat the per-user baselines "
        "(unigram interpolation, full-vocabulary bias, neural cache)?"
    )
    solver, table = heads_at_headline(study.personalization)
    baselines = baselines_at(study.personalization, solver)
    if baselines.empty:
        return Answer(question, "untested", "no baseline (fit.baselines)", "", "personalization")
    personal = table[table["control"] == "personal"]
    best = personal.loc[personal["delta_nll"].idxmin()]
    if (best["delta_nll_ci_high"] < baselines["delta_nll_ci_low"]).all():
        answer = "yes"
    elif (best["delta_nll_ci_low"] > baselines["delta_nll_ci_high"]).any():
        answer = "no"
    else:
        answer = "not shown"
    against = "; ".join(f"{row['head']} {delta_with_ci(row)}" for _, row in baselines.iterrows())
    return Answer(
        question,
        answer,
        f"{point_label(best)} {delta_with_ci(best)} vs {against} × 10⁻³ nats/token against the frozen model",
        f"{int(best['n_users'])} users",
        "personalization",
    )


def head_on_cache(cache: str):
    """The heads fitted on `cache` (fit.on_cache: "unigram cache" or "neural cache") against the cache
    alone: the best of K points, yes only if its interval lies below 0 and its sign test survives
    Bonferroni over the K."""

    def answer(study: Study) -> Answer:
        question = f"Does a rank-d head add anything to a per-user {cache} (the head fitted on the cache's mixture)?"
        name = "cache" if cache == "unigram cache" else cache  # its personalization.csv controls' name
        _, table = heads_at_headline(study.personalization)
        rows = table[table["control"] == f"{name}+head"]
        if rows.empty:
            return Answer(question, "untested", f"no head on the {cache} (fit.on_cache)", "", "personalization")
        best, points = rows.loc[rows["delta_nll"].idxmin()], len(rows)
        answer = _by_interval(best["delta_nll_ci_low"], best["delta_nll_ci_high"])
        if answer == "yes" and bonferroni(best, points) >= SIGNIFICANCE:
            answer = "not shown"
        own = table[(table["control"] == f"{name} own vs others") & (table["head"] == best["head"])]
        personal = (
            f"; personal? own cache θ against the other users' mean cache θ {delta_with_ci(own.iloc[0])}, "
            f"{_by_interval(own.iloc[0]['delta_nll_ci_low'], own.iloc[0]['delta_nll_ci_high'])}"
            if not own.empty
            else "; no others control (one user), so personal and shared are not told apart"
        )
        return Answer(
            question,
            answer,
            f"{delta_with_ci(best)} × 10⁻³ nats/token against the cache alone at the best of {points} points "
            f"({point_label(best)}, radius {best['capacity']:g}); {int(best['n_users_improved'])} users improved, "
            f"sign test p = {best['sign_test_p']:.2g} ({bonferroni(best, points):.2g} after Bonferroni over {points})"
            f"{personal}",
            f"{int(best['n_users'])} users",
            "personalization",
        )

    return answer


def seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def paired_text(difference: PairedDifference, unit: str, digits: int = 3) -> str:
    """'mean (95 % t CI[, Bonferroni over K] low to high) unit, lower on k of n seeds[, sign test p]'."""
    f = f"{{:+.{digits}f}}"
    picked = f", Bonferroni over {difference.picked_of}," if difference.picked_of > 1 else ""
    interval = (
        f" (95 % t CI{picked} {f.format(difference.ci_low)} to {f.format(difference.ci_high)})"
        if difference.n > 1
        else " (one seed: no interval)"
    )
    sign = "" if difference.sign_test_p is None else f", sign test p = {difference.sign_test_p:.2g}"
    return f"{f.format(difference.mean)}{interval} {unit}, lower on {difference.lower} of {seeds(difference.n)}{sign}"


def paired_answer(
    question: str, what: str, difference: PairedDifference, unit: str, figure: str, higher_is_better: bool
) -> Answer:
    """The answer a paired difference over seeds gives: yes or no where its interval decides (higher or
    lower is better), else not shown; `what` names the difference."""
    verdict = difference.verdict()
    decided = verdict not in ("one seed", "undecided")
    answer = ("yes" if (verdict == "higher") == higher_is_better else "no") if decided else "not shown"
    return Answer(question, answer, f"{what}: {paired_text(difference, unit)}", seeds(difference.n), figure)


@dataclass(frozen=True)
class Picked:
    """A kind picked as the best of several by its mean paired difference, with that difference over its
    seeds (Bonferroni over the kinds it was picked from), and the kinds the seeds do not separate it from."""

    kind: str
    difference: PairedDifference
    alike: tuple[str, ...] = ()

    @property
    def unseparated(self) -> str:
        """'' or, where the data do not separate the kind from others, ' (not separated from ...)': which
        of them is best is then a draw of the seeds, which another CPU's rounding redraws."""
        return f" (not separated from {_names(list(self.alike))})" if self.alike else ""


def picked_pair(differences: dict[str, pd.Series], pick=max) -> Picked | None:
    """Of kind -> per-seed differences, the kind whose mean difference `pick` (max or min) chooses (ties:
    by name), with its paired difference over the seeds it has (Bonferroni over the kinds it was picked
    from), and the other kinds whose paired difference from it, over the seeds both have, has a 95 % t
    interval (Bonferroni over them) that holds 0: not separated from it. None where no kind has a seed."""
    differences = {kind: d.dropna() for kind, d in differences.items()}
    differences = {kind: d for kind, d in differences.items() if len(d)}
    if not differences:
        return None
    kind = pick(differences, key=lambda k: (differences[k].mean(), k))
    others = [k for k in sorted(differences) if k != kind]
    alike = []
    for other in others:
        gap = (differences[kind] - differences[other]).dropna()
        verdict = paired_over_seeds(gap, picked_of=len(others)).verdict() if len(gap) else "one seed"
        if verdict in ("one seed", "undecided"):
            alike.append(other)
    return Picked(kind, paired_over_seeds(differences[kind], picked_of=len(differences)), tuple(alike))


def versus_standard(table: pd.DataFrame, metric: str = "token_acc") -> Picked | None:
    """The non-standard attention kind whose mean `metric` beats standard attention's by the most, with
    its paired difference over seeds (each seed's rows averaged first; Bonferroni over the kinds it was
    picked from); None without both."""
    per_seed = table.groupby(["attention", "seed"])[metric].mean().unstack("attention")
    if "standard" not in per_seed or len(per_seed.columns) < 2:
        return None
    return picked_pair({kind: per_seed[kind] - per_seed["standard"] for kind in per_seed.columns if kind != "standard"})


def _beats_standard(question: str, table: pd.DataFrame, figure: str, untested: str) -> Answer:
    compared = versus_standard(table) if not table.empty else None
    if compared is None:
        return Answer(question, "untested", untested, "", figure)
    what = f"best other kind {compared.kind} minus standard{compared.unseparated}"
    return paired_answer(question, what, compared.difference, "token accuracy", figure, higher_is_better=True)


def copy_task_at_train_length(study: Study) -> Answer:
    table = study.copy_task[study.copy_task["eval_len"] == study.copy_task["train_len"]]
    return _beats_standard(
        "Seed 004's copy task: does an attention kind beat standard attention at the training length?",
        table,
        "copy_task_curves",
        "needs standard and another kind (copy_task.attentions)",
    )


def copy_task_beyond_train_length(study: Study) -> Answer:
    table = study.copy_task[study.copy_task["eval_len"] > study.copy_task["train_len"]]
    return _beats_standard(
        "Seed 004's copy task: does an attention kind beat standard attention beyond the training length?",
        table,
        "copy_task_lengths",
        "needs standard, another kind and a longer eval length (copy_task.eval_lens)",
    )


def gram_resilience(study: Study) -> Answer:
    """Seed 004's table (deterministic): does a loud mismatch keep its dot product while its Gram score falls?"""
    table = study.gram_resilience
    loud = table[table["result"] != "True Match"].sort_values("magnitude")
    first, last = loud.iloc[0], loud.iloc[-1]
    holds = loud["dot"].nunique() == 1 and last["gram"] < first["gram"]
    return Answer(
        "Seed 004's table: does a loud mismatched key keep its dot product while its Gram score falls?",
        "yes" if holds else "no",
        f"m {first['magnitude']:g} → {last['magnitude']:g}: q·k {first['dot']:g} → {last['dot']:g}, "
        f"Gram {first['gram']:g} → {last['gram']:g}",
        f"{len(loud)} magnitudes",
        "gram_resilience",
    )


def attention_rows(study: Study, task: str) -> pd.DataFrame:
    """The attention study's test rows of `task` (empty when it did not run)."""
    return study.attention[study.attention["task"] == task] if study.attention is not None else pd.DataFrame()


def _attention_at_train_length(study: Study, task: str) -> pd.DataFrame:
    """The attention study's test rows of `task` at the training length, of one model: residual when it
    ran, else the first (empty when the task did not run)."""
    table = attention_rows(study, task)
    if table.empty:
        return table
    table = table[table["eval_len"] == table["train_len"]]
    models = sorted(table["model"].unique())
    return table[table["model"] == ("residual" if "residual" in models else models[0])] if models else table


TASK_NAMES = {"offset_copy": "Variable-offset copy", "mqar": "MQAR"}


def attention_task(task: str):
    """The question for a task of the attention study: does any kind beat standard attention at the
    training length (mean over the task's levels), per model when the study ran several."""

    def answer(study: Study) -> Answer:
        table = _attention_at_train_length(study, task)
        return _beats_standard(
            f"{TASK_NAMES[task]}: does an attention kind beat standard attention at the training length"
            + (f" ({table['model'].iloc[0]} model)?" if not table.empty else "?"),
            table,
            f"attention_{task}",
            "needs standard and another kind (attention.tasks, attention.attentions)",
        )

    return answer


LEARNED = 0.9  # test token accuracy at m = 1 (training length) from which a kind counts as having learned
# A stabilized triple variant -> its matched control: standard attention with the same stabilizer and nothing
# else changed (uph.attention.self_attention.KINDS; tests/test_aggregate.py holds each pair to the same fields
# but the score's). A variant without one (the seed's plain triple) is compared with plain standard.
MATCHED_CONTROLS = {"triple_capped": "standard_capped", "triple_qknorm": "standard_qknorm"}
DIFFERENTIAL = "diff"  # differential attention (Ye et al. 2024), the field's distractor-robust kind


@dataclass(frozen=True)
class LoudCopy:
    """The loud-distractor copy task at the training length, per seed: a kind's drop is its token accuracy
    at the lowest m minus at the highest (each seed's rows averaged first)."""

    model: str
    low: float
    high: float
    drop: pd.DataFrame  # seed x kind
    learned: pd.Series  # kind -> mean token accuracy at the lowest m >= LEARNED
    triples: pd.Series  # triple-family kind whose scores keep m (not `loudness_invariant`) -> most steps run

    @property
    def levels(self) -> str:
        return f" (m = {self.high:g} against m = {self.low:g}, trained at m = {self.low:g})"

    def learned_triples(self) -> list[str]:
        return [kind for kind in self.triples.index if self.reached(kind)]

    def did_not_learn(self) -> str:
        steps = ", ".join(f"{kind} {int(steps)}" for kind, steps in self.triples.items())
        return f"no triple-product kind that keeps m reached {LEARNED} at m = {self.low:g} (most steps run: {steps})"

    def reached(self, kind: str) -> bool:
        return bool(self.learned.get(kind, False))


def loud_copy(study: Study) -> LoudCopy | None:
    """The loud-distractor copy task's drops (one model, as _attention_at_train_length); None without two
    loudness levels."""
    table = _attention_at_train_length(study, "loud_copy")
    if table.empty or table["level"].nunique() < 2:
        return None
    low, high = table["level"].min(), table["level"].max()
    per_seed = table.groupby(["attention", "level", "seed"])["token_acc"].mean().unstack("level")
    kinds = table.groupby("attention")[["family", "loudness_invariant", "steps_run"]].agg(
        {"family": "first", "loudness_invariant": "first", "steps_run": "max"}
    )
    triples = kinds[(kinds["family"] == "triple") & ~kinds["loudness_invariant"].astype(bool)]
    return LoudCopy(
        table["model"].iloc[0],
        low,
        high,
        (per_seed[low] - per_seed[high]).unstack("attention"),
        per_seed[low].groupby("attention").mean() >= LEARNED,
        triples["steps_run"],
    )


def _names(kinds: list[str]) -> str:
    return " and ".join(kinds) if len(kinds) < 3 else ", ".join(kinds[:-1]) + f" and {kinds[-1]}"


def _reference(loud: LoudCopy, kind: str) -> tuple[str | None, str]:
    """What triple variant `kind` is compared with and how the answer names the comparison: its matched
    control where it ran and learned, else plain standard (saying why), else None."""
    control = MATCHED_CONTROLS.get(kind)
    if control is not None and loud.reached(control):
        return control, f"{kind} vs its matched control {control}"
    why = (
        f"no matched control: {kind} adds no stabilizer"
        if control is None
        else f"its matched control {control} did not run"
        if control not in loud.learned
        else f"its matched control {control} did not reach {LEARNED} at m = {loud.low:g}"
    )
    return ("standard", f"{kind} vs plain standard ({why})") if loud.reached("standard") else (None, why)


def _least_drop(loud: LoudCopy, references: dict[str, str]) -> Picked | None:
    """The kind whose drop minus its reference's (kind -> reference) is the smallest on average, paired
    over seeds, Bonferroni over the kinds it was picked from (picked_pair); None without a seed both ran."""
    return picked_pair({kind: loud.drop[kind] - loud.drop[reference] for kind, reference in references.items()}, min)


def loud_copy_resilience(study: Study) -> Answer:
    """Seed 004's resilience claim under training: trained at m = 1, is a triple-product kind hurt less by
    loud distractors than its matched control, standard attention with the same stabilizer
    (MATCHED_CONTROLS), so that a resilience the stabilizer gives either score is not credited to the
    triple product? A variant without a control that ran and learned is compared with plain standard, and
    the answer says so. Per seed, a kind's drop is its token accuracy at the lowest m minus at the highest
    (training length); the triple-family kind with the smallest mean drop against its reference's, paired
    over seeds (Bonferroni over the kinds it was picked from). Only kinds that learned the task (mean
    accuracy >= LEARNED at the lowest m) and whose scores keep m (not `loudness_invariant`) count."""
    figure, question = (
        "attention_loud_copy",
        "Loud-distractor copy: is a triple-product kind hurt less by loud distractors",
    )
    control = " than its matched control, standard attention with the same stabilizer?"
    loud = loud_copy(study)
    if loud is None or loud.triples.empty:
        return Answer(
            question + control,
            "untested",
            "needs a triple kind that keeps m, its matched control or standard, and two loudness levels "
            "(attention.attentions, attention.ms)",
            "",
            figure,
        )
    question += loud.levels + control
    candidates = loud.learned_triples()
    if not candidates:
        return Answer(question, "not shown", loud.did_not_learn(), "", figure)
    references = {kind: _reference(loud, kind) for kind in candidates}
    compared = {kind: reference for kind, (reference, _) in references.items() if reference is not None}
    least = _least_drop(loud, compared)
    if least is None:
        controls = [MATCHED_CONTROLS[kind] for kind in candidates if kind in MATCHED_CONTROLS]
        ran = [kind for kind in ("standard", *controls) if kind in loud.learned]
        if compared:
            return Answer(question, "untested", "no seed that a triple kind and its reference both ran", "", figure)
        if not ran:
            needs = "needs standard" + (f" or {_names(controls)}" if controls else "") + " (attention.attentions)"
            return Answer(question, "untested", needs, "", figure)
        return Answer(question, "not shown", f"{_names(ran)} did not reach {LEARNED} at m = {loud.low:g}", "", figure)
    reference, named = references[least.kind]
    what = f"{named}, accuracy drop minus {reference}'s{least.unseparated}"
    return paired_answer(question, what, least.difference, "token accuracy", figure, higher_is_better=False)


def loud_copy_against_differential(study: Study) -> Answer:
    """Does the best triple variant beat differential attention (DIFFERENTIAL), the field's
    distractor-robust kind, on loud distractors? The same drops as loud_copy_resilience: the learned
    triple-family kind that keeps m with the smallest mean drop minus diff's, paired over seeds
    (Bonferroni over the kinds it was picked from)."""
    figure = "attention_loud_copy"
    question = "Loud-distractor copy: is the best triple-product kind hurt less by loud distractors"
    than = f" than differential attention ({DIFFERENTIAL})?"
    loud = loud_copy(study)
    if loud is None or loud.triples.empty or DIFFERENTIAL not in loud.learned:
        return Answer(
            question + than,
            "untested",
            f"needs {DIFFERENTIAL}, a triple kind that keeps m and two loudness levels "
            "(attention.attentions, attention.ms)",
            "",
            figure,
        )
    question += loud.levels + than
    candidates = loud.learned_triples()
    if not candidates:
        return Answer(question, "not shown", loud.did_not_learn(), "", figure)
    if not loud.reached(DIFFERENTIAL):
        return Answer(question, "not shown", f"{DIFFERENTIAL} did not reach {LEARNED} at m = {loud.low:g}", "", figure)
    least = _least_drop(loud, dict.fromkeys(candidates, DIFFERENTIAL))
    if least is None:
        return Answer(question, "untested", f"no seed that {DIFFERENTIAL} and a triple kind both ran", "", figure)
    what = f"{least.kind}'s accuracy drop minus {DIFFERENTIAL}'s{least.unseparated}"
    return paired_answer(question, what, least.difference, "token accuracy", figure, higher_is_better=False)


def feedback_beats(reference: str):
    """Does backprop-free feedback_learned reach a lower held-out loss than `reference`, paired over seeds?"""

    def answer(study: Study) -> Answer:
        question = f"Does backprop-free feedback_learned beat {reference} (held-out loss)?"
        difference = paired_difference(study.feedback, "feedback_learned", reference)
        if difference is None:
            return Answer(
                question, "untested", f"needs feedback_learned and {reference} (feedback.methods)", "", "feedback"
            )
        what = f"feedback_learned minus {reference}"
        return paired_answer(question, what, difference, "nats/character", "feedback", higher_is_better=False)

    return answer


QUESTIONS = (  # in the order of the table
    personal_beyond_global,
    own_theta_on_own_text,
    little_text,
    head_against_baselines,
    head_on_cache("unigram cache"),
    head_on_cache("neural cache"),
    copy_task_at_train_length,
    copy_task_beyond_train_length,
    gram_resilience,
    attention_task("offset_copy"),
    loud_copy_resilience,
    loud_copy_against_differential,
    attention_task("mqar"),
    feedback_beats("dfa"),
    feedback_beats("feedback_frozen"),
)


def answers(study: Study) -> list[Answer]:
    return [question(study) for question in QUESTIONS]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a | would split it, a newline end its row."""
    return text.replace("|", "\\|").replace("\n", " ")


def answers_markdown(rows: list[Answer], linked: bool = True) -> list[str]:
    """The answers as a Markdown table, figure names linked to their PNG (relative to the results folder)
    where `linked`."""
    lines = ["| question | answer | rests on | n | figure |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        figure = f"[{row.figure}](figures/{row.figure}.png)" if linked else row.figure
        lines.append(f"| {_cell(row.question)} | **{row.answer}** | {_cell(row.rests_on)} | {row.n} | {figure} |")
    return lines


def answers_html(rows: list[Answer]) -> str:
    """The same table as a standalone HTML page: the report's Summary category shows it."""
    cells = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(text)}</td>" if i != 1 else f"<td><b>{html.escape(text)}</b></td>"
            for i, text in enumerate((row.question, row.answer, row.rests_on, row.n, row.figure))
        )
        + "</tr>\n"
        for row in rows
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Answers</title>\n'
        "<style>body{font-family:sans-serif;font-size:14px}table{border-collapse:collapse}"
        "td,th{border:1px solid #bbb;padding:4px 8px;vertical-align:top;text-align:left}</style></head>\n"
        "<body><table>\n<tr><th>question</th><th>answer</th><th>rests on</th><th>n</th><th>figure</th></tr>\n"
        f"{cells}</table></body></html>\n"
    )
