import itertools
import math

import numpy as np
import pandas as pd
import pytest

from uph.stats import (
    COMPARISON_COLUMNS,
    bootstrap_ci,
    compare,
    diagonal_dominance,
    paired_over_seeds,
    sign_test,
    sign_test_can_reject,
    t_interval,
)


def test_sign_test_against_the_binomial_by_hand():
    # 8 of 10 improved: P[X <= 2] = (1 + 10 + 45) / 1024, two-sided
    assert sign_test([-1.0] * 8 + [0.5] * 2) == pytest.approx(2 * 56 / 1024)
    assert sign_test([-1.0] * 8 + [0.5] * 2 + [0.0] * 5) == pytest.approx(2 * 56 / 1024)  # ties dropped
    assert sign_test([-1.0] * 5 + [1.0] * 5) == 1.0
    assert sign_test([0.0, 0.0]) == 1.0
    assert sign_test([-1.0] * 24) == pytest.approx(2 / 2**24)


def test_sign_test_is_calibrated_under_the_null():
    rng = np.random.default_rng(0)
    p = np.array([sign_test(rng.normal(size=20)) for _ in range(4000)])
    assert (p <= 0.05).mean() <= 0.05  # exact test: never above the nominal level
    assert (p <= 0.05).mean() >= 0.02  # and not far below it at n = 20 (0.041 exactly)


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    small, large = rng.normal(1.0, 1.0, 25), rng.normal(1.0, 1.0, 400)
    for values in (small, large):
        low, high = bootstrap_ci(values, n_boot=10_000)
        assert low < values.mean() < high
    assert math.isclose(
        (lambda lo_hi: lo_hi[1] - lo_hi[0])(bootstrap_ci(large, n_boot=10_000)) * 4,
        (lambda lo_hi: lo_hi[1] - lo_hi[0])(bootstrap_ci(small, n_boot=10_000)),
        rel_tol=0.35,
    )


def test_t_interval_by_hand_and_its_coverage_at_few_seeds():
    # 1, 2, 3, 4, 6: mean 3.2, s² = 3.7, t(0.975, 4) = 2.776445 (a printed t table)
    low, high = t_interval([1.0, 2.0, 3.0, 4.0, 6.0])
    half = 2.776445 * math.sqrt(3.7 / 5)
    assert (low, high) == pytest.approx((3.2 - half, 3.2 + half))
    assert all(math.isnan(x) for x in t_interval([1.0]))
    # at n = 3 the t interval keeps its 95 %; the percentile bootstrap of the same values covers far less
    rng = np.random.default_rng(2)
    samples = rng.normal(0.0, 1.0, size=(2000, 3))
    t_covers = np.mean([lo <= 0 <= hi for lo, hi in map(t_interval, samples)])
    boot_covers = np.mean([lo <= 0 <= hi for lo, hi in (bootstrap_ci(x, n_boot=400) for x in samples[:500])])
    assert 0.93 <= t_covers <= 0.97 and boot_covers < 0.8


def test_sign_test_is_quoted_only_where_it_can_reject():
    assert not sign_test_can_reject(5) and sign_test(-np.ones(5)) == pytest.approx(0.0625)
    assert sign_test_can_reject(6) and sign_test(-np.ones(6)) == pytest.approx(0.03125)
    few, many = paired_over_seeds([-0.2, -0.1, -0.3, -0.2, -0.25]), paired_over_seeds([-0.2] * 5 + [-0.1] * 5)
    assert few.sign_test_p is None and few.n == 5 and few.lower == 5 and few.verdict() == "lower"
    assert many.sign_test_p == pytest.approx(2 / 2**10) and (many.ci_low, many.ci_high) == pytest.approx(
        t_interval([-0.2] * 5 + [-0.1] * 5)
    )
    assert paired_over_seeds([0.1]).verdict() == "one seed"
    assert paired_over_seeds([0.1, -0.2, 0.15]).verdict() == "undecided"


def test_a_difference_picked_as_the_best_of_several_gets_bonferronis_interval_and_p():
    """Picked from K candidates on the same seeds: the t interval at 1 - 0.05 / K (wider), the sign test's
    p times K, quoted only where n lets it reach 0.05 / K (6 seeds reach 0.05, not 0.025)."""
    differences = [-0.2, -0.1, -0.3, -0.2, -0.25, -0.15]
    alone, of_three = paired_over_seeds(differences), paired_over_seeds(differences, picked_of=3)
    assert (of_three.ci_low, of_three.ci_high) == pytest.approx(t_interval(differences, 1 - 0.05 / 3))
    assert of_three.ci_low < alone.ci_low and of_three.ci_high > alone.ci_high and of_three.mean == alone.mean
    assert alone.sign_test_p == pytest.approx(2 / 2**6) and of_three.sign_test_p is None
    assert paired_over_seeds([-0.2] * 10, picked_of=3).sign_test_p == pytest.approx(3 * 2 / 2**10)
    # a wide enough spread decides at 95 % but not once the best of 20 was picked
    assert paired_over_seeds([-0.1, -0.3, -0.02, -0.2, -0.15]).verdict() == "lower"
    assert paired_over_seeds([-0.1, -0.3, -0.02, -0.2, -0.15], picked_of=20).verdict() == "undecided"


def test_compare_is_the_paired_comparison_by_hand():
    reference = np.array([3.0, 2.0, 4.0, 5.0, 1.0])
    arm = reference + np.array([-0.3, -0.1, 0.2, -0.4, -0.2])
    row = compare(arm, reference, n_boot=2000, seed=3)
    differences = arm - reference
    assert row["delta_nll"] == pytest.approx(differences.mean())
    assert (row["delta_nll_ci_low"], row["delta_nll_ci_high"]) == bootstrap_ci(differences, n_boot=2000, seed=3)
    assert row["base_nll"] == pytest.approx(3.0) and row["nll"] == pytest.approx(arm.mean())
    assert (row["n_users"], row["n_users_improved"], row["frac_users_improved"]) == (5, 4, 0.8)
    assert row["sign_test_p"] == pytest.approx(2 * (1 + 5) / 32)
    assert list(row) == COMPARISON_COLUMNS  # an empty table of comparisons has the same columns
    # paired: the users' spread in base NLL (1 to 5) does not widen the interval of the differences
    assert row["delta_nll_ci_high"] - row["delta_nll_ci_low"] < 0.5
    with pytest.raises(ValueError, match="one length"):
        compare(arm[:4], reference, n_boot=2000)


def cross_matrix(delta: np.ndarray) -> pd.DataFrame:
    """delta[u, v] = delta NLL of user u's theta on user v's text, as cross_user.csv rows."""
    users = [f"user{i}" for i in range(len(delta))]
    return pd.DataFrame(
        [{"theta_user": users[u], "text_user": users[v], "delta_nll": delta[u, v]} for u, v in np.ndindex(delta.shape)]
    )


def test_diagonal_dominance_ranks_and_permutation_p_by_enumeration():
    rng = np.random.default_rng(0)
    n = 5
    delta = rng.normal(size=(n, n)) - 0.8 * np.eye(n)
    stats = diagonal_dominance(cross_matrix(delta), n_perm=20_000)
    own_rank = [1 + (delta[:, v] < delta[v, v]).sum() for v in range(n)]  # 1 = best on text v
    assert stats["mean_rank"] == pytest.approx(np.mean(own_rank))
    assert stats["frac_own_best"] == pytest.approx(np.mean(np.equal(own_rank, 1)))
    assert (stats["mean_rank_chance"], stats["frac_own_best_chance"], stats["n_users"]) == (3.0, 0.2, 5)
    ranks = delta.argsort(axis=0).argsort(axis=0) + 1  # ranks[u, v]: rank of theta u on text v
    null = [np.mean([ranks[p[v], v] for v in range(n)]) for p in itertools.permutations(range(n))]
    exact = np.mean(np.array(null) <= np.mean(own_rank) + 1e-12)
    assert stats["mean_rank_p"] == pytest.approx(exact, abs=0.01)


def test_diagonal_dominance_on_planted_matrices():
    n = 8
    personal = diagonal_dominance(cross_matrix(np.ones((n, n)) - np.eye(n)), n_perm=2000)
    assert personal["mean_rank"] == 1.0 and personal["frac_own_best"] == 1.0
    assert personal["mean_rank_p"] == pytest.approx(1 / 2001)  # no other matching is as good (1 in 8!)
    worst = diagonal_dominance(cross_matrix(np.eye(n)), n_perm=2000)
    assert worst["mean_rank"] == 8.0 and worst["frac_own_best"] == 0.0 and worst["mean_rank_p"] == 1.0
    # one theta better than the rest on every text (more text, not personal): the own theta is at chance
    shared = diagonal_dominance(cross_matrix(np.tile(np.arange(n, dtype=float)[:, None], (1, n))), n_perm=2000)
    assert shared["mean_rank"] == 4.5 and shared["frac_own_best"] == 1 / 8 and shared["mean_rank_p"] == 1.0
    with pytest.raises(ValueError, match="every theta user"):
        diagonal_dominance(cross_matrix(np.eye(3)).iloc[1:])
