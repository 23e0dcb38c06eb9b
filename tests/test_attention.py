"""RoPE, standard, triple-product and 2-simplicial attention against explicit computations."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import uph.attention.self_attention as self_attention
from uph.attention.model import OneLayerModel, ResidualModel
from uph.attention.self_attention import (
    ATTENTIONS,
    KINDS,
    STABILIZERS,
    CausalSelfAttention,
    _SimplicialProbs,
    _TripleProductProbs,
    rope,
    score_magnitude,
    simplicial_attention,
    soft_capped,
    standard_attention,
    triple_product_attention,
    triple_scores,
)
from uph.report.answers import MATCHED_CONTROLS


def literal_gram_scores(q, k, r):
    """-det of the 3x3 Gram matrix of (q_i, k_j, r_i), per (i, j), scaled by D^-1.5, causal."""
    T, D = q.shape[-2:]
    grid = q.shape[:-2] + (T, T, D)
    vectors = torch.stack(
        (q[..., :, None, :].expand(grid), k[..., None, :, :].expand(grid), r[..., :, None, :].expand(grid)), dim=-2
    )
    det = torch.linalg.det(vectors @ vectors.transpose(-1, -2))
    return (-det * D**-1.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


def random_qkr(*shape, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=dtype) for _ in range(3)]


def test_rope_is_seed_004s_rotation_of_interleaved_pairs():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pairs = torch.complex(x[..., 0::2], x[..., 1::2])
    theta = torch.arange(5, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8)
    turned = pairs * torch.polar(torch.ones_like(theta), theta)
    expected = torch.cat((turned.real, turned.imag), dim=-1)
    torch.testing.assert_close(rope(x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("score", ["dot", "triple"])
def test_rope_scores_depend_only_on_relative_position(score):
    q, k, r = (v.expand(12, 8) for v in random_qkr(1, 8))  # the same content at every position
    q, k, r = rope(q), rope(k), rope(r)
    scores = q @ k.T if score == "dot" else triple_scores(q, k, r)
    for offset in range(12):
        diagonal = torch.diagonal(scores, offset=-offset)  # all (i, i - offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-6, atol=1e-6)
    assert torch.diagonal(scores, offset=-1)[0] != torch.diagonal(scores, offset=-2)[0]


def test_fast_triple_score_equals_literal_gram_determinant_in_float64():
    q, k, r = random_qkr(2, 3, 9, 6)
    torch.testing.assert_close(triple_scores(q, k, r), literal_gram_scores(q, k, r), rtol=1e-6, atol=0)


def test_fast_triple_score_in_float32_is_within_1e_6_of_float64_literal():
    q, k, r = random_qkr(2, 3, 16, 16, dtype=torch.float32)
    fast = triple_scores(q, k, r)
    exact = literal_gram_scores(q.double(), k.double(), r.double())
    past = torch.isfinite(exact)
    assert fast.dtype == torch.float32 and torch.equal(past, torch.isfinite(fast))
    assert (fast.double() - exact)[past].abs().max() <= 1e-6 * exact[past].abs().max()


def test_triple_score_is_float32_for_bfloat16_inputs_and_under_autocast():
    q, k, r = random_qkr(2, 7, 8, dtype=torch.bfloat16)
    scores = triple_scores(q, k, r)
    assert scores.dtype == torch.float32
    assert torch.equal(scores, triple_scores(q.float(), k.float(), r.float()))
    q, k, r = (v.float() for v in (q, k, r))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = triple_scores(q, k, r), _TripleProductProbs.apply(q, k, r)
    outside = triple_scores(q, k, r), _TripleProductProbs.apply(q, k, r)
    for a, b in zip(inside, outside):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_triple_probabilities_gradient_matches_finite_differences():
    q, k, r = (v.requires_grad_() for v in random_qkr(1, 2, 4, 4))
    assert torch.autograd.gradcheck(_TripleProductProbs.apply, (q, k, r))


def test_triple_attention_and_gradients_equal_autograd_through_the_literal_formula():
    q, k, r = (v.requires_grad_() for v in random_qkr(2, 3, 10, 6, seed=1))
    v = torch.randn(2, 3, 10, 6, dtype=torch.float64)
    weights = torch.randn(2, 3, 10, 6, dtype=torch.float64)
    fast = triple_product_attention(q, k, r, v)
    fast_grads = torch.autograd.grad((fast * weights).sum(), (q, k, r))
    literal = torch.softmax(literal_gram_scores(q, k, r), dim=-1) @ v
    literal_grads = torch.autograd.grad((literal * weights).sum(), (q, k, r))
    torch.testing.assert_close(fast, literal, rtol=1e-9, atol=1e-12)
    for a, b in zip(fast_grads, literal_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def test_standard_attention_is_masked_softmax_of_scaled_dots():
    q, k, v = random_qkr(2, 3, 10, 8)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(torch.ones(10, 10).triu(1).bool(), -math.inf)
    torch.testing.assert_close(standard_attention(q, k, v), torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_changing_a_future_token_changes_no_earlier_output(attention):
    torch.manual_seed(0)
    model = OneLayerModel(vocab=11, d_model=16, n_head=2, attention=attention)
    tokens = torch.randint(0, 11, (3, 20))
    changed = tokens.clone()
    changed[:, 13] = (changed[:, 13] + 1) % 11
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :13], after[:, :13], rtol=0, atol=0)
    assert not torch.allclose(before[:, 13:], after[:, 13:])


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_model_gradients_are_finite(attention):
    torch.manual_seed(0)
    model = OneLayerModel(vocab=11, d_model=32, n_head=4, attention=attention)
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # large activations: the degree-6 score spans a wide range
    tokens = torch.randint(0, 11, (4, 64))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in model.named_parameters():
        assert torch.isfinite(parameter.grad).all() and parameter.grad.abs().sum() > 0, name


def test_unknown_attention_kind_is_refused():
    with pytest.raises(ValueError, match="'cosine' is not one of"):
        OneLayerModel(vocab=4, d_model=8, n_head=2, attention="cosine")


def literal_simplicial(q, k, r, v):
    """Σ_jl softmax_(j,l)(Σ_d q_id k_jd r_ld / sqrt(D)) v_j over j, l <= i, from the full T×T×T score tensor."""
    T, D = q.shape[-2:]
    scores = torch.einsum("...id,...jd,...ld->...ijl", q, k, r) / math.sqrt(D)
    i = torch.arange(T)
    future = (i[None, :, None] > i[:, None, None]) | (i[None, None, :] > i[:, None, None])
    weights = torch.softmax(scores.masked_fill(future, -math.inf).flatten(-2), dim=-1).view(scores.shape)
    return torch.einsum("...ijl,...jd->...id", weights, v)


@pytest.mark.parametrize("queries_per_block", [64, 3])  # one block, and blocks that split the queries
def test_simplicial_attention_and_gradients_equal_the_literal_einsum(monkeypatch, queries_per_block):
    monkeypatch.setattr(self_attention, "SIMPLICIAL_QUERIES", queries_per_block)
    q, k, r = (x.requires_grad_() for x in random_qkr(2, 3, 10, 6, seed=2))
    v = torch.randn(2, 3, 10, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, 10, 6, dtype=torch.float64)
    fast = simplicial_attention(q, k, r, v)
    literal = literal_simplicial(q, k, r, v)
    torch.testing.assert_close(fast, literal, rtol=1e-9, atol=1e-12)
    fast_grads = torch.autograd.grad((fast * weights).sum(), (q, k, r, v))
    literal_grads = torch.autograd.grad((literal * weights).sum(), (q, k, r, v))
    for a, b in zip(fast_grads, literal_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def test_simplicial_probabilities_gradient_matches_finite_differences(monkeypatch):
    monkeypatch.setattr(self_attention, "SIMPLICIAL_QUERIES", 2)
    q, k, r = (x.requires_grad_() for x in random_qkr(1, 2, 5, 4, seed=3))
    assert torch.autograd.gradcheck(_SimplicialProbs.apply, (q, k, r))


def test_simplicial_float32_with_wide_scores_matches_float64_literal():
    """Scores spread over hundreds: the clamped exponents change nothing visible."""
    q, k, r = (x * 4 for x in random_qkr(2, 2, 12, 8, dtype=torch.float32, seed=4))
    v = torch.randn(2, 2, 12, 8)
    fast = simplicial_attention(q, k, r, v)
    exact = literal_simplicial(q.double(), k.double(), r.double(), v.double())
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast.double(), exact, rtol=1e-4, atol=1e-5)


def test_score_magnitude_is_the_mean_absolute_causal_score():
    q, k, r = random_qkr(1, 2, 6, 4, seed=5)
    T = 6
    causal = torch.ones(T, T).tril().bool()
    dots = (q @ k.transpose(-1, -2) / 2)[..., causal]
    assert score_magnitude("standard", q, k).item() == pytest.approx(dots.abs().mean().item())
    gram = literal_gram_scores(q, k, r)[..., causal]
    assert score_magnitude("triple", q, k, r).item() == pytest.approx(gram.abs().mean().item())
    cube = torch.einsum("...id,...jd,...ld->...ijl", q, k, r) / 2
    i = torch.arange(T)
    past = (i[None, :, None] <= i[:, None, None]) & (i[None, None, :] <= i[:, None, None])
    assert score_magnitude("simplicial", q, k, r).item() == pytest.approx(cube[..., past].abs().mean().item(), rel=1e-6)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_loudness_scales_the_key_vectors_by_m_and_nothing_else(attention):
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 2, attention)
    x = torch.randn(2, 7, 16)
    loud = torch.ones(2, 7)
    loud[0, 3], loud[1, 5] = 4.0, 16.0
    plain, scaled = layer.heads(x), layer.heads(x, loud)
    names = ["q", "k", "r", "v"]
    key_side = {"k", "r"} if attention == "simplicial" else {"k"}
    for name, a, b in zip(names, plain, scaled):
        if a is None:
            continue
        factor = loud[:, None, :, None] if name in key_side and not KINDS[attention].loudness_invariant else 1.0
        torch.testing.assert_close(b, a * factor, rtol=1e-6, atol=1e-6)
    if not KINDS[attention].loudness_invariant:
        norms = scaled[1].norm(dim=-1) / plain[1].norm(dim=-1)
        assert norms[0, :, 3].tolist() == pytest.approx([4.0, 4.0]) and norms[1, :, 5].tolist() == pytest.approx(
            [16.0] * 2
        )


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_a_kind_is_flagged_loudness_invariant_exactly_when_m_leaves_its_output_unchanged(attention):
    """The table and figure mark a kind whose normalization divides m out; the flag must be the fact."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 2, attention)
    x = torch.randn(2, 9, 16)
    loud = torch.ones(2, 9)
    loud[:, 2] = 16.0  # a loud key every later query sees
    moved = (layer(x, loud) - layer(x)).abs().max().item()
    assert (moved < 1e-5) == KINDS[attention].loudness_invariant, moved


def test_soft_cap_is_the_capped_tempered_score_and_trains_its_temperature():
    """triple_capped: cap tanh(τ s / cap) of the seed's score, -inf above the diagonal, never beyond the cap,
    and the per-head log-temperature gets a finite gradient, also where scores lie far beyond the cap."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 2, "triple_capped")
    with torch.no_grad():
        layer.log_temperature.copy_(torch.tensor([0.0, 1.0]))
    x = torch.randn(1, 6, 16) * 20  # scores far beyond the cap
    q, k, r, v = layer.heads(x)
    raw = triple_scores(q, k, r)
    assert torch.equal(triple_scores(q, k, r, masked=False).masked_fill(raw == -math.inf, -math.inf), raw)
    capped = soft_capped(triple_scores(q, k, r, masked=False), layer.log_temperature.exp()[0, :, None, None], 50.0)
    tau = torch.tensor([1.0, math.e])[:, None, None]
    causal = raw.isfinite()
    torch.testing.assert_close(capped[causal], (50.0 * torch.tanh(raw * tau / 50.0))[causal])
    assert capped[~causal].eq(-math.inf).all() and capped[causal].abs().max() <= 50.0 and raw.abs().max() > 50.0
    layer(x).square().sum().backward()
    assert layer.log_temperature.grad.isfinite().all()  # no -inf under tanh, whose zero slope would give a NaN
    layer.zero_grad()
    expected = torch.softmax(capped, -1) @ v
    torch.testing.assert_close(layer(x), layer.out(expected.transpose(1, 2).reshape(x.shape)))
    layer(x / 20).square().sum().backward()  # inside the cap, where tanh has slope
    assert layer.log_temperature.grad.abs().min() > 0


@pytest.mark.parametrize("variant", MATCHED_CONTROLS)  # the pairs the report reads as variant and control
def test_a_matched_control_is_standard_attention_with_its_variants_stabilizer_and_nothing_else(variant):
    control = MATCHED_CONTROLS[variant]
    stabilizer = {field: getattr(KINDS[variant], field) for field in STABILIZERS}
    assert stabilizer == {field: getattr(KINDS[control], field) for field in STABILIZERS}
    assert any(value not in (None, False) for value in stabilizer.values())
    for kind, plain in ((control, "standard"), (variant, "triple")):  # without it, each is its plain kind
        unstabilized = {field: getattr(KINDS[plain], field) for field in (*STABILIZERS, "kernel")}
        assert replace(KINDS[kind], **unstabilized) == KINDS[plain]


def test_the_controls_attend_as_written_out():
    """standard_qknorm: softmax(τ q̂·k̂ / sqrt(D)) v with q, k rescaled to norm sqrt(D) before loudness;
    standard_capped: softmax(50 tanh(τ q·k / (50 sqrt(D)))) v; τ per head, learned."""
    torch.manual_seed(0)
    x, loud = torch.randn(2, 10, 16, dtype=torch.float64), torch.tensor([[1.0] * 9 + [8.0]] * 2, dtype=torch.float64)
    for kind in MATCHED_CONTROLS.values():
        layer = CausalSelfAttention(16, 2, kind).double()
        with torch.no_grad():
            layer.log_temperature.copy_(torch.tensor([0.3, -0.2]))
        q, k, v = (t.transpose(1, 2) for t in layer.proj(x).view(2, 10, 3, 2, 8).unbind(2))
        q, k = rope(torch.stack((q, k)))
        if kind == "standard_qknorm":
            q, k = (t * 8**0.5 / t.norm(dim=-1, keepdim=True) for t in (q, k))
        k = k * loud[:, None, :, None]
        s = q @ k.transpose(-1, -2) / 8**0.5 * layer.log_temperature.exp()[0, :, None, None]
        if kind == "standard_capped":
            s = 50 * torch.tanh(s / 50)
        s = s.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), -math.inf)
        expected = layer.out((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, 10, 16))
        torch.testing.assert_close(layer(x, loud), expected, rtol=1e-12, atol=1e-12)


def test_diff_attends_as_written_out():
    """diff: (1 - λ_init) RMSNorm(A_1 v - λ A_2 v) per head, A_a = causal softmax(q_a·k_a / sqrt(D/2)) over the
    halves of q and k, each half turned by RoPE on its own, a loud token's factor on the whole k, v of width D,
    λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init, λ_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for layer l = 3."""
    torch.manual_seed(0)
    B, T, C, H, D = 2, 10, 16, 2, 8
    layer = CausalSelfAttention(C, H, "diff", layer=2).double()
    x, loud = torch.randn(B, T, C, dtype=torch.float64), torch.ones(B, T, dtype=torch.float64)
    loud[:, 6] = 8.0
    q, k, v = (t.transpose(1, 2) for t in layer.proj(x).view(B, T, 3, H, D).unbind(2))  # [B, H, T, D]
    q1, q2, k1, k2 = (rope(half) for t in (q, k) for half in (t[..., : D // 2], t[..., D // 2 :]))
    k1, k2 = k1 * loud[:, None, :, None], k2 * loud[:, None, :, None]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    A1, A2 = (
        torch.softmax((torch.einsum("bhid,bhjd->bhij", qa, ka) / math.sqrt(D / 2)).masked_fill(future, -math.inf), -1)
        for qa, ka in ((q1, k1), (q2, k2))
    )
    init = 0.8 - 0.6 * math.exp(-0.3 * 2)
    lambda_q1, lambda_k1, lambda_q2, lambda_k2 = layer.lambdas[0]
    lam = torch.exp((lambda_q1 * lambda_k1).sum()) - torch.exp((lambda_q2 * lambda_k2).sum()) + init
    y = torch.einsum("bhij,bhjd->bhid", A1, v) - lam * torch.einsum("bhij,bhjd->bhid", A2, v)
    y = (1 - init) * y / torch.sqrt(y.square().mean(-1, keepdim=True) + 1e-5)
    expected = layer.out(y.transpose(1, 2).reshape(B, T, C))
    assert layer.lambda_init == pytest.approx(init) and layer.lambdas.shape == (1, 4, D // 2)
    torch.testing.assert_close(layer(x, loud), expected, rtol=1e-12, atol=1e-12)


def test_diff_takes_its_layers_lambda_init_and_standards_projections():
    """Block l of the residual model has λ_init(l), the one-layer model l = 1 (0.2); diff adds the four λ
    vectors of width D/2 to standard's parameters and nothing else."""
    model = ResidualModel(vocab=11, d_model=32, n_head=4, attention="diff", n_layer=3)
    inits = [block.attention.lambda_init for block in model.blocks]
    assert inits == pytest.approx([0.8 - 0.6 * math.exp(-0.3 * (l - 1)) for l in (1, 2, 3)])
    assert OneLayerModel(vocab=11, d_model=32, n_head=4, attention="diff").attention.lambda_init == pytest.approx(0.2)
    sizes = {
        kind: sum(p.numel() for p in CausalSelfAttention(32, 4, kind).parameters()) for kind in ("standard", "diff")
    }
    assert sizes["diff"] - sizes["standard"] == 4 * 4
    with pytest.raises(ValueError, match="multiple of 4"):
        CausalSelfAttention(12, 2, "diff")  # halves of width 3: RoPE turns pairs


def test_diff_equals_transformers_diffllama_attention_on_the_same_weights():
    """DiffLlamaAttention with 2 n_head heads of width D/2 pairs head h (q1, k1) with head n_head + h (q2, k2)
    and gives the pair the value [v_h | v_(n_head + h)]: our head h's halves, in that order. Its RoPE
    (rotate_half) turns the pairs (m, m + D/4) of a half, ours (seed 004's) the pairs (2m, 2m + 1) and writes
    them back as [first components | second]: with each half's q and k weight rows put in the order
    [even | odd], its turned q and k are ours, so the whole layer, RoPE with real positions included, is
    compared. DiffLlama sums λ's dot products in float32, hence the tolerance."""
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding

    torch.manual_seed(0)
    B, T, C, H, D = 2, 12, 32, 2, 16
    layer = CausalSelfAttention(C, H, "diff", layer=1).double()
    config = DiffLlamaConfig(
        hidden_size=C,
        num_attention_heads=2 * H,
        num_key_value_heads=2 * H,
        head_dim=D // 2,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    theirs = DiffLlamaAttention(config, layer_idx=1).double()
    Wq, Wk, Wv = layer.proj.weight.view(3, H, 2, D // 2, C)  # [head, half, row, C]
    turn = torch.cat((torch.arange(0, D // 2, 2), torch.arange(1, D // 2, 2)))
    with torch.no_grad():  # their head half * H + head is our head's half
        theirs.q_proj.weight.copy_(Wq[:, :, turn].transpose(0, 1).reshape(C, C))
        theirs.k_proj.weight.copy_(Wk[:, :, turn].transpose(0, 1).reshape(C, C))
        theirs.v_proj.weight.copy_(Wv.transpose(0, 1).reshape(C, C))
        theirs.o_proj.weight.copy_(layer.out.weight[0])
        for name, row in zip(("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"), layer.lambdas[0]):
            getattr(theirs, name).copy_(row)
    x = torch.randn(B, T, C, dtype=torch.float64)
    position_embeddings = DiffLlamaRotaryEmbedding(config)(x, torch.arange(T)[None])
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    expected, _ = theirs(x, position_embeddings, attention_mask=mask[None, None])
    assert theirs.lambda_init == pytest.approx(layer.lambda_init)
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-6)


def test_a_learned_scale_on_the_triple_score_is_its_temperature_times_the_score():
    """triple_qknorm keeps the fused kernel: τ s(q, k, r) = s(sqrt(τ) q, k, r), det Gram being quadratic in q."""
    torch.manual_seed(1)
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    layer = CausalSelfAttention(16, 2, "triple_qknorm").double()
    with torch.no_grad():
        layer.log_temperature.copy_(torch.tensor([0.4, -0.3]))
    q, k, r, v = layer.heads(x)
    scores = triple_scores(q, k, r) * layer.log_temperature.exp()[0, :, None, None]
    expected = layer.out((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 10, 16))
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-12)
