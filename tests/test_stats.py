import math

import numpy as np
import pytest

from uph.stats import bootstrap_ci, sign_test


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
        low, high = bootstrap_ci(values)
        assert low < values.mean() < high
    assert math.isclose(
        (lambda lo_hi: lo_hi[1] - lo_hi[0])(bootstrap_ci(large)) * 4,
        (lambda lo_hi: lo_hi[1] - lo_hi[0])(bootstrap_ci(small)),
        rel_tol=0.35,
    )
