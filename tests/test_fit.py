"""The theta-fitting engine: objective and gradient parity with autograd on the seed's own
computation, the adam solver against seed 002 written out, the exact solver's certificate, a
planted user recovered, NaN handling, pooled tokens on one output layer, each device's tiles, a flagged
chunk mended after the pass, no host read per chunk."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import sample_text, user_split

import uph.lm.engine.lockstep
import uph.lm.engine.objective
import uph.lm.engine.solvers
from uph.device import count_host_reads
from uph.errors import ConfigError, FitDivergedError
from uph.lm.data.models import OutputLayer
from uph.lm.engine.evaluate import HeldOut
from uph.lm.engine.fit import WarmStart, fit_path, fit_path_steps, fit_theta, fit_theta_steps
from uph.lm.engine.heads import HEADS, HeadSettings, full_bias_head, make_head
from uph.lm.engine.lockstep import lockstep_groups, run_lockstep
from uph.lm.engine.objective import VOCAB_BLOCK, HeadOnTokens, Objective, evaluate_many, vocab_block
from uph.lm.engine.solvers import BallModel, SolverSettings, ball_model_minimizers, projected_gradient_norm
from uph.lm.engine.tokens import (
    CHUNK,
    GPU_CHUNK,
    CacheFloor,
    Mixture,
    chunk_size,
    on_device,
    pool,
    prepare,
    validation_split,
)

D = 8
HEAD_SETTINGS = HeadSettings.defaults()  # the schema's basis_seed, gamma and basis

BETA_LAM = (SolverSettings.defaults().beta, SolverSettings.defaults().lam)  # the schema's beta and lam


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
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64, cache_bytes=2 * 64 * W.shape[0] * 8)
    assert [c.p0 is not None for c in tokens.chunks] == [True, True, False, False, False]
    head = make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
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
    head = make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
    hessian = torch.autograd.functional.hessian(
        lambda theta: seed_objective(head, h, y, W, b, theta, beta=0.05, lam=1e-3)[0], torch.zeros(D, dtype=W.dtype)
    )
    curvature = Objective(prepare(h, y, OutputLayer(W, b), chunk=64), head, beta=0.05, lam=1e-3).curvature()
    torch.testing.assert_close(curvature, hessian.diagonal(), rtol=1e-9, atol=1e-12)


def test_the_full_bias_curvature_is_the_hessian_diagonal_at_zero(lm):
    h, y, W, b, _ = lm
    base = F.linear(h, W, b)

    def objective(bias):
        logits = base + bias
        kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(base, -1), reduction="batchmean")
        return F.cross_entropy(logits, y) + 0.05 * kl + 1e-3 * bias.square().sum()

    hessian = torch.autograd.functional.hessian(objective, torch.zeros(W.shape[0], dtype=W.dtype))
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64)  # five chunks, the last one of 44 tokens
    curvature = Objective(tokens, full_bias_head(W, b), beta=0.05, lam=1e-3).curvature()
    torch.testing.assert_close(curvature, hessian.diagonal(), rtol=1e-9, atol=1e-12)


def test_the_gradient_pass_sums_each_row_of_p0_within_float32_rounding(lm, monkeypatch):
    """An unconditional head's Σ_t p0_vt w_t by vocabulary blocks (Objective._row_sums, here blocks of 16 of
    V = 97 rows, the last one short): each row within the bound of any order of summing its c products in
    float32, (c + 1) u Σ_t |p0_vt w_t| (u = 2^-24), of the float64 product."""
    h, y, W, b, svd = lm
    monkeypatch.setattr(uph.lm.engine.objective, "vocab_block", lambda device, vocab: 16)
    tokens = prepare(h.float(), y, OutputLayer(W.float(), b.float()), chunk=64)
    objective = Objective(
        tokens, make_head("svd_uncond", W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd), 0, 0
    )
    p0 = tokens.chunks[0].p0
    weights = torch.rand(p0.shape[1], generator=torch.Generator().manual_seed(5)) * 10
    exact = p0.double() @ weights.double()
    bound = (p0.shape[1] + 1) * 2.0**-24 * (p0.double().abs() @ weights.double().abs())
    assert ((objective._row_sums(p0, weights).double() - exact).abs() <= bound).all()


def test_a_mixture_kept_within_its_budget_scores_as_one_mixed_as_read(lm):
    """Tokens.mixed keeps the mixture's probabilities of the chunks whose p0 is cached, within its budget
    (here two of the three cached chunks), and every head's J, gradient and curvature on them, and on a
    slice of them, are those of the mixture mixed as each pass reads it, bit for bit."""
    h, y, W, b, svd = lm
    V = W.shape[0]
    layer = OutputLayer(W.float(), b.float())
    tokens = prepare(h.float(), y, layer, chunk=64, cache_bytes=3 * 64 * V * 4)
    generator = torch.Generator().manual_seed(6)
    floors = []
    for chunk in tokens.chunks:  # a neural cache's part: 0.1 of each token's mass on 5 of the vocabulary
        support = torch.randperm(V, generator=generator)[:5].sort().values
        floors.append(CacheFloor(support, torch.full((5, len(chunk.targets)), 0.02)))
    mixture = Mixture(0.6, torch.full((V,), 0.3 / V))
    kept, as_read = tokens.mixed(mixture, floors, budget=2 * 64 * V * 4), tokens.mixed(mixture, floors, budget=0)
    assert [chunk.mixed is not None for chunk in kept.chunks] == [True, True, False, False, False]
    assert all(chunk.mixed is None for chunk in as_read.chunks)
    heads = [make_head(name, W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in HEADS]
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    for head in [*heads, full_bias_head(W.float(), b.float())]:
        at = torch.cat([theta, torch.zeros(head.d - D, dtype=torch.float64)])
        for part in (lambda t: t, lambda t: t.slice(30, 200)):
            one, other = (Objective(part(t), head, *BETA_LAM) for t in (kept, as_read))
            value, expected = one(at), other(at)
            assert (value.objective, value.ce, value.kl) == (expected.objective, expected.ce, expected.kl), head.name
            assert torch.equal(value.grad, expected.grad) and torch.equal(one.curvature(), other.curvature())


def test_a_repeated_theta_scores_as_its_first_whatever_its_place_among_the_thetas(lm):
    """HeldOut.many of a path's thetas, the last ones repeating an earlier one (balls past the unconstrained
    minimizer): each repeat has its first one's scores, bit for bit, for every head, so a capacity choice along
    such a plateau is its smallest radius (uph.lm.engine.capacity.TIE), whatever the batched product's rounding
    of each of its columns."""
    h, y, W, b, svd = lm
    tokens = prepare(h.float(), y, OutputLayer(W.float(), b.float()), chunk=64)
    heads = [make_head(name, W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in HEADS]
    for head in [*heads, full_bias_head(W.float(), b.float())]:
        path = 0.3 * torch.randn(5, head.d, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
        thetas = torch.cat([path, path[2:3].expand(6, -1)])
        scores = HeldOut(tokens, head).many(thetas)
        assert all(score == scores[2] for score in scores[5:]), head.name
        assert len({score["nll"] for score in scores[:5]}) == 5


def test_kl_is_zero_and_nll_is_base_at_theta_zero(lm):
    h, y, W, b, svd = lm
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64)
    assert tokens.base_nll == pytest.approx(float(F.cross_entropy(F.linear(h, W, b), y)), rel=1e-12)
    for name in ("cvh", "svd_uncond"):
        value = Objective(
            tokens, make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b), *BETA_LAM
        )(torch.zeros(D))
        assert value.kl == 0.0 and value.ce == tokens.base_nll and value.objective == tokens.base_nll


def test_float32_engine_on_bfloat16_states_matches_float64(lm):
    h, y, W, b, svd = lm
    h = h.to(torch.bfloat16)
    head64 = make_head("svd_cvh", W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
    head32 = make_head(
        "svd_cvh", W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=tuple(t.float() for t in svd), bias=b.float()
    )
    theta = torch.randn(D, generator=torch.Generator().manual_seed(3))
    exact = Objective(prepare(h, y, OutputLayer(W, b)), head64, *BETA_LAM)(theta.double())
    fast = Objective(prepare(h, y, OutputLayer(W.float(), b.float())), head32, *BETA_LAM)(theta)
    assert fast.objective == pytest.approx(exact.objective, abs=1e-5)
    torch.testing.assert_close(fast.grad, exact.grad, rtol=1e-4, atol=1e-5)


def test_float32_engine_survives_logit_changes_beyond_exp_range(lm):
    h, y, W, b, svd = lm
    head64 = make_head("cvh", W, d=D, alpha=300.0, settings=HEAD_SETTINGS, bias=b)
    head32 = make_head("cvh", W.float(), d=D, alpha=300.0, settings=HEAD_SETTINGS, bias=b.float())
    theta = 5 * F.normalize(torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), dim=0)
    assert head64.correction(h, theta).abs().max() > 200  # exp(200) overflows float32
    exact = Objective(prepare(h, y, OutputLayer(W, b)), head64, *BETA_LAM)(theta)
    fast = Objective(prepare(h.float(), y, OutputLayer(W.float(), b.float())), head32, *BETA_LAM)(theta.float())
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
def test_adam_solver_reproduces_seed_002(lm, name, max_norm):
    h, y, W, b, svd = lm
    head = make_head(name, W, d=D, alpha=2.0, settings=HEAD_SETTINGS, svd=svd, bias=b)
    expected = seed_002_written_out(h, y, W, b, head, D, max_norm=max_norm)
    settings = SolverSettings.defaults(clip_norm=max_norm)
    theta, result = fit_theta(prepare(h, y, OutputLayer(W, b)), head, "adam", settings, radius=max_norm)
    torch.testing.assert_close(theta, expected, rtol=1e-8, atol=1e-10)
    assert (result.iterations, result.evaluations) == (30, 31)


@pytest.mark.parametrize("name, max_norm", [("svd_cvh", 5.0), ("uncond", 5.0), ("cvh", 0.2)])
def test_exact_solver_certifies_an_optimum_no_worse_than_adam(lm, name, max_norm, monkeypatch):
    h, y, W, b, svd = lm
    tokens = prepare(h, y, OutputLayer(W, b))
    head = make_head(name, W, d=D, alpha=2.0, settings=HEAD_SETTINGS, svd=svd, bias=b)
    settings = SolverSettings.defaults(clip_norm=max_norm, tol=1e-7)
    _, adam = fit_theta(tokens, head, "adam", settings, radius=max_norm)
    theta, exact = fit_theta(tokens, head, "exact", settings, radius=max_norm)
    assert exact.objective <= adam.objective and exact.certificate <= 1e-7 < adam.certificate
    assert exact.theta_norm <= max_norm * (1 + 1e-12)
    # unique optimum: the large-d solver (L-BFGS and projected gradient, no d×d model) lands on the same point
    monkeypatch.setattr(uph.lm.engine.solvers, "DENSE_MAX_D", 0)
    again, spg = fit_theta(tokens, head, "exact", settings, radius=max_norm)
    assert spg.certificate <= 1e-7
    torch.testing.assert_close(again, theta, rtol=0, atol=1e-4)
    if max_norm < 1:  # the ball binds: KKT says the gradient points straight back inside
        grad = Objective(tokens, head, *BETA_LAM)(theta).grad
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
    head = make_head("svd_cvh", W, d=D, alpha=1.0, settings=HEAD_SETTINGS, svd=torch.linalg.svd(W, full_matrices=False))
    planted = 3.0 * F.normalize(torch.randn(D, dtype=W.dtype, generator=torch.Generator().manual_seed(5)), dim=0)
    ids = sample_text(model, lambda h: head.logits(h, planted), batch=20, length=97, seed=6)
    (h_train, y_train), (h_test, y_test) = user_split(model, ids)
    theta, result = fit_theta(
        prepare(h_train, y_train, OutputLayer(W)), head, "exact", SolverSettings.defaults(tol=1e-7)
    )
    held_out = Objective(prepare(h_test, y_test, OutputLayer(W)), head, beta=0.0, lam=0.0)
    base, fitted, truth = held_out.tokens.base_nll, held_out(theta).ce, held_out(planted).ce
    assert truth < base - 0.1  # the planted signal is there to find
    assert fitted < base - 0.1 and abs(fitted - truth) < 0.02
    assert result.certificate <= 1e-7


def test_nan_stops_the_fit_naming_user_and_configuration(lm):
    h, y, W, b, svd = lm
    head = make_head("cvh", W, d=D, alpha=0.5, settings=HEAD_SETTINGS, bias=b)
    broken = h.clone()
    broken[7, 3] = float("nan")
    for solver in ("adam", "exact"):
        with pytest.raises(
            FitDivergedError,
            match=r"user 'hamlet/Hamlet' \(head=cvh alpha=0.5 d=8, solver "
            f"{solver}\\) diverged at iteration 0",
        ):
            fit_theta(
                prepare(broken, y, OutputLayer(W, b)),
                head,
                solver,
                SolverSettings.defaults(),
                user="hamlet/Hamlet",
                label="head=cvh alpha=0.5 d=8",
            )
    exploding = make_head("cvh", W, d=D, alpha=float("inf"), settings=HEAD_SETTINGS, bias=b)
    with pytest.raises(FitDivergedError, match="user 'u1'"):
        fit_theta(
            prepare(h, y, OutputLayer(W, b)), exploding, "adam", SolverSettings.defaults(), user="u1", label="cvh/inf"
        )
    with pytest.raises(ConfigError, match=r"'fit\.solvers'.*'lbfgs'"):
        fit_theta(prepare(h, y, OutputLayer(W, b)), head, "lbfgs", SolverSettings.defaults())


def test_pooled_users_fit_one_global_theta(lm):
    h, y, W, b, svd = lm
    head = make_head("svd_cvh", W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
    users = [
        prepare(h[:120], y[:120], OutputLayer(W, b), chunk=64),
        prepare(h[120:], y[120:], OutputLayer(W, b), chunk=64),
    ]
    pooled, together = pool(users), prepare(h, y, OutputLayer(W, b), chunk=64)
    assert pooled.n == together.n == len(y)
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert Objective(pooled, head, *BETA_LAM)(theta).objective == pytest.approx(
        Objective(together, head, *BETA_LAM)(theta).objective, rel=1e-13
    )
    _, result = fit_theta(pooled, head, "exact", SolverSettings.defaults())
    assert result.certificate <= 1e-5


@pytest.mark.parametrize("name", ["svd_cvh", "uncond"])
def test_residual_objective_is_j_on_top_of_a_fixed_theta(lm, name):
    """With offset g the base is p_g ∝ p0 exp(P u_g): CE and KL(p_g ‖ p) at g + theta, penalty on theta."""
    h, y, W, b, svd = lm
    head = make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
    g = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
    base = head.logits(h, g)
    logits = head.logits(h, g + theta)
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(base, -1), reduction="batchmean")
    ce = F.cross_entropy(logits, y)
    expected = ce + 0.05 * kl + 1e-3 * theta.square().sum()
    expected.backward()
    objective = Objective(prepare(h, y, OutputLayer(W, b), chunk=64), head, beta=0.05, lam=1e-3, offset=g)
    assert objective.base_nll == pytest.approx(float(F.cross_entropy(base, y)), rel=1e-12)
    value = objective(theta.detach())
    assert (value.objective, value.ce, value.kl) == pytest.approx(
        (float(expected.detach()), float(ce.detach()), float(kl.detach())), rel=1e-10, abs=1e-12
    )
    torch.testing.assert_close(value.grad, theta.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["svd_cvh", "uncond"])
def test_arms_sharing_a_head_on_tokens_score_as_alone(lm, name):
    """HeadOnTokens: a residual Objective after a personal one on the same head and tokens has the same
    base NLL, values and curvature as one built alone; the shared work is refused for other tokens."""
    h, y, W, b, svd = lm
    head = make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b)
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64)
    g = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    shared = HeadOnTokens(tokens, head)
    personal = Objective(tokens, head, beta=0.05, lam=1e-3, shared=shared)
    personal.curvature()
    residual = Objective(tokens, head, beta=0.1, lam=1e-2, offset=g, shared=shared)
    alone = Objective(tokens, head, beta=0.1, lam=1e-2, offset=g)
    assert residual.base_nll == alone.base_nll
    assert residual(theta).objective == alone(theta).objective
    torch.testing.assert_close(residual.curvature(), alone.curvature(), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="same head on the same tokens"):
        Objective(prepare(h[:50], y[:50], OutputLayer(W, b)), head, beta=0.0, lam=0.0, shared=shared)


def test_full_vocabulary_bias_is_the_unconditional_head_at_d_equal_v(lm):
    h, y, W, b, _ = lm
    head = full_bias_head(W, b)
    bias = (
        0.3 * torch.randn(W.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    ).requires_grad_(True)
    base = F.linear(h, W, b)
    logits = base + bias
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(base, -1), reduction="batchmean")
    expected = F.cross_entropy(logits, y) + 0.05 * kl + 1e-4 * bias.square().sum()
    expected.backward()
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64)
    value = Objective(tokens, head, *BETA_LAM)(bias.detach())
    assert value.objective == pytest.approx(expected.item(), rel=1e-10)
    torch.testing.assert_close(value.grad, bias.grad, rtol=1e-8, atol=1e-12)
    theta, result = fit_theta(tokens, head, "exact", SolverSettings.defaults(tol=1e-6, max_iter=2000))
    assert (
        result.certificate <= 1e-6
        and result.objective < Objective(tokens, head, *BETA_LAM)(torch.zeros_like(theta)).objective
    )


def test_logits_spanning_over_100_nats_fit_without_minus_inf(lm):
    """A peaked base (logits spread x60) tilted so that the cached p0 underflows: exact fallback."""
    h, y, W, b, svd = lm
    layer = OutputLayer(60 * W.float(), 60 * b.float())
    z = F.linear(h.float(), layer.W, layer.b)
    assert float((z.amax(-1) - z.amin(-1)).min()) > 100
    head = make_head("uncond", layer.W, d=D, alpha=40.0, settings=HEAD_SETTINGS, bias=layer.b)
    tokens = prepare(h.float(), y, layer)
    theta = 5 * F.normalize(torch.randn(D, generator=torch.Generator().manual_seed(4)), dim=0)
    reference = F.linear(h, 60 * W, 60 * b) + head.correction(h.float(), theta).double()  # no cache
    expected = F.cross_entropy(reference, y)
    value = Objective(tokens, head, beta=0.0, lam=SolverSettings.defaults().lam)(theta)
    assert math.isfinite(value.objective) and value.ce == pytest.approx(float(expected), rel=1e-5)
    _, result = fit_theta(tokens, head, "exact", SolverSettings.defaults())
    layer64 = OutputLayer(60 * W, 60 * b)
    _, exact64 = fit_theta(
        prepare(h, y, layer64),
        make_head("uncond", layer64.W, d=D, alpha=40.0, settings=HEAD_SETTINGS, bias=layer64.b),
        "exact",
        SolverSettings.defaults(),
    )
    assert exact64.certificate <= 1e-5
    # float32 carries ~7 digits of a 120-nat objective: the same optimum to that precision
    assert math.isfinite(result.objective) and result.objective == pytest.approx(exact64.objective, rel=1e-6)


def test_softcapped_logits_are_the_base(lm):
    """Gemma 2's final softcap: the base distribution is softmax(cap tanh((W h + b) / cap))."""
    h, y, W, b, _ = lm
    layer = OutputLayer(20 * W, 20 * b, softcap=5.0)
    capped = 5.0 * torch.tanh(F.linear(h, 20 * W, 20 * b) / 5.0)
    assert prepare(h, y, layer).base_nll == pytest.approx(float(F.cross_entropy(capped, y)), rel=1e-12)
    # float64 to rounding: F.linear's fused bias and matmul-then-add round differently on some CPUs (AMD EPYC: 1e-14)
    torch.testing.assert_close(layer.logits(h), capped, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["svd_cvh", "full_bias"])
def test_a_warm_path_lands_where_each_ball_fitted_alone_lands(lm, name):
    """fit_path walks the radii warm (the last ball's theta and BFGS model); J is convex, so every ball's
    theta is the cold fit's, to the certificate. Past the unconstrained minimizer a ball costs nothing."""
    h, y, W, b, svd = lm
    tokens = prepare(h, y, OutputLayer(W, b))
    head = (
        full_bias_head(W, b)
        if name == "full_bias"
        else make_head(name, W, d=D, alpha=2.0, settings=HEAD_SETTINGS, svd=svd, bias=b)
    )
    settings, radii = SolverSettings.defaults(tol=1e-7, lam=0.05), [0.1, 0.5, 2.0, 1e3, 1e4]
    path = fit_path(tokens, head, "exact", settings, radii)
    for (theta, result), radius in zip(path, radii):
        alone, cold = fit_theta(tokens, head, "exact", settings, radius)
        assert result.radius == radius and result.certificate <= 1e-7 and theta.norm() <= radius * (1 + 1e-12)
        assert result.objective == pytest.approx(cold.objective, abs=1e-10)
        torch.testing.assert_close(theta, alone, rtol=0, atol=1e-4)
    assert path[3][1].theta_norm < 1e3 and path[4][1].evaluations == 0  # lam binds first: the last ball is free
    with pytest.raises(ValueError, match="a path of radii goes up"):
        fit_path(tokens, head, "exact", settings, [2.0, 1.0])


@pytest.mark.parametrize("offset", [False, True])
def test_a_refit_warm_from_the_fit_parts_ball_reaches_the_cold_refits_certified_optimum(lm, offset):
    """The fit job refits each arm on all train tokens at the radius chosen, starting from the validation
    path's ball there (its theta and BFGS model, fitted on the fit part): the same certified optimum as a
    cold refit (J is convex); the residual arm's too (its path's offset is the fit parts' global theta, its
    refit's the global theta on all tokens). A start at the optimum itself costs one evaluation."""
    h, y, W, b, svd = lm
    tokens = prepare(h, y, OutputLayer(W, b))
    fit_part, _ = validation_split(tokens, 0.2, gap=10)
    head = make_head("svd_cvh", W, d=D, alpha=2.0, settings=HEAD_SETTINGS, svd=svd, bias=b)
    settings, radii = SolverSettings.defaults(tol=1e-7, lam=1e-4), [0.1, 0.5, 2.0, 8.0]
    theta_g = 0.3 * torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=torch.float64) if offset else None
    theta_g_fit = None if theta_g is None else 0.9 * theta_g
    for theta_fit, ball in fit_path(fit_part, head, "exact", settings, radii, theta_g_fit):
        cold_theta, cold = fit_theta(tokens, head, "exact", settings, ball.radius, theta_g)
        start = WarmStart(theta_fit, ball.model)
        warm_theta, warm = fit_theta(tokens, head, "exact", settings, ball.radius, theta_g, start=start)
        assert warm.certificate <= 1e-7 and cold.certificate <= 1e-7
        assert warm.objective == pytest.approx(cold.objective, abs=1e-10)
        torch.testing.assert_close(warm_theta, cold_theta, rtol=0, atol=1e-4)
        at_optimum = WarmStart(cold_theta, cold.model)
        again = fit_theta(tokens, head, "exact", settings, ball.radius, theta_g, start=at_optimum)[1]
        assert again.evaluations == 1 and again.certificate <= 1e-7 and again.objective == cold.objective


def test_the_validation_part_follows_the_fit_part_after_the_gap(lm):
    h, y, W, b, _ = lm
    tokens = prepare(h, y, OutputLayer(W, b), chunk=64)
    fit_part, validation = validation_split(tokens, 0.2, gap=10)
    assert (fit_part.n, validation.n) == (300 - 60 - 10, 60)
    targets = torch.cat([c.targets for c in validation.chunks])
    assert torch.equal(torch.cat([c.targets for c in fit_part.chunks]), y[:230]) and torch.equal(targets, y[240:])
    with pytest.raises(ValueError, match="leave no fit part"):
        validation_split(tokens, 0.5, gap=150)


def test_tokens_share_the_one_output_layer_they_are_given(lm):
    """prepare computes with on_device(layer, device): the layer itself once a job has made it so, a copy
    for those tokens alone otherwise. Every Tokens of a job, and their pool, share one W; pool refuses
    tokens that hold copies of it."""
    h, y, W, b, _ = lm
    stored = OutputLayer(W.bfloat16(), b.bfloat16())  # as a model may store it: each .to(float32) copies
    layer = on_device(stored, "cpu")
    assert layer.W.dtype == layer.b.dtype == torch.float32 and on_device(layer, "cpu") is layer
    users = [prepare(h[:120], y[:120], layer, chunk=64), prepare(h[120:], y[120:], layer, chunk=64)]
    assert all(user.layer is layer for user in users) and pool(users).layer is layer
    alone = prepare(h[120:], y[120:], stored, chunk=64)
    assert torch.equal(alone.layer.W, layer.W) and alone.layer.W.data_ptr() != layer.W.data_ptr()
    with pytest.raises(ValueError, match="share one output layer"):
        pool([users[0], alone])


def test_tiles_are_the_devices_and_leave_the_objective_unchanged(lm, monkeypatch):
    """A CPU keeps chunks of CHUNK tokens and vocabulary blocks of VOCAB_BLOCK rows; a GPU takes chunks of
    GPU_CHUNK and the whole vocabulary as one block. J, its gradient and the batched scores are the same
    to rounding whatever the tiles (here on the CPU: V = 97 in blocks of 16 or in one)."""
    h, y, W, b, svd = lm
    V = W.shape[0]
    assert (chunk_size("cpu"), chunk_size(torch.device("cuda"))) == (CHUNK, GPU_CHUNK)
    assert (vocab_block(torch.device("cpu"), V), vocab_block(torch.device("cuda"), V)) == (VOCAB_BLOCK, V)
    theta = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    thetas = torch.randn(3, V, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    heads = {name: make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b) for name in HEADS}
    heads["full_bias"] = full_bias_head(W, b)
    for name, head in heads.items():
        values = []
        for chunk, block in ((64, 16), (GPU_CHUNK, V)):
            monkeypatch.setattr(uph.lm.engine.objective, "vocab_block", lambda device, vocab, block=block: block)
            tokens = prepare(h, y, OutputLayer(W, b), chunk=chunk)
            at = theta if head.d == D else thetas[0]
            value = Objective(tokens, head, *BETA_LAM)(at)
            values.append((value.objective, value.grad, HeldOut(tokens, head).many(thetas[:, : head.d])))
        (j, grad, scores), (j_gpu, grad_gpu, scores_gpu) = values
        assert j_gpu == pytest.approx(j, rel=1e-13), name
        torch.testing.assert_close(grad_gpu, grad, rtol=1e-11, atol=1e-14)
        for score, score_gpu in zip(scores, scores_gpu):
            assert score_gpu == pytest.approx(score, rel=1e-12), name


@pytest.mark.parametrize("name", ["cvh", "lm_head_update", "uncond"])
def test_a_chunk_the_fast_path_flags_is_mended_alone(lm, name):
    """One chunk of five whose tokens' logits span over 60 nats, tilted past EXP_SAFE (conditional heads)
    or onto tokens whose cached p0 underflows float32 (uncond): the fast path flags that chunk alone, it is
    mended after the pass (its p0 recomputed: beyond the cache), and the float32 J and gradient are the
    seed's float64 computation's."""
    h, y, W, b, svd = lm
    h = h.clone()
    h[192:256] *= 40 if name == "uncond" else 20
    alpha = {"cvh": 2.0, "lm_head_update": 4.0, "uncond": 40.0}[name]
    head64 = make_head(name, W, d=D, alpha=alpha, settings=HEAD_SETTINGS, svd=svd, bias=b)
    head32 = make_head(name, W.float(), d=D, alpha=alpha, settings=HEAD_SETTINGS, svd=svd, bias=b.float())
    theta = 5 * F.normalize(torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(4)), dim=0)
    tokens = prepare(h.float(), y, OutputLayer(W.float(), b.float()), chunk=64, cache_bytes=2 * 64 * W.shape[0] * 4)
    objective, flagged, flagged_of = Objective(tokens, head32, *BETA_LAM), [], uph.lm.engine.objective._flagged
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            uph.lm.engine.objective, "_flagged", lambda flags: flagged.append(flagged_of(flags)) or flagged[-1]
        )
        value = objective(theta.float())
    assert flagged == [[3]]
    theta64 = theta.clone().requires_grad_(True)
    expected, ce, _ = seed_objective(head64, h, y, W, b, theta64, *BETA_LAM)
    expected.backward()
    assert (value.objective, value.ce) == pytest.approx((float(expected.detach()), float(ce.detach())), rel=1e-6)
    # The float32 error, against the float64 reference: each cached p0_tv is the exp of a float32 logit whose
    # rounding error grows with its size, up to max|z0| eps32 (logits of 115 nats here for uncond: 1.4e-5), and
    # each gradient element is an expectation of P's column under p_t minus the targets' mean, terms of the
    # gradient's scale (its largest element, 26 for uncond) that can cancel: element 4 of uncond's is 0.08, so
    # its error (9.9e-5 on one Intel Xeon, 1.3e-3 of itself) is bounded in the gradient's scale, not its own.
    # The engine in float64 on the same inputs matches the reference to 1e-9: the mended path's arithmetic is
    # right, and its float32 error is the logits'.
    z_max = float(F.linear(h.float(), W.float(), b.float()).abs().max())
    atol = z_max * torch.finfo(torch.float32).eps * float(theta64.grad.abs().max())
    torch.testing.assert_close(value.grad, theta64.grad, rtol=0, atol=atol)


def host_reads(function, *args, **kwargs) -> int:
    """How many times function(*args, **kwargs) reads a tensor's values back to the host (uph.device)."""
    return count_host_reads(function, *args, **kwargs)[1]


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_an_evaluation_reads_nothing_back_per_chunk(lm, device):
    """J with its gradient, J alone and the batched scores read the same few values back to the host on 2
    chunks as on 10 (here and on a GPU: no device-to-host sync per chunk), the unigram cache's mixture base
    included."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), device)
    floor = torch.full((W.shape[0],), 0.3 / W.shape[0], dtype=torch.float64)
    heads = [make_head(name, W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in HEADS]
    theta = torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for head in [*heads, full_bias_head(W.float(), b.float())]:
        at = torch.cat([theta, torch.zeros(head.d - D, dtype=torch.float64)])
        for mixture in (None, Mixture(0.7, floor)):
            reads = []
            for chunk in (150, 30):
                tokens = prepare(h.float(), y, layer, chunk=chunk, device=device)
                tokens = tokens if mixture is None else tokens.mixed(mixture)
                objective, held_out = Objective(tokens, head, *BETA_LAM), HeldOut(tokens, head)
                reads.append(
                    [
                        host_reads(objective, at),
                        host_reads(objective, at, need_grad=False),
                        host_reads(held_out.many, torch.stack([at, 2 * at])),
                    ]
                )
            assert reads[0] == reads[1], (head.name, mixture is not None)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_a_lockstep_round_reads_back_once_whatever_the_number_of_fits(lm, device):
    """evaluate_many of K users' next steps (uph.lm.engine.objective): the device part of the round reads every
    objective's J and gradient back in one read for K = 1, 2 and 4 (each head, on the model's base and
    on a mixture), in two where a tilt that may overflow has chunks mended (theta 100 times larger), and
    each Value is the one its objective gives alone, bit for bit."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), device)
    floor = torch.full((W.shape[0],), 0.3 / W.shape[0], dtype=torch.float64)
    heads = [make_head(name, W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in HEADS]
    users = [prepare(h[i::4].float(), y[i::4], layer, chunk=30, device=device) for i in range(4)]
    device_round, reads, seen = uph.lm.engine.objective._device_round, [], set()

    def counted(requests, need_grad):
        found = []
        reads.append(host_reads(lambda: found.append(device_round(requests, need_grad))))
        return found[0]

    for head in [*heads, full_bias_head(W.float(), b.float())]:
        for mixture, scale in [(None, 0.3), (Mixture(0.7, floor), 0.3), (None, 100.0)]:
            objectives = [Objective(u if mixture is None else u.mixed(mixture), head, *BETA_LAM) for u in users]
            generator = torch.Generator().manual_seed(3)
            thetas = [scale * torch.randn(head.d, generator=generator, dtype=torch.float64) for _ in users]
            alone = [objective(theta) for objective, theta in zip(objectives, thetas)]
            per_k = []
            for k in (1, 2, 4):
                reads.clear()
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(uph.lm.engine.objective, "_device_round", counted)
                    values = evaluate_many(list(zip(objectives[:k], thetas[:k])))
                per_k.append(reads[:])
                assert [(v.objective, v.ce, v.kl) for v in values] == [(v.objective, v.ce, v.kl) for v in alone[:k]]
                assert all(torch.equal(v.grad, a.grad) for v, a in zip(values, alone))
            assert per_k[0] == per_k[1] == per_k[2] and per_k[0] in ([1], [2]), (head.name, scale, per_k)
            seen.add(per_k[0][0])
    assert seen == {1, 2}  # the mended rounds were counted too


def _ball_models(generator: torch.Generator) -> list[BallModel]:
    """Quadratic models over balls: dense of two sizes and diagonal, their minimizers inside the ball
    (a large radius; one at 0, where Newton's quotients would be 0 / 0) and on it, curvatures over six
    decades."""
    models = []
    for d, dense, radius in [
        (5, True, 0.3),
        (5, True, 1e6),
        (7, True, 2.0),
        (5, False, 0.3),
        (5, False, 1e6),
        (5, True, 0.01),
    ]:
        A = torch.randn(d, d, dtype=torch.float64, generator=generator)
        B = (
            A @ A.T + 1e-3 * torch.eye(d, dtype=torch.float64)
            if dense
            else 10 ** (6 * torch.rand(d, dtype=torch.float64, generator=generator) - 3)
        )
        theta = torch.randn(d, dtype=torch.float64, generator=generator)
        theta *= min(radius, 1.0) * 0.5 / theta.norm()
        models.append(BallModel(theta, 10 * torch.randn(d, dtype=torch.float64, generator=generator), B, radius))
    B = models[0].B
    models.append(BallModel(models[0].theta, B @ models[0].theta, B, 0.3))  # c = 0: the minimizer is 0
    return models


def test_ball_model_minimizers_meet_the_balls_optimality_conditions_and_batch_bit_for_bit():
    """Each BallModel's minimizer x meets the KKT conditions of min g·(x - θ) + ½ (x - θ)^T B (x - θ) over
    ‖x‖ <= r: inside the ball it is θ - B^-1 g (solved explicitly), on it B (x - θ) + g = -mu x with
    mu >= 0 and ‖x‖ = r; to the float64 error of its sums (100 cond(B) d u) and Newton's stop (within
    1e-12 of the sphere). Batched with models of other shapes, each is bit for bit its own."""
    generator = torch.Generator().manual_seed(0)
    models = _ball_models(generator)
    batched = ball_model_minimizers(models)
    on_sphere = 0
    for model, x in zip(models, batched):
        assert torch.equal(x, ball_model_minimizers([model])[0])
        B = torch.diag(model.B) if model.B.dim() == 1 else model.B
        eigenvalues = torch.linalg.eigvalsh(B)
        tolerance = 100 * float(eigenvalues[-1] / eigenvalues[0]) * len(x) * torch.finfo(torch.float64).eps
        scale = float(model.grad.norm() + (B @ model.theta).norm())
        inside = model.theta - torch.linalg.solve(B, model.grad)
        if inside.norm() <= model.radius:
            assert float((x - inside).norm()) <= tolerance * float(model.theta.norm() + (inside - model.theta).norm())
            continue
        on_sphere += 1
        assert abs(float(x.norm()) / model.radius - 1) <= 1e-12
        residual = B @ (x - model.theta) + model.grad
        mu = -float(residual @ x) / float(x @ x)
        # Newton stops within 1e-12 of the sphere and scales y onto it: x moves by up to 1e-12 r
        stopped = (1e-12 + tolerance) * (float(eigenvalues[-1]) + mu) * model.radius
        assert mu >= 0 and float((residual + mu * x).norm()) <= tolerance * scale + stopped
    assert on_sphere == 4


def test_run_lockstep_takes_the_ball_steps_of_a_round_together(lm, monkeypatch):
    """The fits a round moves on hand their ball steps (BallModel) to one ball_model_minimizers call."""
    h, y, W, b, svd = lm
    layer = OutputLayer(W.float(), b.float())
    head = make_head("svd_cvh", W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd)
    users = [prepare(h[i::3].float(), y[i::3], layer) for i in range(3)]
    batches = []

    def recorded(models):
        batches.append(len(models))
        return ball_model_minimizers(models)

    monkeypatch.setattr(uph.lm.engine.lockstep, "ball_model_minimizers", recorded)
    run_lockstep([fit_path_steps(u, head, "exact", SolverSettings.defaults(), [0.5]) for u in users])
    assert max(batches) == 3, batches


def test_run_lockstep_hands_each_fit_its_own_values_and_stops_on_an_error(lm):
    """Fits of different lengths in lockstep return what each returns alone; a fit that diverges stops the
    rounds with its error."""
    h, y, W, b, svd = lm
    layer = OutputLayer(W.float(), b.float())
    head = make_head("svd_cvh", W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd)
    users = [prepare(h[i::3].float(), y[i::3], layer) for i in range(3)]
    settings = SolverSettings.defaults()
    radii = ([0.5], [0.5, 5.0, 50.0], [5.0])
    fits = [fit_path_steps(u, head, "exact", settings, r, user=str(i)) for i, (u, r) in enumerate(zip(users, radii))]
    together = run_lockstep(fits)
    for u, r, path in zip(users, radii, together):
        assert [(float(t.norm()), f.objective) for t, f in path] == [
            (float(t.norm()), f.objective) for t, f in fit_path(u, head, "exact", settings, r)
        ]
    huge = make_head("svd_cvh", W.float(), d=D, alpha=1e30, settings=HEAD_SETTINGS, svd=svd)
    fits = [
        fit_path_steps(users[0], head, "exact", settings, [5.0]),
        fit_theta_steps(users[1], huge, "exact", settings),
    ]
    with pytest.raises(FitDivergedError, match="diverged"):
        run_lockstep(fits)


def test_objectives_on_one_device_share_one_work_buffer_and_keep_their_values(lm):
    """Every Objective writes its blocks into one buffer per device and dtype (shared_scratch), so a lockstep
    group holds one, not one per user and arm: an objective's Value is the same bit for bit before and after
    another head's objective on other tokens has used the buffer, and a longer chunk grows it."""
    h, y, W, b, svd = lm
    layer = OutputLayer(W.float(), b.float())
    cvh, uncond = (
        make_head(name, W.float(), d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in ("cvh", "uncond")
    )
    first = Objective(prepare(h[:150].float(), y[:150], layer, chunk=30), cvh, *BETA_LAM)
    theta = 0.3 * torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    before = first(theta)
    second = Objective(prepare(h[150:].float(), y[150:], layer, chunk=30), uncond, *BETA_LAM)
    second(theta)
    assert first.scratch.untyped_storage().data_ptr() == second.scratch.untyped_storage().data_ptr()
    after = first(theta)
    assert (after.objective, after.ce, after.kl) == (before.objective, before.ce, before.kl)
    assert torch.equal(after.grad, before.grad)
    longer = Objective(prepare(h.float(), y, layer, chunk=len(y)), cvh, *BETA_LAM)
    assert longer.scratch.numel() > first.scratch.numel()
    assert first(theta).objective == before.objective  # its own, smaller buffer still works


def test_lockstep_groups_hold_what_the_budget_holds_in_the_users_order():
    """Users cut into lockstep groups by their p0's bytes (4 V bytes a token), in order, at least one a group."""
    tokens = {"a": 10, "b": 20, "c": 5, "d": 40, "e": 1}
    assert lockstep_groups(tokens, vocab=100, budget=4 * 100 * 30) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert lockstep_groups(tokens, vocab=100, budget=float("inf")) == [list(tokens)]
    assert lockstep_groups({}, vocab=100) == []
