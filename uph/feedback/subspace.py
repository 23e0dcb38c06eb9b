"""Factored feedback subspace (seed 003): a fixed compressor C and a learned Stiefel expander per layer.

The output error e_L (V numbers per example) is compressed once, c = e_L C^T, with C (r x V)
row-orthonormal (C C^T = I_r; r is clipped to V), and sent to hidden layer l as

    delta_l = alpha_l * c U_l^T,        U_l in St(d_l, r) (U_l^T U_l = I_r), alpha_l > 0.

`update` moves U_l and alpha_l towards an alignment signal g_hat (d_l per example), in this order:

    G      = g_hat^T c / N                               cross-covariance of this batch (d x r)
    ema_G <- tau ema_G + (1 - tau) G
    Delta  = ema_G - U sym(U^T ema_G)                    tangent projection, U^T Delta + Delta^T U = 0
    Delta <- Delta * max_step_frob / (|Delta|_F + eps)   when |Delta|_F > max_step_frob
    U     <- qr(U + eta_B alpha Delta).Q, columns signed so that diag(R) > 0   (retraction)
    alpha* = clamp(<U, G> / (mean_n |c_n|^2 + eps), alpha_min, alpha_max)    with the new U
    alpha <- (1 - beta_alpha) alpha + beta_alpha alpha*
    rho    = <G, U> / (|G|_F sqrt(r) + eps)

If g_hat = a c U*^T and c is white, then G = a U* Cov(c), the ascent of <U, ema_G> drives U to U* and
alpha* to a. Which g_hat trains U is the caller's choice (uph.feedback.training: node perturbation,
backprop-free, or the true gradient as an oracle); the seed calls it a local proxy signal.

Adaptation to this project: the seed's (B, T, .) tensors are (N, .) here (one row per example of
an MLP over a context window; the seed flattens B*T to N anyway). The seed's `frozen` mode (only
ema_G moves) is left out: the frozen-U ablation never reads ema_G, so it makes no update call and
needs no g_hat. The diagnostics are alpha_star, alpha, rho and the tangent norm (the seed's
Delta_frob). Random draws (C first, then each U_l) come from an explicit generator. r may not
exceed any d_l (St(d, r) is empty then); the seed does not check. The step sizes and bounds have no
defaults here: they live in schemas/feedback.schema.yaml (eps is a constant, not a setting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from uph.errors import ConfigError

EPS = 1e-8  # the seed's eps, in the step clipping and the alpha target's denominator


@dataclass(frozen=True)
class UpdateConfig:
    """Step sizes and bounds of `FeedbackLayer.update` (the config section `feedback.update`)."""

    eta_B: float
    tau: float
    beta_alpha: float
    alpha_min: float
    alpha_max: float
    max_step_frob: float | None


def random_stiefel(rows: int, cols: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A (rows x cols) matrix with orthonormal columns: the Q factor of a Gaussian matrix."""
    return torch.linalg.qr(torch.randn(rows, cols, generator=generator), mode="reduced")[0]


def tangent_projection(U: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """G - U sym(U^T G): the part of G tangent to the Stiefel manifold at U."""
    UtG = U.T @ G
    return G - U @ (0.5 * (UtG + UtG.T))


def qr_retraction(X: torch.Tensor) -> torch.Tensor:
    """The Q factor of X with each column's sign chosen so that diag(R) >= 0 (a unique retraction)."""
    Q, R = torch.linalg.qr(X, mode="reduced")
    signs = torch.sign(torch.diagonal(R))
    return Q * torch.where(signs == 0, torch.ones_like(signs), signs)


class FeedbackLayer:
    """One hidden layer's expander U (d x r), gain alpha and the EMA ema_G of the cross-covariance."""

    def __init__(self, d: int, r: int, generator: torch.Generator | None = None):
        self.U = random_stiefel(d, r, generator)
        self.alpha = torch.tensor(0.1)
        self.ema_G = torch.zeros(d, r)

    def to(self, device: torch.device) -> FeedbackLayer:
        self.U, self.alpha, self.ema_G = self.U.to(device), self.alpha.to(device), self.ema_G.to(device)
        return self

    def compute_delta(self, c: torch.Tensor) -> torch.Tensor:
        """c (N, r) -> delta = alpha c U^T (N, d)."""
        return self.alpha * (c @ self.U.T)

    @torch.no_grad()
    def update(self, g_hat: torch.Tensor, c: torch.Tensor, config: UpdateConfig) -> dict[str, float]:
        """One step of the module docstring's update from g_hat (N, d) and c (N, r); returns
        the diagnostics alpha_star, alpha, rho and tangent_norm (|Delta|_F before clipping)."""
        n, r = c.shape
        G = g_hat.T @ c / max(n, 1)
        self.ema_G.mul_(config.tau).add_(G, alpha=1.0 - config.tau)
        Delta = tangent_projection(self.U, self.ema_G)
        tangent_norm = torch.linalg.norm(Delta)
        if config.max_step_frob is not None and tangent_norm > config.max_step_frob:
            Delta = Delta * (config.max_step_frob / (tangent_norm + EPS))
        self.U = qr_retraction(self.U + (config.eta_B * self.alpha) * Delta)
        mean_c2 = c.square().sum() / max(n, 1)
        alignment = (self.U * G).sum()
        alpha_star = (alignment / (mean_c2 + EPS)).clamp(config.alpha_min, config.alpha_max)
        self.alpha.mul_(1.0 - config.beta_alpha).add_(alpha_star, alpha=config.beta_alpha)
        rho = alignment / (torch.linalg.norm(G) * r**0.5 + EPS)
        return {
            "alpha_star": alpha_star.item(),
            "alpha": self.alpha.item(),
            "rho": rho.item(),
            "tangent_norm": tangent_norm.item(),
        }


class FeedbackSystem:
    """The compressor C (r x V, C C^T = I_r, r = min(rank, V)) shared by one FeedbackLayer per hidden layer."""

    def __init__(
        self, vocab_size: int, layer_dims: list[int], rank: int = 128, generator: torch.Generator | None = None
    ):
        self.rank = min(rank, vocab_size)
        if self.rank > min(layer_dims):
            raise ConfigError(
                f"config key 'feedback.rank': {self.rank} (clipped to the vocabulary of "
                f"{vocab_size}) exceeds the narrowest hidden layer, {min(layer_dims)}; "
                f"U_l in St(d_l, r) needs r <= d_l"
            )
        self.C = random_stiefel(vocab_size, self.rank, generator).T.contiguous()
        self.layers = [FeedbackLayer(d, self.rank, generator) for d in layer_dims]

    def to(self, device: torch.device) -> FeedbackSystem:
        self.C = self.C.to(device)
        self.layers = [layer.to(device) for layer in self.layers]
        return self

    def compress_error(self, e_L: torch.Tensor) -> torch.Tensor:
        """e_L (N, V) -> c = e_L C^T (N, r)."""
        return e_L @ self.C.T

    def compute_deltas(self, c: torch.Tensor) -> list[torch.Tensor]:
        return [layer.compute_delta(c) for layer in self.layers]

    def update_all(self, g_hats: list[torch.Tensor], c: torch.Tensor, config: UpdateConfig) -> list[dict[str, float]]:
        return [layer.update(g_hat, c, config) for layer, g_hat in zip(self.layers, g_hats)]
