"""Held-out evaluation: per-user metrics against explicit computations, the cross-user matrix and
the global control on planted users, and the per-configuration summary with its bootstrap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from tiny_lm import sample_text, tiny_llama, user_split

from uph.lm.evaluate import cross_user, per_user, summarize, user_metrics
from uph.lm.fit import fit_theta, pool, prepare
from uph.lm.heads import make_head
from uph.stats import bootstrap_ci

D = 8


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Two users whose text the tiny model wrote with different planted thetas: head, splits, thetas*."""
    model = tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    W = model.get_output_embeddings().weight.detach()
    head = make_head("svd_cvh", W, svd=torch.linalg.svd(W, full_matrices=False), d=D, alpha=1.0)
    stars, trains, tests = {}, {}, {}
    for i, user in enumerate(["romeo", "juliet"]):
        direction = torch.randn(D, dtype=W.dtype, generator=torch.Generator().manual_seed(i))
        stars[user] = 3.0 * F.normalize(direction, dim=0)
        ids = sample_text(model, lambda h, star=stars[user]: head.logits(h, star), batch=15, length=81, seed=10 + i)
        (h_train, y_train), (h_test, y_test) = user_split(model, ids)
        trains[user], tests[user] = prepare(h_train, y_train, W), (h_test, y_test)
    return head, W, trains, tests, stars


def test_user_metrics_match_explicit_computation(planted):
    head, W, _, tests, stars = planted
    h, y = tests["romeo"]
    theta = stars["juliet"]
    metrics = user_metrics(prepare(h, y, W, chunk=32), head, theta)
    base_logits, logits = F.linear(h, W), head.logits(h, theta)
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(base_logits, -1), reduction="batchmean")
    expected = {"base_nll": F.cross_entropy(base_logits, y), "nll": F.cross_entropy(logits, y), "kl": kl}
    expected = {k: float(v) for k, v in expected.items()}
    expected["delta_nll"] = expected["nll"] - expected["base_nll"]
    assert metrics == pytest.approx(expected, rel=1e-10, abs=1e-12)
    zero = user_metrics(prepare(h, y, W), head, torch.zeros(D))
    assert zero["delta_nll"] == 0.0 and zero["kl"] == 0.0


def test_cross_user_matrix_is_diagonal_and_beats_the_global_theta(planted):
    head, W, trains, tests, _ = planted
    splits = {user: prepare(h, y, W) for user, (h, y) in tests.items()}
    thetas = {user: fit_theta(tokens, head, solver="exact")[0] for user, tokens in trains.items()}
    matrix = cross_user(thetas, splits, head)
    assert len(matrix) == 4 and set(matrix.columns) >= {"theta_user", "text_user", "delta_nll", "kl"}
    for row in matrix.itertuples():
        alone = user_metrics(splits[row.text_user], head, thetas[row.theta_user])
        assert row.delta_nll == pytest.approx(alone["delta_nll"])
    delta = matrix.pivot(index="theta_user", columns="text_user", values="delta_nll")
    for user in thetas:
        assert delta.loc[user, user] < -0.05
        assert delta.loc[user, user] < delta.drop(index=user)[user].min()

    global_theta, _ = fit_theta(pool(list(trains.values())), head, solver="exact")
    personal = per_user(thetas, splits, head).set_index("user")
    common = per_user({user: global_theta for user in splits}, splits, head).set_index("user")
    assert (personal["delta_nll"] < common["delta_nll"]).all()


def test_summary_bootstrap_and_shares():
    users = pd.DataFrame(
        {
            "user": list("abcde"),
            "base_nll": [3.0, 3.1, 2.9, 3.2, 3.0],
            "delta_nll": [-0.3, -0.1, 0.05, -0.2, -0.15],
            "kl": [0.1, 0.2, 0.1, 0.3, 0.2],
        }
    )
    users["nll"] = users["base_nll"] + users["delta_nll"]
    row = summarize(users, d=64, n_boot=2000, seed=0)
    rng = np.random.default_rng(0)
    resampled = users["delta_nll"].to_numpy()[rng.integers(0, 5, size=(2000, 5))].mean(axis=1)
    expected = tuple(np.quantile(resampled, [0.025, 0.975]))
    assert (row["delta_nll_ci_low"], row["delta_nll_ci_high"]) == pytest.approx(expected)
    assert row["delta_nll"] == pytest.approx(-0.14)
    assert row["delta_nll_ci_low"] < row["delta_nll"] < row["delta_nll_ci_high"]
    assert row["frac_users_improved"] == 0.8 and row["params_per_user"] == 64 and row["n_users"] == 5
    assert row["nll"] == pytest.approx(row["base_nll"] + row["delta_nll"])
    assert summarize(users, d=64, n_boot=2000, seed=0) == row  # fixed seed: reproducible
    assert bootstrap_ci([-0.2]) == (-0.2, -0.2)
