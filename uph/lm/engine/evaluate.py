"""Held-out evaluation: the NLL of any theta on a user's held-out tokens, from the fit engine.

`HeldOut(tokens, head)` prepares the engine's `Objective` with beta = lam = 0 once; each call then
costs one pass over the tokens: nll(theta) = mean CE of the base logits plus the head's correction,
and kl(theta) = mean KL(p0 ‖ p_theta). theta = 0 is the frozen model (`base_nll`); the global
control is its theta, a personal fit on top of it is the sum of the two (u is linear in theta).
"""

from __future__ import annotations

import torch

from uph.lm.engine.heads import Head
from uph.lm.engine.objective import Objective
from uph.lm.engine.tokens import Tokens


class HeldOut:
    """NLL and KL(p0 ‖ p) of thetas on one user's held-out tokens under one head."""

    def __init__(self, tokens: Tokens, head: Head):
        self.objective = Objective(tokens, head, beta=0.0, lam=0.0)
        self.base_nll = self.objective.base_nll

    def __call__(self, theta: torch.Tensor) -> dict:
        value = self.objective(theta, need_grad=False)
        return _scores(value.ce, value.kl)

    def many(self, thetas: torch.Tensor) -> list[dict]:
        """The same for K thetas [K, d]. An unconditional head scores them all in one pass over the tokens
        (Objective.log_partition_sums): nll_k = base_nll + (Σ_t log Z_t(theta_k) - Σ_t log Z_t(0)) / n -
        theta_k · ybar, kl_k the same change less theta_k · mbar; a conditional head, and a theta the
        batched pass cannot hold, one at a time. Each distinct theta is scored once (a path's balls past its
        unconstrained minimizer share one): a repeated theta takes its first one's score, where the batched
        pass's product gives each of its columns its own rounding, which would decide a capacity choice along
        such a plateau (uph.lm.engine.capacity.TIE) by rounding alone."""
        objective, thetas = self.objective, thetas.detach().double().cpu()
        distinct, index = torch.unique(thetas, dim=0, return_inverse=True)
        if objective.a is not None:
            scores = [self(theta) for theta in distinct]
            return [scores[i] for i in index]
        sums, safe = objective.log_partition_sums(thetas)
        base = float(sum(log_z.sum(dtype=torch.float64) for log_z in objective.log_z_base))  # one read back
        change = (sums - base) / objective.tokens.n
        # each distinct theta's first place among the thetas
        first = torch.full((len(distinct),), len(thetas)).scatter_reduce_(0, index, torch.arange(len(thetas)), "amin")
        scores = [
            _scores(*objective.ce_kl(thetas[k], change[k])) if safe[k] else self(thetas[k]) for k in first.tolist()
        ]
        return [scores[i] for i in index]


def _scores(ce, kl) -> dict:
    return {"nll": float(ce), "kl": float(kl)}
