"""What the fit stage chooses by: a method's sweep point, and the capacity table's choices (torch-free: the
capacity and headline jobs read tables only)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from uph.lm.engine.capacity import KNOBS, choose, chosen

CHOICE_KEYS = ["head", "alpha", "d", "solver", "arm", "train_tokens"]  # one capacity choice each
ALL_TOKENS = float("nan")  # train_tokens of a choice for all of each user's train tokens


@dataclass(frozen=True)
class Point:
    head: str
    alpha: float
    d: int

    @classmethod
    def of(cls, head: str, alpha, d) -> Point:
        return cls(head, float(alpha), int(d))

    @property
    def columns(self) -> dict:
        return {"head": self.head, "alpha": self.alpha, "d": self.d}

    @property
    def label(self) -> str:
        return f"head={self.head} alpha={self.alpha:g} d={self.d}"


def choice_columns(point: Point, solver: str, arm: str, train_tokens=ALL_TOKENS) -> dict:
    """The columns that name one choice of the capacity table: the point's, the solver, the arm, the train tokens."""
    return {**point.columns, "solver": solver, "arm": arm, "train_tokens": train_tokens}


def capacity_choices(validation: pd.DataFrame) -> pd.DataFrame:
    """Every (method, arm, train_tokens)'s choice from the validation rows of every job (uph.lm.engine.capacity)."""
    return choose(validation, CHOICE_KEYS, KNOBS)


def chosen_radius(choices: pd.DataFrame, point: Point, solver: str, arm: str, train_tokens=ALL_TOKENS) -> float:
    """The radius the capacity table chose for one point, solver, arm and train tokens."""
    return chosen(choices, "capacity", **choice_columns(point, solver, arm, train_tokens))
