"""Paired comparisons of two learning rules over seeds, from the rows of results/tables/feedback.csv.

A seed gives every method the same initial network, batches and (factored methods) C and initial U,
so two methods are compared seed by seed: d_s = value(method, s) - value(reference, s), reduced by
uph.stats.paired_over_seeds (mean, Student-t interval, seeds lower, the sign test where n lets it reject).
"""

from __future__ import annotations

import pandas as pd

from uph.stats import PairedDifference, paired_over_seeds


def paired_difference(
    table: pd.DataFrame, method: str, reference: str, column: str = "final_loss"
) -> PairedDifference | None:
    """method minus reference in `column` over the seeds both ran; None when they share no seed."""
    wide = table.pivot(index="seed", columns="method", values=column)
    if method not in wide or reference not in wide:
        return None
    differences = (wide[method] - wide[reference]).dropna()
    return None if differences.empty else paired_over_seeds(differences)
