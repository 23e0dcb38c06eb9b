"""Choosing a capacity on validation (uph.lm.engine.capacity): the best mean over users, ties to the smaller
capacity, a choice at either end of the grid flagged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from uph.lm.engine.capacity import choose, chosen


def curve(nlls_per_user: dict[float, list[float]], **key) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {**key, "capacity": capacity, "user": f"u{i}", "validation_nll": nll}
            for capacity, nlls in nlls_per_user.items()
            for i, nll in enumerate(nlls)
        ]
    )


def test_the_best_mean_over_users_wins_not_any_one_user():
    # u0 alone would pick 1.0, u1 alone 10.0; their mean is lowest at 3.0
    validation = curve({1.0: [2.0, 3.0], 3.0: [2.1, 2.4], 10.0: [2.9, 2.0]}, head="h", arm="personal")
    (row,) = choose(validation, ["head", "arm"], "capacity").to_dict("records")
    assert row["capacity"] == 3.0 and row["at_edge"] == "" and row["n_users"] == 2 and row["grid_size"] == 3
    assert row["validation_nll"] == pytest.approx(2.25)


@pytest.mark.parametrize(
    "nlls, capacity, edge",
    [
        ({1.0: [1.0], 3.0: [2.0], 10.0: [3.0]}, 1.0, "low"),
        ({1.0: [3.0], 3.0: [2.0], 10.0: [1.0]}, 10.0, "high"),
        ({1.0: [2.0], 3.0: [1.0], 10.0: [1.0]}, 3.0, ""),  # a tie: the smaller capacity
        # the same interior theta at every larger radius scores equal up to rounding: still a tie
        ({1.0: [2.0], 3.0: [1.0 + 2e-16], 10.0: [1.0]}, 3.0, ""),
    ],
)
def test_a_choice_at_an_end_of_the_grid_is_flagged(nlls, capacity, edge):
    choices = choose(curve(nlls, head="h"), ["head"], "capacity")
    assert choices["capacity"].tolist() == [capacity] and choices["at_edge"].tolist() == [edge]


def test_keys_with_nan_are_chosen_and_found():
    validation = pd.concat(
        [
            curve({0.1: [2.0], 0.3: [1.0], 0.6: [1.5]}, head="unigram", alpha=np.nan, train_tokens=np.nan),
            curve({0.1: [1.0], 0.3: [2.0], 0.6: [3.0]}, head="unigram", alpha=np.nan, train_tokens=256.0),
        ]
    )
    choices = choose(validation, ["head", "alpha", "train_tokens"], "capacity")
    assert chosen(choices, "capacity", head="unigram", alpha=np.nan, train_tokens=np.nan) == 0.3
    assert chosen(choices, "capacity", head="unigram", alpha=np.nan, train_tokens=256.0) == 0.1
    with pytest.raises(KeyError, match="no single capacity choice"):
        chosen(choices, "capacity", head="cvh", alpha=np.nan, train_tokens=np.nan)
