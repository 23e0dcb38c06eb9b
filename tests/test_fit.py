"""The theta-fitting engine: objective and gradient parity with autograd on the seed's own
computation, the seed solver against seed 002 written out, the exact solver's certificate, a
planted user recovered, NaN handling, pooled tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import final_hidden, sample_text, tiny_llama, user_split

from uph.errors import ConfigError, FitDivergedError
from uph.lm.fit import Objective, fit_theta, pool, prepare, projected_gradient_norm
from uph.lm.heads import HEADS, make_head

D = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def lm(model):
    """(h [n, H], targets [n], W, b, svd) in float64; n = 300 is no multiple of the chunks used."""
    ids = torch.randint(0, model.config.vocab_size, (5, 61), generator=torch.Generator().manual_seed(1))
    h = final_hidden(model, ids[:, :-1]).reshape(-1, model.config.hidden_size)
    W = model.get_output_embeddings().weight.detach()
    b = 0.1 * torch.randn(W.shape[0], dtype=W.dtype, generator=torch.Generator().manual_seed(2))
    return h, ids[:, 1:].reshape(-1), W, b, torch.linalg.svd(W, full_matrices=False)


def seed_objective(head, h, y, W, b, theta, beta, lam):
    """Seed 002's loss computed the seed's way: the head, then the lm_head, then CE and KL."""
    logits = head.logits(h, theta)
    kl = F.kl_div(F.log_softmax(logits, dim=-1), F.softmax(F.linear(h, W, b), dim=-1), reduction="batchmean")
    ce = F.cross_entropy(logits, y)
    return ce + beta * kl + lam * theta.square().sum(), ce, kl


@pytest.mark.parametrize("name", HEADS)
def test_objective_and_gradient_match_autograd(lm, name):
    h, y, W, b, svd = lm
    # chunks of 64 tokens; the cache holds two of them, the rest are recomputed on use
    tokens = prepare(h, y, W, b, chunk=64, cache_bytes=2 * 64 * W.shape[0] * 8)
    assert [c.p0 is not None for c in tokens.chunks] == [True, True, False, False, False]
    head = make_head(name, W, svd=svd, d=D, alpha=0.5, bias=b)
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    expected, ce, kl = seed_objective(head, h, y, W, b, theta, beta=0.05, lam=1e-3)
    expected.backward()
    expected, ce, kl = float(expected.detach()), float(ce.detach()), float(kl.detach())
    value = Objective(tokens, head, beta=0.05, lam=1e-3)(theta.detach())
    assert value.objective == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert (value.ce, value.kl) == pytest.approx((ce, kl), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(value.grad, theta.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["lm_head_update", "uncond"])
def test_curvature_is_the_hessian_diagonal_at_zero(lm, name):
    h, y, W, b, svd = lm
    head = make_head(name, W, svd=svd, d=D, alpha=0.5, bias=b)
    hessian = torch.autograd.functional.hessian(
        lambda theta: seed_objective(head, h, y, W, b, theta, beta=0.05, lam=1e-3)[0], torch.zeros(D, dtype=W.dtype)
    )
    curvature = Objective(prepare(h, y, W, b, chunk=64), head, beta=0.05, lam=1e-3).curvature()
    torch.testing.assert_close(curvature, hessian.diagonal(), rtol=1e-9, atol=1e-12)


def test_kl_is_zero_and_nll_is_base_at_theta_zero(lm):
    h, y, W, b, svd = lm
    tokens = prepare(h, y, W, b, chunk=64)
    assert tokens.base_nll == pytest.approx(float(F.cross_entropy(F.linear(h, W, b), y)), rel=1e-12)
    for name in ("cvh", "svd_uncond"):
        value = Objective(tokens, make_head(name, W, svd=svd, d=D, alpha=0.5, bias=b))(torch.zeros(D))
        assert value.kl == 0.0 and value.ce == tokens.base_nll and value.objective == tokens.base_nll


def test_float32_engine_on_bfloat16_states_matches_float64(lm):
    h, y, W, b, svd = lm
    h = h.to(torch.bfloat16)
    head64 = make_head("svd_cvh", W, svd=svd, d=D, alpha=0.5, bias=b)
    head32 = make_head("svd_cvh", W.float(), svd=tuple(t.float() for t in svd), d=D, alpha=0.5, bias=b.float())
    theta = torch.randn(D, generator=torch.Generator().manual_seed(3))
    exact = Objective(prepare(h, y, W, b), head64)(theta.double())
    fast = Objective(prepare(h, y, W.float(), b.float()), head32)(theta)
    assert fast.objective == pytest.approx(exact.objective, abs=1e-5)
    torch.testing.assert_close(fast.grad, exact.grad, rtol=1e-4, atol=1e-5)


def test_float32_engine_survives_logit_changes_beyond_exp_range(lm):
    h, y, W, b, svd = lm
    head64 = make_head("cvh", W, d=D, alpha=300.0, bias=b)
    head32 = make_head("cvh", W.float(), d=D, alpha=300.0, bias=b.float())
    theta = 5 * F.normalize(torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), dim=0)
    assert head64.correction(h, theta).abs().max() > 200  # exp(200) overflows float32
    exact = Objective(prepare(h, y, W, b), head64)(theta)
    fast = Objective(prepare(h.float(), y, W.float(), b.float()), head32)(theta.float())
    assert fast.objective == pytest.approx(exact.objective, rel=1e-5)
    torch.testing.assert_close(fast.grad, exact.grad, rtol=1e-4, atol=1e-4)


def seed_002_written_out(h, y, W, b, head, d, lr=0.05, steps=30, beta=0.05, lam=1e-4, max_norm=5.0):
    """Seed 002's loop as written: chunks of 16, autograd, Adam, clipping, ball projection."""
    theta = torch.zeros(d, dtype=h.dtype, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        for start in range(0, len(y), 16):
            hc, yc = h[start : start + 16], y[start : start + 16]
            base = F.linear(hc, W, b)
            logits = base + head.correction(hc, theta)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), F.softmax(base.detach(), dim=-1), reduction="sum")
            ((F.cross_entropy(logits, yc, reduction="sum") + beta * kl) / len(y)).backward()
        (lam * theta.square().sum()).backward()
        torch.nn.utils.clip_grad_norm_([theta], max_norm=max_norm)
        optimizer.step()
        with torch.no_grad():
            if theta.norm() > max_norm:
                theta.mul_(max_norm / theta.norm())
    return theta.detach()


@pytest.mark.parametrize("name, max_norm", [("lm_head_update", 5.0), ("svd_uncond", 5.0), ("cvh", 0.2)])
def test_seed_solver_reproduces_seed_002(lm, name, max_norm):
    h, y, W, b, svd = lm
    head = make_head(name, W, svd=svd, d=D, alpha=2.0, bias=b)
    expected = seed_002_written_out(h, y, W, b, head, D, max_norm=max_norm)
    theta, result = fit_theta(prepare(h, y, W, b), head, solver="seed", max_norm=max_norm)
    torch.testing.assert_close(theta, expected, rtol=1e-8, atol=1e-10)
    assert (result.iterations, result.evaluations) == (30, 31)


@pytest.mark.parametrize("name, max_norm", [("svd_cvh", 5.0), ("uncond", 5.0), ("cvh", 0.2)])
def test_exact_solver_certifies_an_optimum_no_worse_than_seed(lm, name, max_norm):
    h, y, W, b, svd = lm
    tokens = prepare(h, y, W, b)
    head = make_head(name, W, svd=svd, d=D, alpha=2.0, bias=b)
    theta_seed, seed = fit_theta(tokens, head, solver="seed", max_norm=max_norm)
    theta, exact = fit_theta(tokens, head, solver="exact", max_norm=max_norm, tol=1e-7)
    assert exact.objective <= seed.objective and exact.certificate <= 1e-7 < seed.certificate
    assert exact.theta_norm <= max_norm * (1 + 1e-12)
    # unique optimum: the exact solver warm-started at the seed's theta lands on the same point
    again, _ = fit_theta(tokens, head, solver="exact", max_norm=max_norm, tol=1e-7, theta0=theta_seed)
    torch.testing.assert_close(again, theta, rtol=0, atol=1e-4)
    if max_norm < 1:  # the ball binds: KKT says the gradient points straight back inside
        grad = Objective(tokens, head)(theta).grad
        assert exact.theta_norm == pytest.approx(max_norm)
        assert float(F.cosine_similarity(grad, -theta, dim=0)) > 1 - 1e-9


def test_projected_gradient_norm_drops_only_the_blocked_part():
    theta, radius = torch.tensor([3.0, 4.0], dtype=torch.float64), 5.0

    def grad(*g):
        return torch.tensor(g, dtype=torch.float64)

    assert projected_gradient_norm(theta, grad(-0.6, -0.8), radius) == pytest.approx(0)  # pushes out: blocked
    assert projected_gradient_norm(theta, grad(0.6, 0.8), radius) == pytest.approx(1)  # pulls in
    assert projected_gradient_norm(theta, grad(-4.0, 3.0), radius) == pytest.approx(5)  # along the sphere
    assert projected_gradient_norm(theta / 2, grad(-0.6, -0.8), radius) == pytest.approx(1)  # inside


def test_planted_user_is_recovered(model):
    W = model.get_output_embeddings().weight.detach()
    head = make_head("svd_cvh", W, svd=torch.linalg.svd(W, full_matrices=False), d=D, alpha=1.0)
    planted = 3.0 * F.normalize(torch.randn(D, dtype=W.dtype, generator=torch.Generator().manual_seed(5)), dim=0)
    ids = sample_text(model, lambda h: head.logits(h, planted), batch=20, length=97, seed=6)
    (h_train, y_train), (h_test, y_test) = user_split(model, ids)
    theta, result = fit_theta(prepare(h_train, y_train, W), head, solver="exact", tol=1e-7)
    held_out = Objective(prepare(h_test, y_test, W), head, beta=0.0, lam=0.0)
    base, fitted, truth = held_out.tokens.base_nll, held_out(theta).ce, held_out(planted).ce
    assert truth < base - 0.1  # the planted signal is there to find
    assert fitted < base - 0.1 and abs(fitted - truth) < 0.02
    assert result.certificate <= 1e-7


def test_nan_stops_the_fit_naming_user_and_configuration(lm):
    h, y, W, b, svd = lm
    head = make_head("cvh", W, d=D, alpha=0.5, bias=b)
    broken = h.clone()
    broken[7, 3] = float("nan")
    for solver in ("seed", "exact"):
        with pytest.raises(
            FitDivergedError,
            match=r"user 'hamlet/Hamlet' \(head=cvh alpha=0.5 d=8, solver "
            f"{solver}\\) diverged at iteration 0",
        ):
            fit_theta(
                prepare(broken, y, W, b),
                head,
                solver=solver,
                user="hamlet/Hamlet",
                config={"head": "cvh", "alpha": 0.5, "d": 8},
            )
    exploding = make_head("cvh", W, d=D, alpha=float("inf"), bias=b)
    with pytest.raises(FitDivergedError, match="user 'u1'"):
        fit_theta(prepare(h, y, W, b), exploding, user="u1", config="cvh/inf")
    with pytest.raises(ConfigError, match=r"'fit\.solvers'.*'lbfgs'"):
        fit_theta(prepare(h, y, W, b), head, solver="lbfgs")


def test_pooled_users_fit_one_global_theta(lm):
    h, y, W, b, svd = lm
    head = make_head("svd_cvh", W, svd=svd, d=D, alpha=0.5, bias=b)
    users = [prepare(h[:120], y[:120], W, b, chunk=64), prepare(h[120:], y[120:], W, b, chunk=64)]
    pooled, together = pool(users), prepare(h, y, W, b, chunk=64)
    assert pooled.n == together.n == len(y)
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert Objective(pooled, head)(theta).objective == pytest.approx(
        Objective(together, head)(theta).objective, rel=1e-13
    )
    _, result = fit_theta(pooled, head, solver="exact")
    assert result.certificate <= 1e-5
