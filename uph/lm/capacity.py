"""Choosing a method's capacity on validation: one knob per method, a grid, the best mean over users.

Every method has one capacity knob, walked over a grid (schemas/fit.schema.yaml):

    heads and the full bias    the radius of the ball ‖theta‖ <= radius (fit.radii); alpha, which
                               multiplies theta, stays at its sweep value, so radius alone sets how far
                               the logits may move
    unigram mixtures           the mixture weight lambda (fit.lambdas)

Each user's train tokens split in time into a fit part and a validation part (uph.lm.tokens.
validation_split). Per (method, arm) every grid value is fitted on each user's fit part and scored on
that user's validation part; the value with the lowest validation NLL averaged over users is chosen
(ties, to TIE: the smaller capacity), and the method is refitted on all train tokens with it and scored on
test. Test tokens take no part in any choice. A choice at either end of the grid says the grid did not
bracket the optimum: `at_edge` names the end ("low" or "high"), and the tables and summary say so.
"""

from __future__ import annotations

import pandas as pd

EDGES = ("low", "high")
TIE = 1e-9  # nats/token: validation means closer than this are one value (the same interior theta at
# every larger radius scores equal up to rounding), and the smaller capacity is chosen


def choose(validation: pd.DataFrame, keys: list[str], knob: str) -> pd.DataFrame:
    """`validation`: one row per (keys..., knob value, user) with its `validation_nll`. Returns one row per
    keys: the chosen `knob` value, `at_edge` ("low", "high" or ""), the grid's size and the chosen value's
    mean validation NLL over `n_users`."""
    means = validation.groupby([*keys, knob], dropna=False, sort=True)["validation_nll"].agg(["mean", "count"])
    rows = []
    for key, curve in means.groupby(level=list(range(len(keys))), dropna=False, sort=True):
        values, curve_means = curve.index.get_level_values(knob), curve["mean"].to_numpy()
        best = int((curve_means <= curve_means.min() + TIE).argmax())  # the smallest capacity within TIE of the minimum
        edge = "" if len(values) < 2 or 0 < best < len(values) - 1 else EDGES[best > 0]
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                knob: values[best],
                "at_edge": edge,
                "grid_size": len(values),
                "validation_nll": curve_means[best],
                "n_users": int(curve["count"].iloc[best]),
            }
        )
    return pd.DataFrame(rows)


def chosen_row(choices: pd.DataFrame, **key) -> pd.Series:
    """The one row of `choices` matching `key` (NaN keys match NaN)."""
    match = pd.Series(True, index=choices.index)
    for column, value in key.items():
        match &= choices[column].isna() if pd.isna(value) else choices[column] == value
    rows = choices[match]
    if len(rows) != 1:
        raise KeyError(f"no single capacity choice for {key}: {len(rows)} rows")
    return rows.iloc[0]


def chosen(choices: pd.DataFrame, knob: str, **key) -> float:
    """The chosen `knob` value of the one row of `choices` matching `key`."""
    return float(chosen_row(choices, **key)[knob])
