"""A user's tokens split in time, torch-free (the DAG build checks the config with it).

Train and test: the first `train_fraction` of a user's tokens train, then a gap of `gap` tokens
(extract.context: a window's worth) is skipped, the rest is held out, so no training window ever holds
a held-out target. Fit and validation inside train (uph.lm.engine.capacity): the last ceil(fraction n) train
tokens validate, after the same gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """Token index ranges of a user's temporal split: train [0, train_end), test [test_start, n)."""

    train_end: int
    test_start: int
    n_tokens: int


def temporal_split(n_tokens: int, train_fraction: float, gap: int) -> Split:
    train_end = int(n_tokens * train_fraction)
    return Split(train_end, min(train_end + gap, n_tokens), n_tokens)


def split_lengths(n: int, fraction: float, gap: int) -> tuple[int, int]:
    """(end of the fit part, start of the validation part) of n train tokens (uph.lm.engine.tokens.validation_split)."""
    start = n - math.ceil(fraction * n)
    if start - gap < 1:
        raise ValueError(f"{n} train tokens leave no fit part before a gap of {gap} and {n - start} validation tokens")
    return start - gap, start
