"""Paired comparisons of two learning rules over seeds, from the rows of results/tables/feedback.csv.

A seed gives every method the same initial network, batches and (factored methods) C and initial U,
so two methods are compared seed by seed: d_s = value(method, s) - value(reference, s). Reported: the
mean of d_s, its paired bootstrap interval (uph.stats.bootstrap_ci of the d_s), the exact sign test
(uph.stats.sign_test) and on how many seeds the method is lower.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from uph.stats import bootstrap_ci, sign_test


@dataclass(frozen=True)
class PairedDifference:
    mean: float
    ci_low: float
    ci_high: float
    sign_test_p: float
    lower: int  # seeds on which the method's value is below the reference's
    seeds: int

    def verdict(self) -> str:
        """'lower' when the whole 95 % interval is below 0, 'higher' when above, else 'undecided';
        'one seed' when there is no interval to speak of (a bootstrap of one value is that value)."""
        if self.seeds < 2:
            return "one seed"
        return "lower" if self.ci_high < 0 else "higher" if self.ci_low > 0 else "undecided"


def paired_difference(
    table: pd.DataFrame, method: str, reference: str, column: str = "final_loss"
) -> PairedDifference | None:
    """method minus reference in `column` over the seeds both ran; None when they share no seed."""
    wide = table.pivot(index="seed", columns="method", values=column)
    if method not in wide or reference not in wide:
        return None
    differences = (wide[method] - wide[reference]).dropna()
    if differences.empty:
        return None
    low, high = bootstrap_ci(differences)
    return PairedDifference(
        float(differences.mean()), low, high, sign_test(differences), int((differences < 0).sum()), len(differences)
    )
