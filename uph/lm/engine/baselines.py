"""The unigram baselines a reviewer expects of a personal head, in the heads' three arms.

A unigram mixture moves the model's next-token distribution toward a unigram "cache":

    mix(lam; p_base, q)(y) = (1 - lam) p_base(y) + lam q(y)

    global     p_base = the model, q = the unigram of every user's train tokens pooled
    personal   p_base = the model, q = the user's own train unigram c(y) / n
    residual   p_base = the global mixture at its chosen lambda, q = the user's unigram (the personal
               cache beyond the pooled one)

lam is the arm's capacity knob, chosen on validation from fit.lambdas like the heads' radii
(uph.lm.engine.capacity), all three arms in fit_global (which holds every user's tokens). The residual arm's
mixture is also the base a head can be fitted on (`cache_mixture`: does a rank-d head add to a cache?).
Everything is in log space (logaddexp of log weights), so a p_model that underflows, or a token the
cache never saw, never gives -inf.

The full-vocabulary bias (uph.lm.engine.heads.full_bias_head) is another baseline: a free logit per
vocabulary entry, fitted by the engine like any head (the d = V limit of the unconditional heads). The
neural cache (uph.lm.engine.neural_cache) is the third: the same arms and mixture, with q the cache's
distribution over the next tokens of the stored hidden states nearest the position's own.
"""

from __future__ import annotations

import math

import torch

from uph.lm.engine.tokens import Mixture, Tokens

BASELINES = ("unigram", "full_bias", "neural_cache")  # config key fit.baselines
UNIGRAM = "unigram"
NEURAL_CACHE = "neural_cache"  # uph.lm.engine.neural_cache


def targets_of(tokens: Tokens) -> torch.Tensor:
    return torch.cat([chunk.targets for chunk in tokens.chunks]).cpu()


def hidden_of(tokens: Tokens) -> torch.Tensor:
    """The tokens' hidden states [n, H], on their device."""
    return torch.cat([chunk.hidden for chunk in tokens.chunks])


def model_log_probs(tokens: Tokens) -> torch.Tensor:
    """log p_model(y_t) of every token (float64)."""
    return -torch.cat([chunk.nll0 for chunk in tokens.chunks]).double().cpu()


def count(targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """c(y) [V] (float64) of token ids `targets`."""
    return torch.bincount(targets.long(), minlength=vocab_size).double()


def counts_of(tokens: Tokens, vocab_size: int) -> torch.Tensor:
    return count(targets_of(tokens), vocab_size)


def log_unigram(counts: torch.Tensor) -> torch.Tensor:
    """log c(y) / n [V] (-inf where c(y) = 0)."""
    return (counts / counts.sum()).log()


def mixture(lam: float, log_p_base: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """log((1 - lam) p_base + lam q) per token, from log probabilities (0 <= lam < 1)."""
    weights = (math.log1p(-lam), math.log(lam) if lam > 0 else -math.inf)
    return torch.logaddexp(weights[0] + log_p_base, weights[1] + log_q)


def arm_nll(arm: str, lam: float, log_p_model, log_pooled, log_user, lam_global: float | None = None) -> float:
    """Mean NLL of tokens under the unigram mixture of `arm` (module docstring) at `lam`, from per-token
    log probabilities: the model's, the pooled cache's and the user's cache's at the targets;
    `lam_global` is the global arm's chosen lambda (residual arm)."""
    if arm == "global":
        log_p = mixture(lam, log_p_model, log_pooled)
    elif arm == "personal":
        log_p = mixture(lam, log_p_model, log_user)
    else:
        log_p = mixture(lam, mixture(lam_global, log_p_model, log_pooled), log_user)
    return float(-log_p.mean())


def unigram_nll(arm: str, lam: float, tokens: Tokens, pooled, user, lam_global: float | None = None) -> float:
    """Mean NLL of `tokens` under the arm's mixture at `lam`; `pooled` and `user` are the caches' log
    unigrams [V]."""
    y = targets_of(tokens)
    return arm_nll(arm, lam, model_log_probs(tokens), pooled[y], user[y], lam_global)


def cache_mixture(pooled_counts, user_counts, lam_global: float, lam_residual: float) -> Mixture:
    """The residual arm's mixture as a base for a head (uph.lm.engine.tokens.Mixture): (1 - lam_r)((1 - lam_g)
    p_model + lam_g q_pooled) + lam_r q_user."""
    floor = (1 - lam_residual) * lam_global * pooled_counts / pooled_counts.sum()
    floor += lam_residual * user_counts / user_counts.sum()
    return Mixture((1 - lam_residual) * (1 - lam_global), floor)
