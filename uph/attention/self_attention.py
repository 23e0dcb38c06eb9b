"""Causal self-attention with RoPE: the standard dot-product score, seed 004's triple product and the
trilinear 2-simplicial score.

RoPE (seed 004's layout): the pairs (x[2m], x[2m+1]) of a head vector at position t turn by the
angle t * 10000^(-2m/D) and are written back as [all first components | all second components].
Every vector of one position turns the same way, so a dot product of rotated vectors depends on
their positions only through the offset j - i.

Standard score:        s_ij = q_i·k_j / sqrt(D)
Triple-product score:  s_ij = -det Gram(q_i, k_j, r_i) / D^1.5   (RoPE on q, k and r)

Writing ab for a·b, with qk_ij = q_i·k_j, rk_ij = r_i·k_j, δ_i = qq rr - qr² (the Gram determinant
of q_i, r_i), w_i = rr q_i - qr r_i and z_i = qq r_i - qr q_i (its adjugate applied to (q_i, r_i)),

    det = qq kk rr + 2 qk rk qr - qq rk² - kk qr² - rr qk²
        = kk_j δ_i - qk_ij (w_i·k_j) - rk_ij (z_i·k_j)
        = kk_j δ_i - [(w_i·k_j)² + δ_i rk_ij²] / rr_i .

The forward uses the last line: two thin matmuls against k (rows w_i and r_i, pre-scaled by the
per-position factors), a square, a fused multiply-add and a rank-one update, in place in at most
two T×T buffers, in float32 at least whatever the input dtype (det is a difference of large terms).
The backward recomputes qk and rk from the saved q, k, r instead of keeping them; with
H = dL/ds (zero above the diagonal), c = -1/D^1.5, h_i = Σ_j H_ij kk_j, M1 = (H⊙qk) k,
M2 = (H⊙rk) k, and the row sums Σ_j H qk² = q·M1, Σ_j H rk² = r·M2, Σ_j H qk rk = r·M1:

    dL/dq_i = 2c [(rr h - r·M2) q + qr M2 - rr M1 + (r·M1 - qr h) r]_i
    dL/dr_i = 2c [(qq h - q·M1) r + qr M1 - qq M2 + (r·M1 - qr h) q]_i
    dL/dk_j = 2c [(Σ_i H_ij δ_i) k_j - ((H⊙qk)ᵀ w)_j - ((H⊙rk)ᵀ z)_j]

(the polynomial form, free of the forward's division by rr). `triple_normed` is a third attention
kind, not in the seed: the same score on q, k, r rescaled to norm sqrt(D), which bounds it to
[-D^1.5, 0]; the seed's degree-6 score otherwise grows with the sixth power of the activations.

`simplicial` is the trilinear 2-simplicial score (Clift et al. 2019; Roy et al. 2025, "Fast and
Simplex") over the same q, k, r: query i attends to pairs of earlier keys (j, l), j, l <= i,

    s_ijl = Σ_d q_id k_jd r_ld / sqrt(D),   A_ijl = softmax_(j,l)(s_ijl),   y_i = Σ_jl A_ijl v_j ,

Roy et al.'s value v_j ∘ v'_l with v' = 1, so the kind has the triple product's four projections.
RoPE turns q and k, not r: with r_l constant the score is the standard RoPE dot product, so the
kind contains standard attention. The attention of i to j is the marginal P_ij = Σ_l A_ijl. The
forward computes s one block of queries at a time in float32 and keeps only the log-normalizer
lse_i; the backward recomputes the block and, with G_ijl = A_ijl (dP_ij - Σ_j' P_ij' dP_ij') / sqrt(D),

    dL/dq_i = Σ_jl G_ijl k_j ∘ r_l,   dL/dk_j = Σ_il G_ijl q_i ∘ r_l,   dL/dr_l = Σ_ij G_ijl q_i ∘ k_j .

`KINDS` is the table of kinds CausalSelfAttention reads: per kind an AttentionKind entry says its
family, how many head vectors it projects, which RoPE turns, which a loud token scales, how it scores
them (blocks of causal scores, also what mean |score| reads), its fused kernel if any, any step before
loudness or between loudness and scoring, a soft cap, and whether loudness divides out by
construction. Beside the seed's `triple`, three stabilized variants keep its score: `triple_normed`
(normalized after loudness, so m divides out: it cannot test loudness), `triple_qknorm` (QK-norm:
normalized before loudness, so the loud key keeps its m, with a learned per-head scale) and
`triple_capped` (a learned temperature and a tanh cap). `standard_qknorm` and `standard_capped` are
their matched controls: standard attention with the same stabilizer and nothing else changed, so a
resilience the triple variant shows can be told from the stabilizer's. Adding a kind is one entry and
its score function; with no kernel it attends by a softmax over the keys of its one score block.

`diff` is differential attention (Ye et al. 2024, "Differential Transformer"; DiffLlama in
transformers). Each of the n_head heads is one differential head: its q and k of width D split into
halves q = [q1 | q2], k = [k1 | k2] of width D/2, its v keeps the full width D, so the projections are
standard's (q, k, v of d_model each) and only the four λ vectors are added. This is the paper's layout
(h = d_model / 2d heads, W_Q, W_K, W_V: d_model -> 2d per head) and DiffLlama's, whose 2 n_head heads of
width D/2 pair head h with head n_head + h and share the value [v_h | v_(n_head + h)] between them:

    A_a = causal softmax(q_a k_a^T / sqrt(D/2)) (a = 1, 2),   y = (1 - λ_init) RMSNorm(A_1 v - λ A_2 v),
    λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init,   λ_init = 0.8 - 0.6 exp(-0.3 (l - 1)),

scaled by the halves' width as both, the RMSNorm per head over its D outputs without affine (eps 1e-5,
the paper's and DiffLlama's groupnorm), λ one scalar per layer shared by its heads, λ_q1 .. λ_k2 of width
D/2 drawn from N(0, 0.1), l the layer's 1-based index (CausalSelfAttention's `layer` + 1). RoPE turns
each half on its own (frequencies of width D/2), as the paper turns its 2h heads of width d: turning the
whole vector would put all first pair components in q1 and all second ones in q2. A loud token's factor
multiplies the whole k, so both key halves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from uph.attention.runs import RunLinear, runs_of, with_run_dim

SIMPLICIAL_BLOCK = 2**22  # most score entries in one block of queries of the 2-simplicial kernel (16 MiB in float32)
SIMPLICIAL_QUERIES = 8  # most queries in one block
ROPE_BASE = 10000.0
DIFF_EPS = 1e-5  # diff's per-head RMSNorm epsilon (the paper's and DiffLlama's default)


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotate head vectors x [..., T, D] by their position 0..T-1 (seed 004's RoPE, angles in float32)."""
    T, D = x.shape[-2:]
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    angles = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv_freq
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _future(T: int, device: torch.device) -> torch.Tensor:
    """[T, T] bool, True where key j lies after query i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).triu_(1)


def _dots(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor):
    """Per-position Gram entries qq, rr, qr [..., T], kk [..., T] and δ = qq rr - qr²."""
    qq, rr, qr, kk = (q * q).sum(-1), (r * r).sum(-1), (q * r).sum(-1), (k * k).sum(-1)
    return qq, rr, qr, kk, qq * rr - qr * qr


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[..., T, X] -> [N, T, X], a view."""
    return x.reshape(-1, *x.shape[-2:])


def triple_scores(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """Causal triple-product scores -det Gram(q_i, k_j, r_i) / D^1.5 [..., T, T], -inf above the diagonal
    (`masked` False: every entry)."""
    with torch.autocast(q.device.type, enabled=False):
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, r = q.to(dtype), k.to(dtype), r.to(dtype)
        T, scale = q.shape[-2], q.shape[-1] ** -1.5
        qq, rr, qr, kk, delta = _dots(q, k, r)
        delta = delta.clamp_min(0)  # a Gram determinant; rounding can dip below 0
        rr = rr.clamp_min(torch.finfo(dtype).tiny)  # r = 0 gives w = 0, δ = 0: score 0
        u = (rr[..., None] * q - qr[..., None] * r) * (scale / rr).sqrt()[..., None]
        v = r * (scale * delta / rr).sqrt()[..., None]
        kt = k.transpose(-2, -1)
        scores = (u @ kt).square_()  # D^-1.5 (w·k)² / rr
        vk = v @ kt
        scores.addcmul_(vk, vk)  # + D^-1.5 δ (r·k)² / rr
        del vk
        _flat(scores).baddbmm_(_flat(delta[..., None]), _flat(kk[..., None, :]), alpha=-scale)
        return scores.masked_fill_(_future(T, q.device), float("-inf")) if masked else scores


class _TripleProductProbs(torch.autograd.Function):
    """softmax_j(triple_scores(q, k, r)); saves q, k, r and the probabilities, recomputes qk and rk."""

    @staticmethod
    def forward(ctx, q, k, r):
        probs = torch.softmax(triple_scores(q, k, r), dim=-1)
        ctx.save_for_backward(q, k, r, probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs):
        q_in, k_in, r_in, probs = ctx.saved_tensors
        with torch.autocast(probs.device.type, enabled=False):
            q, k, r = q_in.to(probs.dtype), k_in.to(probs.dtype), r_in.to(probs.dtype)
            c = -2 * q.shape[-1] ** -1.5
            H = torch.ops.aten._softmax_backward_data(grad_probs.to(probs.dtype), probs, -1, probs.dtype)
            qq, rr, qr, kk, delta = _dots(q, k, r)
            h = (H @ kk[..., None]).squeeze(-1)
            h_delta = (delta[..., None, :] @ H).squeeze(-2)  # Σ_i H_ij δ_i
            w = rr[..., None] * q - qr[..., None] * r
            z = qq[..., None] * r - qr[..., None] * q
            kt = k.transpose(-2, -1)
            Hqk = (q @ kt).mul_(H)  # one T×T product alive at a time
            M1, grad_k = Hqk @ k, h_delta[..., None] * k - Hqk.transpose(-2, -1) @ w
            del Hqk
            Hrk = (r @ kt).mul_(H)
            del H
            M2 = Hrk @ k
            grad_k -= Hrk.transpose(-2, -1) @ z
            del Hrk
            qM1, rM1, rM2 = (q * M1).sum(-1), (r * M1).sum(-1), (r * M2).sum(-1)
            cross = (rM1 - qr * h)[..., None]
            grad_q = (rr * h - rM2)[..., None] * q + qr[..., None] * M2 - rr[..., None] * M1 + cross * r
            grad_r = (qq * h - qM1)[..., None] * r + qr[..., None] * M1 - qq[..., None] * M2 + cross * q
        return (c * grad_q).to(q_in.dtype), (c * grad_k).to(k_in.dtype), (c * grad_r).to(r_in.dtype)


def triple_product_attention(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention [..., T, D] with the triple-product score (RoPE already applied to q, k, r)."""
    probs = _TripleProductProbs.apply(q, k, r)
    return probs.to(v.dtype) @ v


def _simplicial_blocks(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor):
    """Blocks of the 2-simplicial scores: (start, end, qk, s, causal) for queries start..end-1 over keys
    j, l < end (q, k, r flat [N, T, D]): qk = q_i ∘ k_j [N, c·end, D] (rows (i, j)), s_ijl [N, c·end, end]
    unmasked, causal [c·end, end] 1.0 where j, l <= i, else 0.0. Small blocks skip most of the
    non-causal cube."""
    N, T, D = q.shape
    step = max(1, min(SIMPLICIAL_QUERIES, SIMPLICIAL_BLOCK // (N * T * T)))
    for start in range(0, T, step):
        end = min(T, start + step)
        qk = (q[:, start:end, None, :] * k[:, None, :end, :]).flatten(1, 2)
        scores = torch.bmm(qk, r[:, :end].transpose(-2, -1)).mul_(D**-0.5)
        query, keys = torch.arange(start, end, device=q.device)[:, None, None], torch.arange(end, device=q.device)
        causal = ((keys[:, None] <= query) & (keys <= query)).flatten(0, 1).to(scores.dtype)
        yield start, end, qk, scores, causal


def _softmax_numerators(scores: torch.Tensor, causal: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """exp(s - shift_i) on causal entries, 0 elsewhere, in place (shift [N, c], s [N, c·end, end]);
    exponents are clamped to [-80, 0]: the vectorized exp slows down many times on -inf and
    underflow, and e^-80 < 2e-35 of the largest term."""
    rows = scores.view(*shift.shape, -1)
    return rows.sub_(shift[..., None]).clamp_(-80, 0).exp_().view_as(scores).mul_(causal)


class _SimplicialProbs(torch.autograd.Function):
    """P_ij = Σ_l softmax_(j,l)(s_ijl) [..., T, T]; saves q, k, r and lse_i, recomputes s block by block."""

    @staticmethod
    def forward(ctx, q_in, k_in, r_in):
        with torch.autocast(q_in.device.type, enabled=False):
            dtype = torch.promote_types(q_in.dtype, torch.float32)
            q, k, r = (_flat(x).to(dtype) for x in (q_in, k_in, r_in))
            N, T, _ = q.shape
            probs, lse = q.new_zeros(N, T, T), q.new_empty(N, T)
            for start, end, _, scores, causal in _simplicial_blocks(q, k, r):
                top = (scores + causal.log()).view(N, end - start, -1).amax(-1)  # max over causal entries
                numerators = _softmax_numerators(scores, causal, top).view(N, end - start, end, end)
                total = numerators.sum((-2, -1))
                lse[:, start:end] = top + total.log()
                probs[:, start:end, :end] = numerators.sum(-1) / total[..., None]
        ctx.save_for_backward(q_in, k_in, r_in, lse)
        return probs.view(*q_in.shape[:-1], T)

    @staticmethod
    def backward(ctx, grad_probs):
        q_in, k_in, r_in, lse = ctx.saved_tensors
        with torch.autocast(lse.device.type, enabled=False):
            q, k, r = (_flat(x).to(lse.dtype) for x in (q_in, k_in, r_in))
            dP = _flat(grad_probs).to(lse.dtype)
            N, T, D = q.shape
            grad_q, grad_k, grad_r = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(r)
            for start, end, qk, scores, causal in _simplicial_blocks(q, k, r):
                c = end - start
                A = _softmax_numerators(scores, causal, lse[:, start:end]).view(N, c, end, end)
                dP_block = dP[:, start:end, :end]
                centered = dP_block - (A.sum(-1) * dP_block).sum(-1, keepdim=True)
                G = A.mul_(centered[..., None].mul_(D**-0.5)).view(N, c * end, end)  # rows (i, j), columns l
                Gr = torch.bmm(G, r[:, :end]).view(N, c, end, D)  # Σ_l G_ijl r_l
                grad_q[:, start:end] = (Gr * k[:, None, :end, :]).sum(-2)
                grad_k[:, :end] += (Gr * q[:, start:end, None, :]).sum(1)
                grad_r[:, :end] += torch.bmm(G.transpose(-2, -1), qk)
        return tuple(g.view(x.shape).to(x.dtype) for g, x in ((grad_q, q_in), (grad_k, k_in), (grad_r, r_in)))


def simplicial_attention(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention [..., T, D] with the 2-simplicial score, values v_j (RoPE already applied to q, k)."""
    probs = _SimplicialProbs.apply(q, k, r)
    return probs.to(v.dtype) @ v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention over [..., H, T, D] as one [N, H, T, D] batch (4-D takes the fused
    kernels: on a CPU 1.5x faster, backward included, than 5-D runs x batch at the study's sizes)."""
    flat = [t.reshape(-1, *t.shape[-3:]) for t in (q, k, v)]
    return F.scaled_dot_product_attention(*flat, **options).view(*q.shape[:-1], v.shape[-1])


def standard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q·k / sqrt(D)) v (RoPE already applied to q, k)."""
    return _sdpa(q, k, v, is_causal=True)


def standard_scores(q: torch.Tensor, k: torch.Tensor, r: None = None, masked: bool = True) -> list[torch.Tensor]:
    """[q_i·k_j / sqrt(D)] [..., T, T], -inf above the diagonal (`masked` False: every entry): one block."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    return [scores.masked_fill(_future(q.shape[-2], q.device), -math.inf) if masked else scores]


def simplicial_scores(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor) -> list[torch.Tensor]:
    """s_ijl in float32 one block of queries at a time, -inf where j or l lies after i."""
    return [s.masked_fill(c == 0, -math.inf) for *_, s, c in _simplicial_blocks(*(_flat(x).float() for x in (q, k, r)))]


def differential_scores(q: torch.Tensor, k: torch.Tensor, r: None = None) -> list[torch.Tensor]:
    """diff's two score maps q_a·k_a / sqrt(D/2) over the halves (a = 1, 2), -inf above the diagonal: two blocks."""
    return [standard_scores(qa, ka)[0] for qa, ka in zip(q.chunk(2, -1), k.chunk(2, -1))]


def halves_turned(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
    """diff's RoPE: each half of q and k turned on its own, as a head vector of width D/2."""
    turned = rope(torch.stack([half for t in vectors for half in t.chunk(2, -1)]))  # q1, q2, k1, k2
    return [torch.cat((turned[i], turned[i + 1]), dim=-1) for i in range(0, len(turned), 2)]


def lambda_init(layer: int) -> float:
    """diff's λ_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for the 0-based `layer` = l - 1 (0.2 for the first)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def differential_lambda(lambdas: torch.Tensor, init: float) -> torch.Tensor:
    """λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init [...]; `lambdas` [..., 4, D/2]: rows λ_q1, λ_k1, λ_q2, λ_k2."""
    q1, k1, q2, k2 = lambdas.unbind(-2)
    return (q1 * k1).sum(-1).exp() - (q2 * k2).sum(-1).exp() + init


def differential_attention(q, k, v, lam: torch.Tensor, init: float) -> torch.Tensor:
    """Causal (1 - λ_init) RMSNorm(A_1 v - λ A_2 v) [..., T, D], A_a = softmax(q_a·k_a / sqrt(D/2)) over the
    halves q = [q1 | q2], k = [k1 | k2] (RoPE already applied to each), v of the full width D; λ shaped to
    broadcast against v. q_a·k_a is the dot of q with its other half zeroed and the whole k: SDPA's fused
    kernels want v as wide as q and k."""
    first = torch.arange(q.shape[-1], device=q.device) < q.shape[-1] // 2  # q1's components
    scale = (q.shape[-1] // 2) ** -0.5
    A1v, A2v = (_sdpa(q * half, k, v, is_causal=True, scale=scale) for half in (first, ~first))
    y = A1v - lam.to(v.dtype) * A2v
    return (1 - init) * F.rms_norm(y, y.shape[-1:], eps=DIFF_EPS)


def normalized(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every vector rescaled to norm sqrt(D) (triple_normed): the triple score is then bounded to [-D^1.5, 0]."""
    return [t * (t.shape[-1] ** 0.5 / t.norm(dim=-1, keepdim=True).clamp_min(1e-6)) for t in vectors]


def soft_capped(scores: torch.Tensor, temperature: torch.Tensor, cap: float) -> torch.Tensor:
    """cap tanh(τ s / cap) per head (τ shaped to broadcast against s, e.g. [R, 1, n_head, 1, 1] for s
    [R, B, n_head, T, T]), -inf off the causal entries: Gemma 2's logit soft cap after a learned
    temperature. Near 0 it is τ s; it never leaves (-cap, cap). The scores come unmasked (every entry finite)
    and the causal mask follows the cap: a -inf under tanh, whose slope is 0 there, would give τ a NaN
    gradient, and masking once is two passes over the scores fewer than masking around the cap."""
    capped = cap * torch.tanh(scores * temperature / cap)
    return capped.masked_fill(_future(scores.shape[-1], scores.device), -math.inf)


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind: the head vectors it projects and how it scores them. A new kind or variant is
    one entry in KINDS and its score function (plus its name in the config's list of kinds, `attention_kind` in
    schemas/defs.schema.yaml: tests/test_registries.py holds the two equal)."""

    family: str  # what it scores with: "standard" (q·k), "triple" (a Gram determinant), "simplicial"
    vectors: int  # projected head vectors before v: 2 (q, k) or 3 (q, k, r)
    turned: int  # RoPE turns the first `turned` of them
    loud: tuple[int, ...]  # the key-side vectors a loud token's factor multiplies (1: k, 2: r)
    # (q, k, r) -> blocks of scores, -inf off the causal entries (mean |score| reads them); a soft-capped kind's
    # also takes masked=False: every entry, for soft_capped
    scores: Callable
    kernel: Callable | None = None  # (q, k, r, v) -> y, a fused kernel; None: softmax over keys of the one block
    before_loud: Callable | None = None  # [q, k(, r)] -> the same after RoPE, before loudness (diff: its RoPE)
    prepare: Callable | None = None  # [q, k(, r)] -> the same after loudness, before scoring
    temperature: bool = False  # scores times a learned per-head temperature tau (1 at the start)
    q_degree: int = 1  # s(c q, k, r) = c^q_degree s(q, k, r): tau s is the score of tau^(1/q_degree) q
    soft_cap: float | None = None  # then cap tanh(tau s / cap) (soft_capped); needs `temperature`
    loudness_invariant: bool = False  # a loud key's factor m divides out of its scores (by construction)
    differential: bool = False  # a learned λ per layer; attends by differential_attention (diff)

    def attend(self, q, k, r, v, temperature=None, lam: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        if self.differential:  # lam: (λ, λ_init) of the layer
            return differential_attention(q, k, v, *lam)
        if self.temperature and self.soft_cap is None:  # τ s(q, k, r) = s(τ^(1 / q_degree) q, k, r): the kernel stays
            q = q * temperature ** (1 / self.q_degree)
        if self.kernel is not None:
            return self.kernel(q, k, r, v)
        if self.soft_cap is not None:
            (scores,) = self.scores(q, k, r, masked=False)
            scores = soft_capped(scores, temperature, self.soft_cap)
        else:
            (scores,) = self.scores(q, k, r)
        return torch.softmax(scores, dim=-1).to(v.dtype) @ v


STANDARD = AttentionKind(
    family="standard",
    vectors=2,
    turned=2,
    loud=(1,),
    scores=standard_scores,
    kernel=lambda q, k, r, v: standard_attention(q, k, v),
)
TRIPLE = AttentionKind(
    family="triple",
    vectors=3,
    turned=3,
    loud=(1,),
    scores=lambda q, k, r, masked=True: [triple_scores(q, k, r, masked)],
    kernel=triple_product_attention,
    q_degree=2,  # det Gram(c q, k, r) = c^2 det Gram(q, k, r)
)
# The stabilizers, each given to the triple score and, as its matched control, to the standard one with
# nothing else changed (STABILIZERS: a test holds each pair to the same fields): Gemma 2's soft cap after a
# learned per-head temperature, and QK-norm (every head vector rescaled to norm sqrt(D) before loudness,
# so a loud key keeps its factor m) with the learned per-head scale QK-norm is used with.
CAPPED = {"kernel": None, "temperature": True, "soft_cap": 50.0}
QKNORM = {"temperature": True, "before_loud": normalized}
STABILIZERS = ("temperature", "soft_cap", "before_loud", "prepare")  # the fields a stabilizer sets
KINDS = {
    "standard": STANDARD,
    "triple": TRIPLE,  # seed 004's score as it is
    # triple_normed: q, k, r rescaled to norm sqrt(D) after loudness; m divides out, so it cannot test loudness
    "triple_normed": replace(TRIPLE, prepare=normalized, loudness_invariant=True),
    # triple_capped: seed 004's score, then the cap; the score's form, RoPE on q, k, r and the loud key's
    # scaling are the seed's, only its range is bounded
    "triple_capped": replace(TRIPLE, **CAPPED),
    "standard_capped": replace(STANDARD, **CAPPED),  # triple_capped's matched control
    # triple_qknorm: a loud key has norm m sqrt(D) and its Gram determinant grows with m^2: the seed's score
    # and its claim that a loud mismatched key scores lower stay; the activations' sixth power no longer sets
    # the scores' scale
    "triple_qknorm": replace(TRIPLE, **QKNORM),
    "standard_qknorm": replace(STANDARD, **QKNORM),  # triple_qknorm's matched control
    "simplicial": AttentionKind(
        family="simplicial", vectors=3, turned=2, loud=(1, 2), scores=simplicial_scores, kernel=simplicial_attention
    ),
    # diff: differential attention; RoPE turns q's and k's halves on their own (halves_turned, so none on the
    # whole vector), the loud factor scales the whole k, the two score maps are the mean |score|'s blocks
    "diff": AttentionKind(
        family="differential",
        vectors=2,
        turned=0,
        loud=(1,),
        scores=differential_scores,
        before_loud=halves_turned,
        differential=True,
    ),
}
ATTENTIONS = tuple(KINDS)


def score_magnitude(kind: str, q: torch.Tensor, k: torch.Tensor, r: torch.Tensor | None = None) -> torch.Tensor:
    """[R] each run's mean |score| over the causal entries (i, j), or (i, j, l) for simplicial, of turned
    head vectors [R, ..., T, D]."""
    with torch.no_grad():
        blocks = [s.reshape(q.shape[0], -1) for s in KINDS[kind].scores(q, k, r)]
        total = sum(s.abs().nan_to_num_(posinf=0.0).sum(1) for s in blocks)  # -inf off the causal entries
        return total / sum(s.isfinite().sum(1) for s in blocks)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE inside, as seed 004 builds both kinds, for `runs`
    independent runs (uph.attention.runs: every weight has a leading run dimension).

    One bias-free projection makes the kind's head vectors (q, k, v or q, k, r, v) for every head, RoPE
    turns the kind's `turned` first ones, the heads attend, one bias-free projection mixes them back.
    x is [R, B, T, C] (or [B, T, C] for one run). `loud` [R, B, T] (optional) multiplies the key-side
    vectors of each position, after RoPE and the kind's `before_loud` (triple_qknorm's normalization),
    before its `prepare` (triple_normed's): a loud token's k (and r, the second key, for simplicial) grow
    by its factor, as the loud mismatch of seed 004's resilience table (|k| = m); its query and value stay
    as they are. With `measure_scores` set, each forward stores each run's mean |score| over causal entries
    in `score_abs` [R] (an extra score computation; for probes only). `layer`: the layer's 0-based index in
    its model (diff's λ_init reads it).
    """

    def __init__(self, d_model: int, n_head: int, kind: str, layer: int = 0, runs: int = 1):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"attention kind {kind!r} is not one of {tuple(KINDS)}")
        self.kind, self.n_head = kind, n_head
        self.n_proj = KINDS[kind].vectors + 1
        self.proj = RunLinear(runs, d_model, self.n_proj * d_model)
        self.out = RunLinear(runs, d_model, d_model)
        if KINDS[kind].temperature:  # log of the learned per-head temperature τ, τ = 1 at the start
            self.log_temperature = nn.Parameter(torch.zeros(runs, n_head))
        if KINDS[kind].differential:  # diff's λ_q1, λ_k1, λ_q2, λ_k2 of width D/2, N(0, 0.1), and its λ_init
            if d_model // n_head % 4:
                raise ValueError(
                    f"diff needs a head width that is a multiple of 4 (RoPE turns its halves), not {d_model // n_head}"
                )
            self.lambdas = nn.Parameter(torch.empty(runs, 4, d_model // n_head // 2))
            self.lambda_init = lambda_init(layer)
        self.measure_scores, self.score_abs = False, None
        for r in range(runs):
            self.init_run(r)

    def init_run(self, r: int) -> None:
        """Run r's own weights, drawn after its projections' (the order of a one-run constructor)."""
        if KINDS[self.kind].differential:
            self.lambdas.data[r] = 0.1 * torch.randn(self.lambdas.shape[1:])

    def heads(self, x: torch.Tensor, loud: torch.Tensor | None = None):
        """q, k, r (None for a kind without it), v [R, B, n_head, T, head width] as the score sees them
        ([B, n_head, T, head width] for x [B, T, C])."""
        x, loud, one = with_run_dim(x, loud, runs_of(self), 3)
        vectors = self._heads(x, loud)
        return tuple(t[0] if one and t is not None else t for t in vectors)

    def _heads(self, x: torch.Tensor, loud: torch.Tensor | None):
        R, B, T, C = x.shape
        kind = KINDS[self.kind]
        heads = self.proj(x).view(R, B, T, self.n_proj, self.n_head, C // self.n_head).permute(3, 0, 1, 4, 2, 5)
        # one copy into [n_proj, R, B, H, T, D]; split, not sliced: a slice's backward fills a zero tensor
        # of the whole projection for each vector
        turned, rest, v = heads.contiguous().split([kind.turned, self.n_proj - 1 - kind.turned, 1])
        vectors = [*(rope(turned) if kind.turned else turned), *rest]
        if kind.before_loud is not None:
            vectors = kind.before_loud(vectors)
        if loud is not None:
            factor = loud[:, :, None, :, None].to(vectors[1].dtype)
            for i in kind.loud:
                vectors[i] = vectors[i] * factor
        if kind.prepare is not None:
            vectors = kind.prepare(vectors)
        q, k, *r = vectors
        return q, k, (r[0] if r else None), v[0]

    def forward(self, x: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        x, loud, one = with_run_dim(x, loud, runs_of(self), 3)
        q, k, r, v = self._heads(x, loud)
        if self.measure_scores:
            self.score_abs = score_magnitude(self.kind, q, k, r)
        kind = KINDS[self.kind]
        temperature = self.log_temperature.exp()[:, None, :, None, None] if kind.temperature else None
        lam = None
        if kind.differential:  # (λ [R, 1, 1, 1, 1], λ_init) of the layer
            lam = (differential_lambda(self.lambdas, self.lambda_init)[:, None, None, None, None], self.lambda_init)
        y = self.out(kind.attend(q, k, r, v, temperature, lam).transpose(2, 3).reshape(x.shape))
        return y[0] if one else y
