"""Held-out evaluation: the NLL of any theta on a user's held-out tokens, from the fit engine.

`HeldOut(tokens, head)` prepares the engine's `Objective` with beta = lam = 0 once; each call then
costs one pass over the tokens: nll(theta) = mean CE of the base logits plus the head's correction,
and kl(theta) = mean KL(p0 ‖ p_theta). theta = 0 is the frozen model (`base_nll`); the global
control is its theta, a personal fit on top of it is the sum of the two (u is linear in theta).
"""

from __future__ import annotations

import torch

from uph.lm.fit import Objective
from uph.lm.heads import Head
from uph.lm.tokens import Tokens


class HeldOut:
    """NLL and KL(p0 ‖ p) of thetas on one user's held-out tokens under one head."""

    def __init__(self, tokens: Tokens, head: Head):
        self.objective = Objective(tokens, head, beta=0.0, lam=0.0)
        self.base_nll = self.objective.base_nll

    def __call__(self, theta: torch.Tensor) -> dict:
        value = self.objective(theta, need_grad=False)
        return {"nll": value.ce, "kl": value.kl}
