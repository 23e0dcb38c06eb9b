"""The feedback table's rows, one per run (summarize, from the runs' curves), and paired comparisons of two
learning rules over seeds from them (torch-free: the table job does not import torch).

A seed gives every method the same initial network, batches and (factored methods) C and initial U,
so two methods are compared seed by seed: d_s = value(method, s) - value(reference, s), reduced by
uph.stats.paired_over_seeds (mean, Student-t interval, seeds lower, the sign test where n lets it reject).
"""

from __future__ import annotations

import pandas as pd

from uph.stats import PairedDifference, paired_over_seeds

METHODS = ("backprop", "dfa", "feedback_frozen", "feedback_learned", "feedback_learned_oracle")  # the rules compared


def paired_difference(
    table: pd.DataFrame, method: str, reference: str, column: str = "final_loss"
) -> PairedDifference | None:
    """method minus reference in `column` over the seeds both ran; None when they share no seed."""
    wide = table.pivot(index="seed", columns="method", values=column)
    if method not in wide or reference not in wide:
        return None
    differences = (wide[method] - wide[reference]).dropna()
    return None if differences.empty else paired_over_seeds(differences)


def summarize(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, seed): what the rule learns its feedback from (signal), whether it needs a
    backward pass, its forward passes and measured seconds per step (forward pass and learning step,
    `update_seconds` over steps), the final held-out loss and accuracy, and the mean over the run and
    the final value of the alignment averaged over hidden layers."""
    rows = []
    for (method, seed), run in curves.groupby(["method", "seed"], sort=False):
        run = run.sort_values("step")
        alignment = run.filter(regex=r"^alignment_l\d+$").dropna(axis=1, how="all").mean(axis=1)
        last = run.iloc[-1]
        rows.append(
            {
                "method": method,
                "seed": seed,
                "signal": last["signal"],
                "needs_backward": bool(last["needs_backward"]),
                "forward_passes_per_step": int(last["forward_passes_per_step"]),
                "seconds_per_step": last["update_seconds"] / last["step"],
                "final_loss": last["test_loss"],
                "final_acc": last["test_acc"],
                "mean_alignment": alignment.mean(),
                "final_alignment": alignment.iloc[-1],
                "final_train_loss": last["train_loss"],
                "steps": int(last["step"]),
            }
        )
    order = {method: i for i, method in enumerate(METHODS)}
    table = pd.DataFrame(rows)
    return table.sort_values(
        ["method", "seed"], key=lambda s: s.map(order) if s.name == "method" else s, kind="stable"
    ).reset_index(drop=True)
