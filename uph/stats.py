"""Statistics the tables and the summary quote: intervals of a mean, the exact sign test, a paired
comparison's table columns (`compare`), a paired comparison over a few seeds (`paired_over_seeds`) and
the diagonal dominance of a cross-user matrix (`diagonal_dominance`).

A paired comparison (two methods on the same users, or two runs with the same seeds) is reduced to
its per-unit differences first. Over users (tens to hundreds) the interval of their mean is the
percentile bootstrap (`bootstrap_ci`); over seeds (3 to 10) it is Student-t (`t_interval`): a
bootstrap of n values only resamples the n values seen, so at small n its interval is too narrow.
`sign_test` asks whether improvements and regressions are equally likely; with n differences its
smallest p is 2^(1-n), so below 6 it cannot reject at 0.05 and is not quoted (`sign_test_can_reject`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SIGNIFICANCE = 0.05  # a test rejects below this p (the 95 % intervals exclude 0 at the same level)


def bootstrap_ci(values, n_boot: int, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: resample the values with replacement n_boot times
    (fit.bootstrap; a fixed RNG seed, so tables are reproducible)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of n values: mean ± t_(n-1, (1 + level) / 2) s / sqrt(n), s the
    sample standard deviation (n - 1 in its denominator). (nan, nan) for n < 2: one value has no spread."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    from scipy import stats  # here: the LM table jobs, which bootstrap over users, skip its 0.6 s import

    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


def welch_interval(a, b, level: float) -> tuple[float, float, float]:
    """(d, low, high): the difference of means d = mean(a) - mean(b) and Welch's interval at `level`
    (se^2 = s_a^2 / n_a + s_b^2 / n_b, Welch-Satterthwaite degrees of freedom); zero width where neither
    sample spreads. Needs two values on each side."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf((1 + level) / 2, df)) * se
    return d, d - half, d + half


def sign_test_can_reject(n: int, level: float = SIGNIFICANCE) -> bool:
    """Whether the two-sided exact sign test on n non-zero differences can give p < level: its smallest p,
    every difference of one sign, is 2 (1/2)^n, so at 0.05 it needs n >= 6 (5 seeds give at best 0.0625)."""
    return 2.0 ** (1 - n) < level


def sign_test(differences) -> float:
    """Two-sided exact sign test of median 0: with k of the n non-zero differences negative,
    p = min(1, 2 P[Binomial(n, 1/2) <= min(k, n - k)]). Zeros are dropped; no non-zero value gives 1."""
    differences = np.asarray(differences, dtype=float)
    n = int((differences != 0).sum())
    k = min(int((differences < 0).sum()), int((differences > 0).sum()))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2 * tail)


COMPARISON_COLUMNS = [  # compare's keys, in its order: the columns of a table of comparisons, rows or none
    "n_users",
    "base_nll",
    "nll",
    "delta_nll",
    "delta_nll_ci_low",
    "delta_nll_ci_high",
    "frac_users_improved",
    "n_users_improved",
    "sign_test_p",
]


def compare(arm, reference, n_boot: int, seed: int = 0) -> dict:
    """One table row's comparison of two fits on the same users: `arm` and `reference` hold each
    user's held-out NLL, in the same user order. With per-user differences delta_u = arm_u - reference_u
    (negative = the arm is better): delta_nll = mean_u delta_u with its paired bootstrap interval,
    users improved = #{u: delta_u < 0}, and the sign test of the delta_u."""
    arm, reference = np.asarray(arm, dtype=float), np.asarray(reference, dtype=float)
    if arm.ndim != 1 or arm.shape != reference.shape or len(arm) == 0:
        raise ValueError(
            f"compare needs two non-empty per-user arrays of one length, got {arm.shape} and {reference.shape}"
        )
    delta = arm - reference
    low, high = bootstrap_ci(delta, n_boot=n_boot, seed=seed)
    improved = int((delta < 0).sum())
    return {
        "n_users": len(delta),
        "base_nll": float(reference.mean()),
        "nll": float(arm.mean()),
        "delta_nll": float(delta.mean()),
        "delta_nll_ci_low": low,
        "delta_nll_ci_high": high,
        "frac_users_improved": improved / len(delta),
        "n_users_improved": improved,
        "sign_test_p": sign_test(delta),
    }


@dataclass(frozen=True)
class PairedDifference:
    """A method against a reference over the seeds both ran: the mean difference d_s = method_s -
    reference_s with its Student-t interval (t_interval), the seeds on which the method is lower, n, and
    the sign test's p where n lets it reject (else None)."""

    mean: float
    ci_low: float
    ci_high: float
    lower: int  # seeds on which the method's value is below the reference's
    n: int
    sign_test_p: float | None
    picked_of: int = 1  # the method was picked as the best of this many: interval and p are Bonferroni's

    def verdict(self) -> str:
        """'lower' when the whole interval (95 %, Bonferroni-widened where picked) is below 0, 'higher'
        when above, else 'undecided'; 'one seed' when there is no interval to speak of."""
        if self.n < 2:
            return "one seed"
        return "lower" if self.ci_high < 0 else "higher" if self.ci_low > 0 else "undecided"


def paired_over_seeds(differences, picked_of: int = 1) -> PairedDifference:
    """The PairedDifference of per-seed differences (method minus reference, one per seed). A method
    picked as the best of `picked_of` candidates on these same seeds gets Bonferroni's correction: its
    t interval at level 1 - 0.05 / picked_of, its sign test's p times picked_of (quoted only where n
    lets it reach 0.05 / picked_of)."""
    differences = np.asarray(differences, dtype=float)
    low, high = t_interval(differences, 1 - SIGNIFICANCE / picked_of)
    n = len(differences)
    return PairedDifference(
        float(differences.mean()),
        low,
        high,
        int((differences < 0).sum()),
        n,
        min(1.0, picked_of * sign_test(differences)) if sign_test_can_reject(n, SIGNIFICANCE / picked_of) else None,
        picked_of,
    )


def p_text(p: float, floor: float = 0.0) -> str:
    """'p = 0.0006', or 'p ≤ 1e-4' where p is at its test's `floor` (a permutation test's 1 / (1 + n_perm)),
    which bounds p rather than measuring it."""
    return f"p ≤ {floor:.0e}".replace("e-0", "e-") if p <= floor else f"p = {p:.2g}"


def diagonal_dominance(cross, n_perm: int = 10_000, seed: int = 0) -> dict:
    """Is a user's own theta better on its own text than the other users' thetas? `cross` holds one
    sweep point's matrix: columns theta_user, text_user, delta_nll, every theta user scored on every
    text user's text, the N theta users being the N text users.

    Per text v, rank_v = the rank of the own theta (theta_user == v) among the N thetas by delta_nll,
    1 = best (ties get their average rank). Reported: mean_rank = mean_v rank_v against its chance value
    (N + 1) / 2, frac_own_best = #{v: rank_v = 1} / N against chance 1 / N, and mean_rank_p, a one-sided
    permutation p-value: with no personal signal the thetas are exchangeable, so matching text v to the
    theta of user pi(v) for a random permutation pi is as likely as the own matching, and
    p = (1 + #{pi: mean_v rank of theta pi(v) on text v <= mean_rank}) / (1 + n_perm) over n_perm seeded
    random permutations. (Permuting whole thetas keeps what the N columns share: a theta that is good
    on every text can be the best of only one column under the null too.)"""
    matrix = cross.pivot(index="theta_user", columns="text_user", values="delta_nll")
    users = sorted(matrix.index)
    if sorted(matrix.columns) != users or matrix.isna().to_numpy().any():
        raise ValueError("diagonal_dominance needs every theta user scored on every text user's text, the same users")
    ranks = matrix.loc[users, users].rank(axis=0, method="average").to_numpy()  # per text (column), 1 = best
    n = len(users)
    own = np.diag(ranks)
    rng = np.random.default_rng(seed)
    matchings = rng.permuted(np.tile(np.arange(n), (n_perm, 1)), axis=1)  # row k: text v gets theta matchings[k, v]
    null = ranks[matchings, np.arange(n)].mean(axis=1)
    return {
        "n_users": n,
        "mean_rank": float(own.mean()),
        "mean_rank_chance": (n + 1) / 2,
        "mean_rank_p": float((1 + (null <= own.mean() + 1e-12).sum()) / (1 + n_perm)),
        "mean_rank_p_floor": 1 / (1 + n_perm),  # the smallest p n_perm permutations can give
        "frac_own_best": float((own == 1).mean()),
        "frac_own_best_chance": 1 / n,
    }
