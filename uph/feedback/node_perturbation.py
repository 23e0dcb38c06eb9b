"""Node perturbation: a forward-only estimate of each example's loss gradient at the hidden outputs.

Every hidden output h_l (N x d_l) gets Gaussian noise sigma xi_l, xi_l ~ N(0, I), all layers at once
in one extra forward pass (the layers above read the perturbed outputs), and with the per-example
losses L_n of the clean pass and L~_n of the noisy one

    g_hat_l[n] = (L~_n - L_n) xi_l[n] / sigma.

Unbiased on a quadratic loss for any sigma: there L~ - L = sigma <g, xi> + sigma^2/2 xi^T H xi, with
xi stacking every layer's noise, so E[g_hat_l] = E[<g, xi> xi_l] + sigma/2 E[xi^T H xi xi_l] = g_l + 0
(the Gaussian's odd moments vanish; the other layers' terms <g_k, xi_k> are independent of xi_l).
On a smooth loss the bias is O(sigma^2). The price of perturbing all layers in one pass is variance:
each example's estimate projects the whole gradient (sum_l d_l numbers) on one random direction, so
Var g_hat_l[n, i] = |g[n]|^2 + g_l[n, i]^2 with |g[n]|^2 summed over every layer. The seed-003 update
averages it twice: over the batch in the cross-covariance G = g_hat^T c / N and over steps in ema_G.
Cost: one forward pass (no backward, no autograd) and one Gaussian draw per hidden unit and example.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def node_perturbation(
    noisy_losses: Callable[[list[torch.Tensor]], torch.Tensor],
    clean_losses: torch.Tensor,
    shapes: list[tuple[int, ...]],
    sigma: float,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """g_hat_l (one tensor of `shapes[l]` per layer) from the per-example losses (N,) of the clean pass
    and of `noisy_losses(noise)`, the pass with `noise[l]` added to layer l's output."""
    device = clean_losses.device
    xis = [torch.randn(shape, generator=generator).to(device) for shape in shapes]
    change = noisy_losses([sigma * xi for xi in xis]) - clean_losses
    return [change[:, None] * xi / sigma for xi in xis]
