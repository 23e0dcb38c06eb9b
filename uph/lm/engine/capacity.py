"""Choosing a method's capacity on validation: its knobs, a grid, the best mean over users.

Every method has a capacity knob, walked over a grid (schemas/fit.schema.yaml):

    heads and the full bias    the radius of the ball ‖theta‖ <= radius (fit.radii); alpha, which
                               multiplies theta, stays at its sweep value, so radius alone sets how far
                               the logits may move
    unigram mixtures           the mixture weight lambda (fit.lambdas)
    neural cache mixtures      lambda, and the cache's temperature T (fit.temperatures), on their
                               product grid (uph.lm.engine.neural_cache)

Each user's train tokens split in time into a fit part and a validation part (uph.lm.engine.tokens.
validation_split). Per (method, arm) every grid value is fitted on each user's fit part and scored on
that user's validation part; the value with the lowest validation NLL averaged over users is chosen
(ties, to TIE: the smaller temperature, then the smaller capacity), and the method is refitted on all
train tokens with it and scored on test. Test tokens take no part in any choice. A choice at either end
of a grid says the grid did not bracket the optimum: `at_edge` names the end ("low" or "high"; "low
temperature" for the temperature's grid), and the tables and summary say so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EDGES = ("low", "high")
KNOBS = ("temperature", "capacity")  # every method's grid: a temperature (NaN but for the neural cache), a capacity
TIE = 1e-9  # nats/token: validation means closer than this are one value (the same interior theta at
# every larger radius scores equal up to rounding), and the smaller capacity is chosen


def on_ball(norm, radius: float):
    """Whether theta's norm (a float or an array of them) lies on the ball's sphere, to rounding: there
    the constraint binds, and the radius, not the data, decides the fit."""
    return norm >= radius * (1 - 1e-6)


def choose(validation: pd.DataFrame, keys: list[str], knobs) -> pd.DataFrame:
    """`validation`: one row per (keys..., knob values, user) with its `validation_nll` (a knob it lacks is
    NaN: one value). Returns one row per keys: the chosen value of each knob, `at_edge` (which ends of
    which grids: "" inside them all), the grid's size and the chosen values' mean validation NLL over
    `n_users`. The last knob is the capacity; the others' edges are named after them."""
    knobs = [knobs] if isinstance(knobs, str) else list(knobs)
    validation = validation.assign(**{knob: np.nan for knob in knobs if knob not in validation})
    means = validation.groupby([*keys, *knobs], dropna=False, sort=True)["validation_nll"].agg(["mean", "count"])
    rows = []
    for key, curve in means.groupby(level=list(range(len(keys))), dropna=False, sort=True):
        curve_means = curve["mean"].to_numpy()
        best = int((curve_means <= curve_means.min() + TIE).argmax())  # the smallest values within TIE of the minimum
        values = dict(zip(knobs, curve.index[best][len(keys) :]))
        edges = []
        for knob in knobs:
            grid = curve.index.get_level_values(knob).unique().dropna().sort_values()
            if len(grid) > 1 and values[knob] in (grid[0], grid[-1]):
                edges.append(EDGES[int(values[knob] == grid[-1])] + ("" if knob == knobs[-1] else f" {knob}"))
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                **values,
                "at_edge": ", ".join(edges),
                "grid_size": len(curve),
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
