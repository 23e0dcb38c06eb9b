"""Heads: seed semantics (bases, scalings, generators) and the rank-d logit correction the fitting
engine uses, which must equal applying the head to h and then the lm_head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import final_hidden, tiny_llama

from uph.errors import ConfigError
from uph.lm.engine.heads import HEADS, HeadSettings, make_head

D, ALPHA, GAMMA = 8, 0.3, 0.5
HEAD_SETTINGS = HeadSettings.defaults()  # the schema's basis_seed, gamma and basis


@pytest.fixture(scope="session")
def lm(tmp_path_factory):
    """(h [n, H], W, b, (U, S, Vh)) in float64 from a tiny real Llama; b is an added random bias."""
    model = tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    h = final_hidden(model, ids).reshape(-1, model.config.hidden_size)
    W = model.get_output_embeddings().weight.detach()
    b = 0.1 * torch.randn(W.shape[0], dtype=W.dtype, generator=torch.Generator().manual_seed(2))
    return h, W, b, torch.linalg.svd(W, full_matrices=False)


def theta_of(seed: int = 3) -> torch.Tensor:
    return torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, basis", [(name, "svd") for name in HEADS] + [("lm_head_update", "random")])
def test_logit_correction_equals_head_then_lm_head(lm, name, basis):
    h, W, b, svd = lm
    head = make_head(
        name, W, d=D, alpha=ALPHA, settings=HeadSettings.defaults(gamma=GAMMA, basis=basis), svd=svd, bias=b
    )
    theta = theta_of()
    through_model = head.logits(h, theta) - F.linear(h, W, b)
    assert through_model.abs().max() > 1e-3
    scale = through_model.abs().max()
    torch.testing.assert_close(head.correction(h, theta), through_model, rtol=1e-5, atol=1e-5 * scale)
    assert head.correction(h, torch.zeros(D, dtype=h.dtype)).abs().max() == 0


def test_cvh_and_uncond_follow_seed_000(lm):
    h, W, b, _ = lm
    H, theta = W.shape[1], theta_of()
    generator = torch.Generator().manual_seed(42)
    A = torch.randn(D, H, generator=generator) / H**0.5
    B = torch.randn(H, D, generator=generator) / D**0.5
    U = torch.randn(H, D, generator=torch.Generator().manual_seed(1042)) / D**0.5
    A, B, U = A.double(), B.double(), U.double()
    cvh = make_head("cvh", W, d=D, alpha=ALPHA, settings=HeadSettings.defaults(basis_seed=42))
    uncond = make_head("uncond", W, d=D, alpha=ALPHA, settings=HeadSettings.defaults(basis_seed=42))
    torch.testing.assert_close(cvh.apply_hidden(h, theta), h + ALPHA * (B @ (theta[:, None] * (A @ h.T))).T)
    torch.testing.assert_close(uncond.apply_hidden(h, theta), h + ALPHA * (U @ theta))
    assert cvh.conditional and not uncond.conditional


def test_svd_heads_follow_seed_001_and_lm_head_update_seed_002(lm):
    h, W, b, (U, S, Vh) = lm
    theta, Vd = theta_of(), Vh[:D]
    svd_cvh = make_head("svd_cvh", W, d=D, alpha=ALPHA, settings=HEAD_SETTINGS, svd=(U, S, Vh))
    svd_uncond = make_head("svd_uncond", W, d=D, alpha=ALPHA, settings=HEAD_SETTINGS, svd=(U, S, Vh))
    torch.testing.assert_close(svd_cvh.apply_hidden(h, theta), h + ALPHA * (Vd.T @ (theta[:, None] * (Vd @ h.T))).T)
    torch.testing.assert_close(svd_uncond.apply_hidden(h, theta), h + ALPHA * Vd.T @ theta)
    # seed 002: W'_u = W + gamma alpha C diag(theta) A, with the SVD basis C = U_d S_d, A = V_d^T
    update = make_head(
        "lm_head_update", W, d=D, alpha=ALPHA, settings=HeadSettings.defaults(gamma=GAMMA), svd=(U, S, Vh), bias=b
    )
    W_user = W + GAMMA * ALPHA * (U[:, :D] * S[:D]) @ torch.diag(theta) @ Vd
    torch.testing.assert_close(update.apply_hidden(h, theta), h @ W_user.T + b)
    # ... which makes it SVD-CVH with alpha -> gamma alpha: both rescale the top singular values
    same = make_head("svd_cvh", W, d=D, alpha=GAMMA * ALPHA, settings=HEAD_SETTINGS, svd=(U, S, Vh))
    torch.testing.assert_close(update.correction(h, theta), same.correction(h, theta))


def test_lm_head_update_random_basis_draws_a_then_c(lm):
    h, W, b, _ = lm
    (V, H), theta = W.shape, theta_of()
    generator = torch.Generator().manual_seed(7)
    A = (torch.randn(D, H, generator=generator) / H**0.5).double()
    C = (torch.randn(V, D, generator=generator) / D**0.5).double()
    head = make_head(
        "lm_head_update", W, d=D, alpha=ALPHA, settings=HeadSettings.defaults(gamma=GAMMA, basis="random", basis_seed=7)
    )
    torch.testing.assert_close(head.apply_hidden(h, theta), h @ (W + GAMMA * ALPHA * C @ torch.diag(theta) @ A).T)


def test_bad_head_configurations_name_the_key(lm):
    h, W, b, svd = lm
    with pytest.raises(ConfigError, match=r"'fit\.heads'.*unknown head 'lora'"):
        make_head("lora", W, d=D, alpha=0.1, settings=HEAD_SETTINGS, svd=svd)
    with pytest.raises(ConfigError, match=r"'fit\.lm_head_update\.basis'.*'pca'"):
        make_head("lm_head_update", W, d=D, alpha=0.1, settings=HeadSettings.defaults(basis="pca"), svd=svd)
    with pytest.raises(ConfigError, match=r"'fit\.ds'.*needs the top 8 singular triplets.*no SVD basis"):
        make_head("svd_cvh", W, d=D, alpha=0.1, settings=HEAD_SETTINGS, svd=None)
    U, S, Vh = svd
    with pytest.raises(ConfigError, match=r"'fit\.ds'.*got an SVD basis of 4 triplets"):
        make_head("svd_uncond", W, d=D, alpha=0.1, settings=HEAD_SETTINGS, svd=(U[:, :4], S[:4], Vh[:4]))
    with pytest.raises(ConfigError, match=r"'fit\.ds'"):
        make_head("cvh", W, d=0, alpha=0.1, settings=HEAD_SETTINGS)
