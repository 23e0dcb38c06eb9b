"""The personalization study's tables (uph.lm.jobs.tables) from hand-made per-user rows, against the
comparisons written out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from uph.lm.jobs.tables import (
    CROSS_USER_COLUMNS,
    capacity_table,
    cross_user_table,
    dose_response_table,
    personalization_table,
)

USERS = ["a", "b", "c"]
POINT = {"head": "cvh", "alpha": 1.0, "d": 8, "solver": "exact"}


def fits() -> pd.DataFrame:
    """Three users at one point: base 3.0, global 2.9, personal 2.95, residual 2.8 plus a per-user wiggle."""
    wiggle = np.array([0.0, 0.01, -0.02])
    return pd.DataFrame(
        {
            **{key: [value] * 3 for key, value in POINT.items()},
            "user": USERS,
            "params_per_user": 8,
            "base_nll": 3.0 + wiggle,
            "global_nll": 2.9 + wiggle,
            "personal_nll": 2.95 + 2 * wiggle,
            "residual_nll": 2.8 + 3 * wiggle,
            "global_kl": [0.1, 0.2, 0.3],
            "personal_kl": [0.2, 0.2, 0.2],
            "residual_kl": [0.3, 0.3, 0.6],
            "personal_objective": [1.0, 2.0, 3.0],
            "personal_certificate": [1e-7, 3e-7, 2e-7],
            "residual_objective": [2.0, 2.0, 5.0],
            "residual_certificate": [1e-8, 1e-6, 1e-7],
            "personal_theta_norm": [5.0, 4.0, 5.0],  # on the ball of radius 5: 2 of 3
            "residual_theta_norm": [1.0, 2.0, 5.0 * (1 - 1e-8)],  # 1 of 3, to rounding
        }
    )


def others() -> pd.DataFrame:
    """Others' mean residual at 2.85 on every user's text."""
    return pd.DataFrame([{**POINT, "user": u, "others_nll": 2.85} for u in USERS])


def global_fits() -> pd.DataFrame:
    return pd.DataFrame([{**POINT, "fit_objective": 2.5, "fit_certificate": 4e-7, "fit_theta_norm": 5.0}])


def baselines() -> pd.DataFrame:
    """The unigram's three arms (no theta) and the full bias's (fitted, d = V = 100) as fits rows."""
    unigram = [
        {
            "head": "unigram",
            "alpha": np.nan,
            "d": np.nan,
            "solver": "exact",
            "user": u,
            "base_nll": 3.0,
            "global_nll": 2.2,
            "personal_nll": 2.0 + i * 0.1,
            "residual_nll": 2.1,
            "params_per_user": 101,
        }
        for i, u in enumerate(USERS)
    ]
    bias = [
        {
            "head": "full_bias",
            "alpha": 1.0,
            "d": 100,
            "solver": "exact",
            "user": u,
            "base_nll": 3.0,
            "global_nll": 2.6,
            "personal_nll": 2.5,
            "residual_nll": 2.55,
            "params_per_user": 100,
            "personal_objective": 1.0 + i,
            "personal_certificate": 1e-6 * (i + 1),
            "personal_theta_norm": 15.0,
        }
        for i, u in enumerate(USERS)
    ]
    return pd.DataFrame(unigram + bias)


def choices() -> pd.DataFrame:
    """Every arm's choice: the heads' radii (the personal one at the grid's high end), the unigram's lambdas."""
    rows = []
    for method, capacities in (
        (POINT, {"global": 5.0, "personal": 5.0, "residual": 5.0}),
        (
            {"head": "full_bias", "alpha": 1.0, "d": 100, "solver": "exact"},
            dict.fromkeys(["global", "personal", "residual"], 15.0),
        ),
        (
            {"head": "unigram", "alpha": np.nan, "d": np.nan, "solver": "exact"},
            {"global": 0.1, "personal": 0.3, "residual": 0.03},
        ),
    ):
        for arm, capacity in capacities.items():
            edge = "high" if (method["head"], arm) == ("cvh", "personal") else ""
            rows.append({**method, "arm": arm, "train_tokens": np.nan, "capacity": capacity, "at_edge": edge})
    return pd.DataFrame(rows)


def test_personalization_rows_are_the_paired_comparisons_at_the_chosen_capacities():
    rows = pd.concat([fits(), baselines()])
    table = personalization_table("m", rows, global_fits(), others(), choices(), n_boot=200).set_index(
        ["head", "control"]
    )
    wiggle = np.array([0.0, 0.01, -0.02])
    expected = {  # control: (arm - reference per user, mean KL, fit objective, worst certificate, on the ball)
        "global": (np.full(3, -0.1), 0.2, 2.5, 4e-7, 1.0),
        "personal": (-0.05 + wiggle, 0.2, 2.0, 3e-7, 2 / 3),
        "global+personal": (-0.1 + 2 * wiggle, 0.4, 3.0, 1e-6, 1 / 3),
    }
    for control, (delta, kl, objective, certificate, on_ball) in expected.items():
        row = table.loc[("cvh", control)]
        assert row["frac_on_ball"] == pytest.approx(on_ball) and row["capacity"] == 5.0
        assert row["at_edge"] == ("high" if control == "personal" else "")
        assert row["delta_nll"] == pytest.approx(delta.mean())
        assert row["n_users_improved"] == (delta < 0).sum() and row["n_users"] == 3
        assert (row["kl"], row["fit_objective"], row["fit_certificate_max"]) == pytest.approx(
            (kl, objective, certificate)
        )
        assert row["model"] == "m" and row["params_per_user"] == 8
    assert table.loc[("cvh", "global+personal"), "reference"] == "global"
    # the others control against global, and the own residual against it: the personal gain
    own_vs_others = table.loc[("cvh", "own vs others")]
    assert table.loc[("cvh", "others"), "delta_nll"] == pytest.approx(-0.05 - wiggle.mean())
    assert own_vs_others["reference"] == "others" and own_vs_others["delta_nll"] == pytest.approx(
        (-0.05 + 3 * wiggle).mean()
    )
    assert math.isnan(own_vs_others["fit_objective"])
    without = personalization_table("m", rows, global_fits(), others().iloc[:0], choices(), n_boot=200)
    assert "others" not in set(without["control"]) and len(without) == 9  # one user: no others control
    assert table.loc[("cvh", "global"), "base_nll"] == pytest.approx(3.0 + wiggle.mean())
    # baselines in the same three arms, with no alpha or d; the unigram has no fit columns
    bias, unigram = table.loc[("full_bias", "personal")], table.loc[("unigram", "personal")]
    assert bias["delta_nll"] == pytest.approx(-0.5) and bias["fit_objective"] == pytest.approx(2.0)
    assert bias["fit_certificate_max"] == pytest.approx(3e-6) and bias["params_per_user"] == 100
    assert bias["frac_on_ball"] == 1.0 and bias["capacity"] == 15.0 and math.isnan(bias["d"])
    assert unigram["delta_nll"] == pytest.approx(-0.9) and math.isnan(unigram["fit_objective"])
    assert math.isnan(unigram["frac_on_ball"]) and unigram["capacity"] == 0.3
    assert math.isnan(unigram["alpha"]) and math.isnan(unigram["d"]) and unigram["reference"] == "base"
    beyond = table.loc[("unigram", "global+personal")]
    assert beyond["delta_nll"] == pytest.approx(-0.1) and beyond["reference"] == "global" and beyond["capacity"] == 0.03


def test_capacity_table_marks_the_chosen_point_of_every_curve():
    validation = pd.DataFrame(
        [
            {
                **POINT,
                "arm": "personal",
                "train_tokens": np.nan,
                "capacity": r,
                "user": u,
                "validation_nll": nll + i * 0.01,
                "theta_norm": min(r, 3.0),
            }
            for r, nll in ((1.0, 2.0), (5.0, 1.9), (25.0, 1.95))
            for i, u in enumerate(USERS)
        ]
    )
    choice = pd.DataFrame(
        [{**POINT, "arm": "personal", "train_tokens": np.nan, "temperature": np.nan, "capacity": 5.0, "at_edge": ""}]
    )
    table = capacity_table("m", validation, choice)
    assert table["chosen"].tolist() == [False, True, False] and table["n_users"].tolist() == [3, 3, 3]
    assert table["validation_nll"].tolist() == pytest.approx([2.01, 1.91, 1.96])
    assert table["frac_on_ball"].tolist() == [1.0, 0.0, 0.0]


def test_dose_response_rows_stand_all_tokens_at_their_mean_count():
    rows = []
    for user, count in zip(USERS, (1000, 1200, 1400)):
        for k, residual in ((512, 2.95), (count, 2.85)):
            rows.append(
                {
                    **POINT,
                    "user": user,
                    "train_tokens": k,
                    "all_train_tokens": k == count,
                    "global_nll": 2.9,
                    "residual_nll": residual,
                }
            )
    choices = pd.DataFrame(
        [
            {**POINT, "arm": "residual", "train_tokens": k, "capacity": radius, "at_edge": edge}
            for k, radius, edge in ((512.0, 0.05, "low"), (np.nan, 5.0, ""))
        ]
    )
    table = dose_response_table("m", pd.DataFrame(rows), choices, n_boot=200)
    assert table["train_tokens"].tolist() == [512, 1200] and table["all_train_tokens"].tolist() == [False, True]
    assert table["radius"].tolist() == [0.05, 5.0] and table["at_edge"].tolist() == ["low", ""]
    assert table["delta_nll"].tolist() == pytest.approx([0.05, -0.05]) and (table["n_users"] == 3).all()


def test_cross_user_table_keeps_the_contract_columns_even_with_no_point():
    empty = cross_user_table("m", [])
    assert empty.empty and list(empty.columns) == CROSS_USER_COLUMNS
    matrix = pd.DataFrame(
        [
            {
                **POINT,
                "theta_user": u,
                "text_user": v,
                "base_nll": 3.0,
                "global_nll": 2.9,
                "nll": 2.8,
                "delta_nll": -0.1,
                "extra": 1,
            }
            for u in USERS
            for v in USERS
        ]
    )
    table = cross_user_table("m", [matrix])
    assert list(table.columns) == CROSS_USER_COLUMNS and len(table) == 9 and (table["model"] == "m").all()


def test_the_head_on_the_cache_has_its_others_control():
    """cache+head against the mixture; cache others (the other users' mean cache theta) against the
    mixture; cache own vs others: the own cache theta against the others', per user."""
    cache = np.array([2.5, 2.6, 2.4])
    rows = fits().assign(cache_nll=cache, cache_head_nll=cache - [0.03, 0.01, 0.02], cache_others_nll=cache - 0.02)
    rows = rows.assign(cache_theta_norm=[1.0, 1.0, 1.0], cache_objective=1.0, cache_certificate=1e-7)
    cache_choice = pd.DataFrame([{**POINT, "arm": "cache", "train_tokens": np.nan, "capacity": 1.5, "at_edge": ""}])
    all_choices = pd.concat([choices(), cache_choice])
    table = personalization_table("m", rows, global_fits(), others(), all_choices, n_boot=200).set_index("control")
    assert table.loc["cache+head", "delta_nll"] == pytest.approx(-0.02) and table.loc["cache+head", "capacity"] == 1.5
    assert table.loc["cache others", "delta_nll"] == pytest.approx(-0.02)
    own = table.loc["cache own vs others"]
    assert own["reference"] == "cache_others" and own["delta_nll"] == pytest.approx(0.0, abs=1e-12)
    assert own["n_users_improved"] == 1
    without = personalization_table(
        "m", rows.drop(columns="cache_others_nll"), global_fits(), others(), all_choices, 200
    )
    assert "cache own vs others" not in set(without["control"])
