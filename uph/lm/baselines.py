"""The baselines a reviewer expects of a personal head, fitted on the user's train tokens only.

unigram (the cache-LM personalization baseline): p(y) = (1 - lam) p_model(y) + lam p_user(y), with
p_user the user's train unigram c(y) / n. lam minimizes the train NLL with leave-one-out counts,
p_user(y_t) = (c(y_t) - 1) / (n - 1), so a train token never predicts itself. The NLL of a mixture
is convex in lam, so golden-section search on [0, 1) finds the minimizer. Everything is in log
space (logaddexp of log weights), so a p_model that underflows never gives -inf.

full_bias (uph.lm.heads.full_bias_head): a free logit per vocabulary entry, fitted by the engine like
any head (the d = V limit of the unconditional heads).
"""

from __future__ import annotations

import math

import torch

from uph.lm.tokens import Tokens

BASELINES = ("unigram", "full_bias")  # config key fit.baselines
GOLDEN = (math.sqrt(5) - 1) / 2


def _targets(tokens: Tokens) -> torch.Tensor:
    return torch.cat([chunk.targets for chunk in tokens.chunks]).cpu()


def _model_log_probs(tokens: Tokens) -> torch.Tensor:
    return -torch.cat([chunk.nll0 for chunk in tokens.chunks]).double().cpu()


def mixture_nll(lam: float, log_p_model: torch.Tensor, log_p_user: torch.Tensor) -> float:
    """mean -log((1 - lam) p_model + lam p_user), from log probabilities."""
    log_weights = (math.log1p(-lam) if lam < 1 else -math.inf, math.log(lam) if lam > 0 else -math.inf)
    return float(-torch.logaddexp(log_weights[0] + log_p_model, log_weights[1] + log_p_user).mean())


def unigram_interpolation(train: Tokens, test: Tokens, vocab_size: int, tol: float = 1e-6) -> dict:
    """lam fitted on `train` (leave-one-out), then the held-out NLL of the interpolation on `test`."""
    targets = _targets(train)
    counts = torch.bincount(targets, minlength=vocab_size).double()
    n = len(targets)
    with torch.no_grad():
        log_p_loo = ((counts[targets] - 1) / max(n - 1, 1)).log()  # -inf for a token seen once
        log_p_model = _model_log_probs(train)
        low, high = 0.0, 1.0 - 1e-9
        while high - low > tol:  # golden-section search on the convex mixture NLL
            a, b = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
            if mixture_nll(a, log_p_model, log_p_loo) <= mixture_nll(b, log_p_model, log_p_loo):
                high = b
            else:
                low = a
        lam = (low + high) / 2
        log_p_user = (counts[_targets(test)] / n).log()
        return {
            "lambda": lam,
            "train_nll": mixture_nll(lam, log_p_model, log_p_loo),
            "nll": mixture_nll(lam, _model_log_probs(test), log_p_user),
        }
