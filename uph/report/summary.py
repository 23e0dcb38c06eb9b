"""results/summary.md: one page that links every figure and table with one line of finding each.

Every finding is computed from the study's tables and curves (`uph.report.study.Study`), never typed in:
rerun the aggregate rule and the lines follow the numbers. NLL changes are quoted in 10^-3 nats per
token, negative = better than the frozen model; the personalization lines quote the solver
`headline_solver` picks, the copy-task and feedback lines means over seeds.
"""

from __future__ import annotations

import pandas as pd

from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import MILLI
from uph.report.study import Study, headline_solver


def _milli(value: float) -> str:
    return f"{value * MILLI:+.2f}"


def personalization_finding(study: Study) -> str:
    """The best personal sweep point with its interval, how many points are reliably below zero, and
    whether the pooled global control reaches the same gain (then it is not personal)."""
    solver = headline_solver(study.personalization)
    table = study.personalization[study.personalization["solver"] == solver]
    personal = table[table["control"] == "personal"]
    best = personal.loc[personal["delta_nll"].idxmin()]
    point = f"{best['head']} at α = {best['alpha']:g}, d = {best['d']}"
    line = (
        f"best personal head {point} ({solver} solver): Δ NLL {_milli(best['delta_nll'])} × 10⁻³ nats/token "
        f"(95 % CI {_milli(best['delta_nll_ci_low'])} to {_milli(best['delta_nll_ci_high'])}), "
        f"{round(best['frac_users_improved'] * best['n_users'])} of {best['n_users']} users improved; "
        f"{(personal['delta_nll_ci_high'] < 0).sum()} of {len(personal)} sweep points have an interval below zero"
    )
    same_point = (
        (table["control"] == "global")
        & (table["head"] == best["head"])
        & (table["alpha"] == best["alpha"])
        & (table["d"] == best["d"])
    )
    if not same_point.any():
        return line + "."
    pooled = table.loc[same_point, "delta_nll"].iloc[0]
    verdict = (
        "it does at least as well, so the gain here is shared by all users (domain adaptation), not personal"
        if pooled <= best["delta_nll"]
        else f"the personal θ beats the pooled global θ by {(pooled - best['delta_nll']) * MILLI:.2f} × 10⁻³"
    )
    return f"{line}; at that point the pooled global θ reaches {_milli(pooled)}: {verdict}."


def cross_user_finding(study: Study) -> str:
    """Per cross-user point: own theta (diagonal) against other users' thetas on the same text, and on
    how many users' texts the own theta is the best one."""
    parts = []
    for (head, alpha, d, solver), pairs in study.cross_user.groupby(["head", "alpha", "d", "solver"], sort=True):
        own = pairs["theta_user"] == pairs["text_user"]
        best = pairs.loc[pairs.groupby("text_user")["delta_nll"].idxmin()]
        parts.append(
            f"{head} at α = {alpha:g}, d = {d} ({solver}): own θ Δ NLL {_milli(pairs.loc[own, 'delta_nll'].mean())} "
            f"vs other users' θ {_milli(pairs.loc[~own, 'delta_nll'].mean())} × 10⁻³ nats/token on the same "
            f"texts; the own θ is the best on {(best['theta_user'] == best['text_user']).sum()} of "
            f"{len(best)} users' texts"
        )
    return "; ".join(parts) + "." if parts else "no cross-user point configured (fit.cross_user)."


def solver_gap_finding(study: Study) -> str:
    """Mean and worst excess of the seed solver's objective over the exact optimum; worst certificates."""
    table = study.personalization[study.personalization["control"] == "personal"]
    if not {"seed", "exact"} <= set(table["solver"]):
        return "needs both fit.solvers (seed and exact) to compare."
    objective = table.pivot_table(index=["head", "alpha", "d"], columns="solver", values="fit_objective")
    gap = objective["seed"] - objective["exact"]
    head, alpha, d = gap.idxmax()
    certificate = table.groupby("solver")["fit_certificate_max"].max()
    return (
        f"seed 002's Adam schedule stops on average {gap.mean() * MILLI:.2f} × 10⁻³ nats above the certified "
        f"optimum (most: {gap.max() * MILLI:.2f} at {head}, α = {alpha:g}, d = {d}); worst projected-gradient "
        f"norm {certificate['seed']:.1e} (seed) vs {certificate['exact']:.1e} (exact)."
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


def feedback_finding(study: Study) -> str:
    """Methods in order of final held-out loss, and their mean alignment with the true gradient."""
    means = study.feedback.groupby("method")[["final_loss", "mean_alignment"]].mean()
    by_loss = means.sort_values("final_loss")
    steps = study.feedback_curves["step"].max()
    alignment = means["mean_alignment"].drop("backprop", errors="ignore").sort_values(ascending=False)
    return (
        f"held-out loss after {steps} steps: "
        + " < ".join(f"{m} {v:.3f}" for m, v in by_loss["final_loss"].items())
        + " nats/character; mean alignment with the true gradient: "
        + ", ".join(f"{m} {v:.2f}" for m, v in alignment.items())
        + "."
    )


FINDINGS = {
    "personalization": personalization_finding,
    "cross_user": cross_user_finding,
    "solver_gap": solver_gap_finding,
    "copy_task_curves": copy_task_curves_finding,
    "copy_task_lengths": copy_task_lengths_finding,
    "gram_resilience": gram_resilience_finding,
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
