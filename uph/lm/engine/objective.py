"""Seed 002's objective J for every head, its gradient, and the round that evaluates it for several fits at once.

For tokens t = 1..n with base logits z0_t = OutputLayer.logits(h_t) (the model's own, see
uph.lm.data.models) and head logits z_t = z0_t + P u_t, where u_t = theta ⊙ a_t (a_t = A h_t for
conditional heads, a_t = 1 otherwise; see uph.lm.engine.heads):

    J(theta) = mean_t [CE(z_t, y_t) + beta KL(p0_t ‖ p_t)] + lam ‖theta‖²   over ‖theta‖ <= radius.

Both terms need only the change of log-partition L_t = log Σ_v p0_tv exp(P_v · u_t):

    CE_t = nll0_t + L_t - P_{y_t} · u_t          KL_t = L_t - m_t · u_t,   m_t = P^T p0_t
    J(theta)  = mean nll0 + (1 + beta) mean_t L_t - theta · (ybar + beta mbar) + lam ‖theta‖²
    ∇J(theta) = (1 + beta) mean_t a_t ⊙ P^T p_t - (ybar + beta mbar) + 2 lam theta

with ybar = mean_t a_t ⊙ P_{y_t}, mbar = mean_t a_t ⊙ m_t, p_t = softmax(z_t). So p0 [n, V] is
computed once per split (`uph.lm.engine.tokens.prepare`: the only V×H products), a, ybar and mbar once per head
(`Objective`); an evaluation costs, per chunk of c tokens, two [c, d]×[d, V] products and one exp
(conditional heads), or two passes over p0 (unconditional heads: P theta is the same for every
token). p0 need only be known up to a factor per token: every L_t is taken relative to its value
at the objective's base, computed by the same code, so the KL is exactly 0 there. J is convex
(strictly for lam > 0), so the minimizer is unique.

Residual fits: with `offset` theta_g (the global theta, held fixed) the base becomes
p_g ∝ p0 exp(P (theta_g ⊙ a_t)) and theta is the user's residual on top of it: the same J with
p0 -> p_g, nll0 -> the global NLL, evaluated at theta_g + theta (u is linear in theta). The
full-vocabulary bias (P = I, d = V) is the unconditional head in the limit d = V.

Numerics: every log-partition is a log-sum-exp. The fast path multiplies the cached p0 by
exp(P u - shift); where that sum underflows (a tilt that moves all mass onto tokens whose p0 is
below float32's range, e.g. logits spanning over 100 nats) those tokens are recomputed exactly
from their logits in log space, so no objective is ever -inf. An evaluation runs the fast path over
every chunk first, flagging the chunks that need more (an underflow; for conditional heads also a
tilt past EXP_SAFE, which each token's max tilt, subtracted first, keeps in range), and mends them
after one read of all the flags with the pass's sums, reading the mended chunks back together once
more (uph.lm.engine.lockstep: a round of several users' evaluations reads no more): nothing is read back per
chunk, so a GPU never waits on the host mid-pass.

A round (`evaluate_many`) evaluates several Objectives at their thetas (uph.lm.engine.lockstep: a job's
users in lockstep): every fast pass is queued on the device back to back, one read brings back all their
sums and flags, and one more reads every mended chunk. Each objective's arithmetic is its own, so its
Value is bit for bit the same however many share its round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from uph.device import DEVICE_PART
from uph.lm.engine.heads import Head
from uph.lm.engine.tokens import Chunk, Tokens

VOCAB_BLOCK = 4096  # vocabulary rows per work block on a CPU (vocab_block): [VOCAB_BLOCK, CHUNK] float32 is 4 MB
EXP_SAFE = 60.0  # |P_v · u_t| below this cannot overflow or underflow the float32 exp sums
UNDERFLOW = 1e-30  # a fast-path partition sum below this is recomputed exactly in log space
LOG2E = 1.4426950408889634


def vocab_block(device: torch.device, vocab: int) -> int:
    """Vocabulary rows per work block on `device`. A CPU walks the vocabulary in blocks of VOCAB_BLOCK
    rows, so that the passes over a block's [VOCAB_BLOCK, c] products hit its cache; a GPU has no cache to
    fit them in and pays a kernel launch per block and pass instead, so it takes the whole vocabulary as
    one block ([V, c] float32: 600 MB at V = 152k and c = GPU_CHUNK, uph.lm.engine.tokens.chunk_size)."""
    return VOCAB_BLOCK if device.type == "cpu" else vocab


_SCRATCH: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def shared_scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """`numel` elements of the one work buffer that every Objective on `device` in `dtype` writes its blocks
    into (Objective._block). One is enough: an Objective's operations, and those of a round's objectives, run
    one after another (in a GPU's stream order), and each block is read before the next is written. So a job
    holds one buffer (201 MB at V = 49,152 and a GPU's c = 1,024; a stacked round's block, 512 MiB:
    uph.lm.engine.round), not one per live Objective (a lockstep group's users and arms), and a group's memory
    is its p0 (uph.lm.engine.lockstep)."""
    held = _SCRATCH.get((device, dtype))
    if held is None or held.numel() < numel:
        held = _SCRATCH[(device, dtype)] = torch.empty(numel, dtype=dtype, device=device)
    return held[:numel]


@dataclass
class Value:
    objective: float
    ce: float
    kl: float
    grad: torch.Tensor | None  # [d] float64


class HeadOnTokens:
    """What every Objective of one head on the same tokens shares, whatever its offset, beta and lam: the
    log-partitions at theta = 0 and the curvature's variance part at p0, each computed by the first
    Objective that needs it. The personal and residual arms of a head on a user's tokens pass one to
    fit_path (`shared`), and compute them once for both."""

    def __init__(self, tokens: Tokens, head: Head):
        self.tokens, self.head = tokens, head
        self.log_z0: list[torch.Tensor] | None = None  # per chunk log Σ_v p0_tv [c]
        self.variance: torch.Tensor | None = None  # mean_t a_t² ⊙ Var_{p0_t}(P) [d]


class Objective:
    """Seed 002's J(theta) for one head on some tokens, with its gradient (module docstring); with
    `offset`, J of a residual theta on top of that fixed theta; with `shared`, the offset-free work of
    other Objectives of this head on these tokens (HeadOnTokens)."""

    def __init__(
        self,
        tokens: Tokens,
        head: Head,
        beta: float,
        lam: float,
        offset: torch.Tensor | None = None,
        shared: HeadOnTokens | None = None,
    ):
        self.shared = HeadOnTokens(tokens, head) if shared is None else shared
        if self.shared.tokens is not tokens or self.shared.head is not head:
            raise ValueError("an Objective shares work only with Objectives of the same head on the same tokens")
        self.tokens, self.beta, self.lam, self.d = tokens, beta, lam, head.d
        self.dtype, self.device = tokens.dtype, tokens.device
        self.P = None if head.P is None else head.P.to(self.device, self.dtype).contiguous()  # None: identity
        vocab = tokens.layer.W.shape[0]
        self.block = vocab_block(self.device, vocab)
        if self.P is not None:
            self.PT = self.P.T.contiguous()
            self.P_log2e = self.P * LOG2E  # exp(x) = exp2(x log2 e), and exp2 is faster
            self.blocks = list(zip(self.P_log2e.split(self.block), self.PT.split(self.block, dim=1)))
        self.reach = 1.0 if self.P is None else float(self.P.norm(dim=1).max())  # |P_v · u| <= reach ‖u‖
        columns = max(len(chunk.targets) for chunk in tokens.chunks)
        self.scratch = shared_scratch(self.device, self.dtype, min(self.block, vocab) * columns)
        self.a = None
        if head.conditional:
            A = head.A.to(self.device, self.dtype)
            self.a = [chunk.hidden.to(self.dtype) @ A.T for chunk in tokens.chunks]
        targets = torch.cat([chunk.targets for chunk in tokens.chunks])
        if self.P is None:
            self.ybar = torch.bincount(targets, minlength=self.d).double().cpu() / tokens.n
        else:
            self.ybar = (
                sum(
                    (self._a(i) * self.P[chunk.targets]).sum(0, dtype=torch.float64)
                    for i, chunk in enumerate(tokens.chunks)
                ).cpu()
                / tokens.n
            )
        self.offset = torch.zeros(self.d, dtype=torch.float64) if offset is None else offset.detach().double().cpu()
        self.log_z_base, grad_base = self._log_partitions(self.offset, need_grad=True)
        self.mbar = grad_base / tokens.n
        self.base_sum = None  # Σ_t L_t at the base (float64, host): where a round evaluates these tokens stacked
        if tokens.stack is not None and tokens.mixture is None:
            self.base_sum = float(sum(lz.sum(dtype=torch.float64) for lz in self.log_z_base))
        self.base_nll = tokens.base_nll  # NLL at the offset: the base's, moved by the fixed theta
        if self.shared.log_z0 is None:
            offset_free = not self.offset.any()
            self.shared.log_z0 = self.log_z_base if offset_free else self._log_partitions(torch.zeros(self.d), False)[0]
        if self.offset.any():
            change = float(self._change(self.log_z_base, self.shared.log_z0))
            self.base_nll += change / tokens.n - float(self.offset @ self.ybar)

    def _block(self, rows: int, columns: int) -> torch.Tensor:
        """The reused work block [rows <= self.block, columns]: on a CPU small enough to stay in cache, and
        allocated once (a fresh block per chunk would cost page faults); shared with every Objective on the
        device (shared_scratch)."""
        return self.scratch[: rows * columns].view(rows, columns)

    def _a(self, i: int) -> torch.Tensor:
        return self.a[i] if self.a is not None else torch.ones(1, self.d, dtype=self.dtype, device=self.device)

    def _exact(self, chunk: Chunk, rows: torch.Tensor, tilt: torch.Tensor):
        """log Σ_v exp(z0_tv - max z0_t + s_tv) [k] and P^T p_t [k, d] (p_t itself for P = I) for the
        tokens `rows` of `chunk`, tilt s [k, V], in log space from their logits: the fallback where
        the fast path's partition sum underflows."""
        z0 = self.tokens.base_logits(chunk, rows).T  # [k, V]
        logits = z0 - z0.amax(dim=1, keepdim=True) + tilt
        log_z = torch.logsumexp(logits, dim=1)
        p = (logits - log_z[:, None]).exp()
        return log_z, p if self.P is None else p @ self.P

    def _log_partitions(self, theta: torch.Tensor, need_grad: bool):
        """Per chunk log Σ_v p0_tv exp(P_v · u_t) [c]; and Σ_t a_t ⊙ P^T p_t [d] if need_grad (on the host):
        one objective's round of uph.lm.engine.lockstep (the fast pass, the flagged chunks mended, a token that
        still underflows recomputed exactly), reading back what each step needs."""
        queued = self._queued(theta, need_grad)
        flags = queued.chunk_flags().cpu().numpy()
        sums = self._finished(queued, flags if flags.any() else None)
        if sums.unsettled:
            sums = self._settled(queued, sums, sums.unders(self.device).cpu())
        return sums.log_z, None if sums.grad is None else sums.grad.cpu()

    def _queued(self, theta: torch.Tensor, need_grad: bool) -> _Pass:
        """The fast path over every chunk, queued on the device and read nothing back (a _Pass): the vocabulary
        is walked in blocks of self.block rows (vocab_block); each chunk whose sum underflows (and, for
        conditional heads, whose tilt may pass EXP_SAFE) is flagged for `_finished` to mend."""
        theta, log_z = theta.to(self.device, self.dtype), []
        if self.a is None:
            s = theta if self.P is None else self.P @ theta
            shift = s.max()
            e = (s - shift).exp_()
            inverse_z_p0 = torch.zeros_like(e, dtype=torch.float64)  # Σ_t p0_t / Z_t over fast-path tokens
            underflows = []  # per chunk [c]: Z_t below UNDERFLOW, recomputed exactly
            for _, p0 in self.tokens.probabilities():
                # Z_t = Σ_v p0_tv e_v by cascade sums over blocks: e @ p0 would lose ~1e-4 over V terms
                z = sum(
                    torch.mul(p, e_v[:, None], out=self._block(*p.shape)).sum(dim=0)
                    for p, e_v in zip(p0.split(self.block), e.split(self.block))
                )
                underflows.append(z < UNDERFLOW)
                log_z.append(z.log() + shift)
                if need_grad:
                    inverse_z_p0 += self._row_sums(p0, z.reciprocal().masked_fill_(underflows[-1], 0))
            flags = [underflows_t.any()[None] for underflows_t in underflows]
            return _Pass(theta, need_grad, log_z, flags, (s, e, inverse_z_p0, underflows))
        terms, flags = [], []  # per chunk Σ_t a_t ⊙ P^T p_t [d]; [a tilt may pass EXP_SAFE, a sum underflows]
        for a, (_, p0) in zip(self.a, self.tokens.probabilities()):
            u = a * theta
            z, p_sum = self._tilted(u, p0, None, need_grad)
            log_z.append(z.log())
            terms.append((a * (p_sum.T / z[:, None])).sum(0, dtype=torch.float64) if need_grad else None)
            flags.append(torch.stack([u.norm(dim=1).max().double() * self.reach > EXP_SAFE, (z < UNDERFLOW).any()]))
        return _Pass(theta, need_grad, log_z, flags, terms)

    def _row_sums(self, p0: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """p0 @ weights [V] (p0 [V, c], weights [c]): on a CPU, each vocabulary block's rows multiplied into the
        work block and summed, as the partition sums' pass reads p0, where one thread of MKL's matrix-vector
        product streams it slower on some CPUs (an AMD EPYC's: benchmarks/bench_fit_passes.py); on a GPU, the
        product. Each row's sum of its c products is torch's, the product's to float32 rounding."""
        if self.block >= len(p0):
            return p0 @ weights
        sums = torch.empty(len(p0), dtype=p0.dtype, device=p0.device)
        for lo in range(0, len(p0), self.block):
            rows = p0[lo : lo + self.block]
            torch.sum(torch.mul(rows, weights, out=self._block(*rows.shape)), dim=1, out=sums[lo : lo + len(rows)])
        return sums

    def _finished(self, queued: _Pass, flags=None) -> _Sums:
        """The sums of a queued pass (_Sums, on the device), its flagged chunks mended: `flags` are its chunk
        flags as read back (_Pass.chunk_flags; None: no chunk flagged). An unconditional head's flagged
        tokens are recomputed exactly (reading which they are: rare). A conditional head's flagged chunks
        are recomputed with each token's max tilt subtracted where a tilt may pass EXP_SAFE; a token whose
        sum still underflows is left for `_settled` (its chunk `unsettled`)."""
        theta, need_grad, log_z = queued.theta, queued.need_grad, list(queued.log_z)
        grad = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        mend = [] if flags is None else _flagged(flags)
        if self.a is None:
            s, e, inverse_z_p0, underflows = queued.rest
            for i in mend:
                bad = underflows[i].nonzero().squeeze(1)
                log_z[i][bad], exact_grad = self._exact(self.tokens.chunks[i], bad, s.expand(len(bad), -1))
                grad += exact_grad.sum(0, dtype=torch.float64)
            if not need_grad:
                return _Sums(log_z, None, None, {})
            fast = e * inverse_z_p0
            return _Sums(log_z, None, grad + (fast if self.P is None else self.P.double().T @ fast), {})
        terms, unsettled = list(queued.rest), {}
        for i, (_, p0) in zip(mend, self.tokens.probabilities(mend)):
            log_z[i], expectation, under = self._mended(self.a[i], p0, theta, need_grad, bool(flags[i][0]))
            terms[i] = (self.a[i] * expectation).sum(0, dtype=torch.float64) if need_grad else None
            unsettled[i] = (under, expectation)
        return _Sums(log_z, terms, _summed(grad, terms) if need_grad else None, unsettled)

    def _settled(self, queued: _Pass, sums: _Sums, unders) -> _Sums:
        """`sums` with the tokens of its unsettled chunks whose sum still underflows (`unders`: whether each
        chunk has any, as read back) recomputed exactly from their logits (reading which they are)."""
        log_z, terms = list(sums.log_z), list(sums.terms)
        for (i, (under, expectation)), any_under in zip(sums.unsettled.items(), unders):
            if any_under:
                u = self.a[i] * queued.theta
                bad = under.nonzero().squeeze(1)
                log_z[i][bad], expectation[bad] = self._exact(self.tokens.chunks[i], bad, u[bad] @ self.PT)
                if queued.need_grad:
                    terms[i] = (self.a[i] * expectation).sum(0, dtype=torch.float64)
        grad = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        return _Sums(log_z, terms, _summed(grad, terms) if queued.need_grad else None, {})

    def _tilted(self, u: torch.Tensor, p0: torch.Tensor, shift: torch.Tensor | None, need_grad: bool):
        """A conditional head's Z_t = Σ_v p0_tv exp(P_v · u_t - shift_t) [c] (shift [c] in units of ln 2,
        or None: 0) for one chunk's u [c, d], and Σ_v P_v p0_tv exp(...) [d, c] if need_grad (else 0)."""
        z = torch.zeros(len(u), dtype=self.dtype, device=self.device)
        p_sum = torch.zeros(self.d, len(u), dtype=self.dtype, device=self.device)  # Σ_v P_v p_tv Z_t
        for (P_v, PT_v), p in zip(self.blocks, p0.split(self.block)):
            s = torch.mm(P_v, u.T, out=self._block(len(P_v), len(u)))  # P u_t in units of ln 2
            if shift is not None:
                s.sub_(shift)
            e = s.exp2_().mul_(p)  # p_t up to 1 / Z_t
            z += e.sum(dim=0)
            if need_grad:
                p_sum.addmm_(PT_v, e)
        return z, p_sum

    def _mended(self, a: torch.Tensor, p0: torch.Tensor, theta: torch.Tensor, need_grad: bool, shifted: bool):
        """One chunk of a conditional head the fast path flagged, computed with care: with each token's max
        tilt subtracted first where a tilt may pass EXP_SAFE (`shifted`, as the flags read back say). Its
        (log Z_t [c], P^T p_t [c, d], Z_t < UNDERFLOW [c]: the tokens _settled recomputes exactly), on the
        device."""
        u = a * theta
        shift = None
        if shifted:
            shift = torch.stack([(P_v @ u.T).amax(dim=0) for P_v, _ in self.blocks]).amax(dim=0)
        z, p_sum = self._tilted(u, p0, shift, need_grad)
        log_z = z.log() if shift is None else z.log() + shift / LOG2E
        return log_z, p_sum.T / z[:, None], z < UNDERFLOW

    def log_partition_sums(self, thetas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unconditional heads only: Σ_t log Σ_v p0_tv exp(P_v · theta_k) [K] (float64, relative to p0's
        per-token factor, as the log-partitions of one theta) for K thetas [K, d] in one pass over p0:
        each theta tilts every token alike, so Z_t for all K is one [c, V] x [V, K] product per chunk
        (in vocabulary blocks, summed across). Also which thetas it holds for [K] bool: False where a
        partition sum underflows, which only the one-theta evaluation's exact log-space path takes.
        (A conditional head's tilt differs per token: K thetas cost K times one, batched or not.)"""
        if self.a is not None:
            raise ValueError(
                "log_partition_sums scores unconditional heads; a conditional head's thetas go one at a time"
            )
        thetas = thetas.to(self.device, self.dtype)
        s = thetas.T if self.P is None else self.P @ thetas.T  # [V, K]
        shift = s.amax(dim=0)
        e = (s - shift).exp_()
        sums = torch.zeros(len(thetas), dtype=torch.float64, device=self.device)
        safe = torch.ones(len(thetas), dtype=torch.bool, device=self.device)
        for _, p0 in self.tokens.probabilities():
            z = sum(p.T @ e_v for p, e_v in zip(p0.split(self.block), e.split(self.block)))  # [c, K]
            safe &= (z >= UNDERFLOW).all(dim=0)
            sums += (z.log() + shift).sum(0, dtype=torch.float64)
        return sums.cpu(), safe.cpu()

    def curvature(self) -> torch.Tensor:
        """diag ∇²J at the base p0 [d]: (1 + beta) mean_t a_t² ⊙ Var_{p0_t}(P) + 2 lam (the exact
        solver's first quasi-Newton model; one more [c, V]×[V, 2d] product per chunk, once per
        HeadOnTokens)."""
        if self.shared.variance is None:
            self.shared.variance = self._variance()
        return ((1 + self.beta) * self.shared.variance + 2 * self.lam).cpu()

    def _variance(self) -> torch.Tensor:
        """mean_t a_t² ⊙ Var_{p0_t}(P) [d]."""
        if self.P is None:
            return self._bias_variance()
        P_and_squares = torch.cat([self.PT, self.PT.square()])
        total = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        for i, (_, p0) in enumerate(self.tokens.probabilities()):
            moments = (P_and_squares @ p0).T / p0.sum(dim=0)[:, None]
            variance = moments[:, self.d :] - moments[:, : self.d].square()
            total += (self._a(i).square() * variance).sum(0, dtype=torch.float64)
        return total / self.tokens.n

    def _bias_variance(self) -> torch.Tensor:
        """_variance for P = I (a = 1, whose a² ⊙ is exact and left out): mean_t p_t ⊙ (1 - p_t) [V], p_t = p0_t /
        Σ_v p0_tv. Each chunk's p_t and p_t² go into two [V, c] blocks allocated once (a fresh [V, c] tensor per
        operation costs its page faults: benchmarks/bench_fit_passes.py); each word's float64 sum over the chunk's
        tokens runs on the chunk's transpose, as it did: the same numbers, bit for bit."""
        total = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        work = None
        for _, p0 in self.tokens.probabilities():
            if work is None:
                work = p0.new_empty(2, p0.shape[0] * max(len(chunk.targets) for chunk in self.tokens.chunks))
            p = torch.div(p0, p0.sum(dim=0), out=work[0, : p0.numel()].view(p0.shape))
            square = torch.mul(p, p, out=work[1, : p0.numel()].view(p0.shape))
            total += torch.sub(p, square, out=p).T.sum(0, dtype=torch.float64)
        return total / self.tokens.n

    def ce_kl(self, theta: torch.Tensor, mean_l) -> tuple:
        """CE and KL terms of J at `theta` from mean_t L_t, its mean log-partition change (module docstring);
        floats where mean_l is one (the dot products read as floats: the same float64 arithmetic, without a
        tensor operation per term)."""
        return self.base_nll + mean_l - float(theta @ self.ybar), mean_l - float(theta @ self.mbar)

    def __call__(self, theta: torch.Tensor, need_grad: bool = True) -> Value:
        """J at the residual `theta` (the whole theta without an offset): evaluate_many of one."""
        return evaluate_many([(self, theta)], need_grad)[0]

    def _change(self, log_z, reference=None) -> torch.Tensor:
        """Σ_t (L_t - L_t at the base, or at `reference`) on the device (float64), from per chunk
        log-partitions `log_z`."""
        reference = self.log_z_base if reference is None else reference
        return sum((lz - ref).sum(dtype=torch.float64) for lz, ref in zip(log_z, reference))

    def value_at(self, theta: torch.Tensor, need_grad: bool, change: float, grad) -> Value:
        """J's Value at the residual `theta` (float64, host) from Σ_t (L_t - L_t at the base) `change` and
        Σ_t a_t ⊙ P^T p_t `grad` [d] (host)."""
        n = self.tokens.n
        ce, kl = self.ce_kl(theta, change / n)
        objective = ce + self.beta * kl + float(self.lam * theta @ theta)
        if need_grad:
            grad = (1 + self.beta) * grad / n - self.ybar - self.beta * self.mbar + 2 * self.lam * theta
        return Value(float(objective), float(ce), float(kl), grad)


@dataclass
class _Pass:
    """An Objective's fast pass at one theta, queued on the device (Objective._queued): per chunk log Z_t,
    the chunk's flags (mend where any is set), the gradient's parts."""

    theta: torch.Tensor  # on the device, in the compute dtype
    need_grad: bool
    log_z: list[torch.Tensor]
    flags: list[torch.Tensor]  # per chunk [k] bool: conditional heads [tilt may pass EXP_SAFE, underflow]
    rest: object  # unconditional heads: (s, e, Σ_t p0_t / Z_t, per chunk underflows [c]); conditional: terms

    def chunk_flags(self) -> torch.Tensor:
        """The chunks' flags [chunks, k], on the device: read back with the pass's provisional sums."""
        return torch.stack(self.flags)


@dataclass
class _Sums:
    """What an evaluation reads back of a pass (Objective._finished): per chunk log Z_t, per chunk
    Σ_t a_t ⊙ P^T p_t (conditional heads), their sum over chunks (None: no gradient asked), and the
    mended chunks whose tokens may still underflow (chunk -> (Z_t < UNDERFLOW [c], P^T p_t [c, d]))."""

    log_z: list[torch.Tensor]
    terms: list | None
    grad: torch.Tensor | None
    unsettled: dict

    def unders(self, device) -> torch.Tensor:
        """Whether each unsettled chunk still has a token whose sum underflows [chunks] (on `device`)."""
        if not self.unsettled:
            return torch.zeros(0, dtype=torch.bool, device=device)
        return torch.stack([under.any() for under, _ in self.unsettled.values()])


def _summed(grad: torch.Tensor, terms: list[torch.Tensor]) -> torch.Tensor:
    """`grad` (zeros) plus every chunk's term, in chunk order."""
    for term in terms:
        grad += term
    return grad


def _flagged(flags) -> list[int]:
    """The chunks to mend: those whose flags (a row per chunk, as read back) hold a True."""
    return [i for i, flag in enumerate(flags) if flag.any()]


def evaluate_many(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool = True) -> list[Value]:
    """J (and its gradient) of each (objective, residual theta): one evaluation, or several users' next
    steps at once (run_lockstep). A theta of zeros is the objective's base, known
    from its construction; the others' passes are queued on the device back to back and read back once
    for all of them (_device_round)."""
    thetas = [theta.detach().double().cpu() for _, theta in requests]
    moving = [bool(theta.any()) for theta in thetas]
    found = iter(_device_round([(o, theta) for (o, _), theta, m in zip(requests, thetas, moving) if m], need_grad))
    values = []
    for (objective, _), theta, moves in zip(requests, thetas, moving):
        change, grad = next(found) if moves else (0.0, objective.mbar * objective.tokens.n)
        values.append(objective.value_at(theta, need_grad, change, grad))
    return values


def _device_round(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool) -> list[tuple]:
    """(Σ_t of the log-partition change, Σ_t a_t ⊙ P^T p_t or None) on the host for each (objective,
    residual theta). Every fast pass is queued, then one read brings back all their sums and their chunks'
    flags; where a chunk needs mending (a tilt that may overflow, a sum that underflows: the module
    docstring's Numerics), every such objective's mended chunks are queued and one more read brings them back; a token
    that still underflows (rarer still) costs its objective a read of its own."""
    with torch.profiler.record_function(DEVICE_PART):
        if not requests:
            return []
        objectives = [objective for objective, _ in requests]
        queued = [objective._queued(objective.offset + theta, need_grad) for objective, theta in requests]
        sums = [objective._finished(each) for objective, each in zip(objectives, queued)]
        flags, results = _read(objectives, sums, need_grad, [each.chunk_flags() for each in queued])
        mend = [i for i, flag in enumerate(flags) if flag.any()]
        if not mend:
            return results
        shape = [flags[i].reshape(len(queued[i].flags), -1) for i in mend]
        mended = [objectives[i]._finished(queued[i], flag) for i, flag in zip(mend, shape)]
        unders = [each.unders(queued[i].theta.device) for i, each in zip(mend, mended)]
        unders, found = _read([objectives[i] for i in mend], mended, need_grad, unders)
        for i, each, under, result in zip(mend, mended, unders, found):
            results[i] = result
            if under.any():
                settled = objectives[i]._settled(queued[i], each, under)
                results[i] = _read([objectives[i]], [settled], need_grad, [])[1][0]
        return results


def _read(objectives, sums, need_grad: bool, extras: list[torch.Tensor]) -> tuple[list, list[tuple]]:
    """One device-to-host read of `extras` and of each objective's (change, gradient) from its sums: (the
    extras as float64 arrays, [(Σ_t of the log-partition change, Σ_t a_t ⊙ P^T p_t or None)])."""
    changes = torch.stack([objective._change(each.log_z) for objective, each in zip(objectives, sums)])
    host = _read_back([*extras, changes, *([each.grad for each in sums] if need_grad else [])])
    extras, changes, grads = host[: len(extras)], host[len(extras)], host[len(extras) + 1 :]
    results = [(float(change), torch.from_numpy(grads[i]) if need_grad else None) for i, change in enumerate(changes)]
    return extras, results


def _read_back(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """`tensors` on the host as float64 arrays, in one device-to-host read of them all."""
    host = torch.cat([tensor.reshape(-1).double() for tensor in tensors]).cpu().numpy()
    return np.split(host, np.cumsum([tensor.numel() for tensor in tensors])[:-1])
