"""RoPE, standard, triple-product and 2-simplicial attention against explicit computations."""

from __future__ import annotations

import math

import pytest
import torch

import uph.attention.self_attention as self_attention
from uph.attention.model import OneLayerModel
from uph.attention.self_attention import (
    ATTENTIONS,
    KINDS,
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
    assert score_magnitude("standard", q, k) == pytest.approx(dots.abs().mean().item())
    gram = literal_gram_scores(q, k, r)[..., causal]
    assert score_magnitude("triple", q, k, r) == pytest.approx(gram.abs().mean().item())
    cube = torch.einsum("...id,...jd,...ld->...ijl", q, k, r) / 2
    i = torch.arange(T)
    past = (i[None, :, None] <= i[:, None, None]) & (i[None, None, :] <= i[:, None, None])
    assert score_magnitude("simplicial", q, k, r) == pytest.approx(cube[..., past].abs().mean().item(), rel=1e-6)


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
    """triple_capped: cap tanh(τ s / cap) of the seed's score, -inf kept above the diagonal, never beyond
    the cap, and the per-head log-temperature gets a gradient."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 2, "triple_capped")
    with torch.no_grad():
        layer.log_temperature.copy_(torch.tensor([0.0, 1.0]))
    x = torch.randn(1, 6, 16) * 20  # scores far beyond the cap
    q, k, r, v = layer.heads(x)
    raw = triple_scores(q, k, r)
    capped = soft_capped(raw, layer.log_temperature.exp(), 50.0)
    tau = torch.tensor([1.0, math.e])[:, None, None]
    causal = raw.isfinite()
    torch.testing.assert_close(capped[causal], (50.0 * torch.tanh(raw * tau / 50.0))[causal])
    assert capped[~causal].eq(-math.inf).all() and capped[causal].abs().max() <= 50.0 and raw.abs().max() > 50.0
    expected = torch.softmax(capped, -1) @ v
    torch.testing.assert_close(layer(x), layer.out(expected.transpose(1, 2).reshape(x.shape)))
    layer(x / 20).square().sum().backward()  # inside the cap, where tanh has slope
    assert layer.log_temperature.grad.abs().min() > 0
