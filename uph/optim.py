"""Adam and gradient-norm clipping as torch computes them, written out for the few tensors of the fit's
adam solver (uph.lm.engine.solvers) and the feedback branch's character MLP (uph.feedback.training): the first
call into torch.optim imports torch._dynamo, a cost every such job would pay (its seconds: docs/performance.md,
"Aggregate, report and DAG build").

    m <- m + (1 - b1)(g - m)        v <- b2 v + (1 - b2) g²
    p <- p - lr / (1 - b1^t) · m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    clipping: g <- g · min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the norm of all of the tensors at once

Each in torch's operations and order (torch.optim.Adam's single-tensor path and clip_grad_norm_), so the
values are theirs bit for bit (tests/test_optim.py).
"""

from __future__ import annotations

import torch


class Adam:
    """torch.optim.Adam with its defaults (no weight decay, no amsgrad) over `params`, stepped with the
    gradients handed to `step` rather than read from `.grad`."""

    def __init__(
        self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        (b1, b2), self.t = self.betas, self.t + 1
        step_size, correction2_sqrt = self.lr / (1 - b1**self.t), (1 - b2**self.t) ** 0.5
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v.sqrt() / correction2_sqrt).add_(self.eps), value=-step_size)


@torch.no_grad()
def clip_grad_norm_(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale `grads` in place to a total norm of at most `max_norm`; returns the norm before."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coefficient = (max_norm / (total + 1e-6)).clamp_(max=1.0)
    for g in grads:
        g.mul_(coefficient)
    return total
