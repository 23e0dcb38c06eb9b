"""Statistics the tables quote: bootstrap intervals of a mean and the exact sign test.

A paired comparison (two methods on the same users, or two runs with the same seeds) is reduced to
its per-unit differences first; `bootstrap_ci` of those differences is then the paired bootstrap
interval, and `sign_test` asks whether improvements and regressions are equally likely.
"""

from __future__ import annotations

import math

import numpy as np


def bootstrap_ci(values, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: resample the values with replacement n_boot times
    (a fixed RNG seed, so tables are reproducible)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def sign_test(differences) -> float:
    """Two-sided exact sign test of median 0: with k of the n non-zero differences negative,
    p = min(1, 2 P[Binomial(n, 1/2) <= min(k, n - k)]). Zeros are dropped; no non-zero value gives 1."""
    differences = np.asarray(differences, dtype=float)
    n = int((differences != 0).sum())
    k = min(int((differences < 0).sum()), int((differences > 0).sum()))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2 * tail)
