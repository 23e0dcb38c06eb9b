"""A lockstep round as one computation: the requests on one Stack evaluated by one batched pass.

A round (uph.lm.engine.lockstep) asks for J at each of its fits' thetas. Where their tokens sit side by side
in one Stack (uph.lm.engine.tokens.prepare_stack: a lockstep group's users), one pass over the stack's
p0 [V, N] serves them all. Token t tilts by the theta of the request r(t) whose tokens hold it (its
objective's offset included; row R of Θ [R + 1, d] is zeros, for the tokens no request holds):

    conditional    u_t = a_t ⊙ Θ_r(t)    Z_t = Σ_v p0_tv exp(P_v · u_t)    g_r = Σ_{t of r} a_t ⊙ P^T p_t
    unconditional  E = exp(P Θ^T - shift) [V, R + 1]    Z_t = Σ_v p0_tv E_v,r(t)    g_r = P^T (E_r ⊙ Σ_{t of r} p0_t / Z_t)

with a = A h once per stack and head, and the last sum one [V, c] x [c, R + 1] product per block of c
tokens. Each request's Σ_t log Z_t and g_r (conditional) are differences of one float64 cumulative sum
over the tokens, taken at its ends. A round is queued (queue_round: the passes, and their sums copied into
pinned memory without waiting) and then finished (finish_round: one wait for the copy), so the host may
run another stack's solver steps between the two (uph.lm.engine.lockstep alternates a group's two
halves). J and its gradient follow from the sums as for one objective alone (uph.lm.engine.objective:
Objective.value_at, with the objective's Σ_t L_t at its base, Objective.base_sum). The blocks are as wide
as STACK_SCRATCH holds, so the operations a round dispatches grow with the group's tokens over that width,
not with its users: about fifty, and five a block (tests/test_round.py counts them;
benchmarks/bench_lockstep.py --ops prints them).

A conditional head's tilts grow with the radius: where the round's thetas may tilt a token past EXP_SAFE
(the host's bound, reach ‖amax_r ⊙ Θ_r‖ with amax_r each dimension's largest |a_ti| over request r's
tokens, known before the pass), each block subtracts every token's largest tilt before the exp, as an
objective's mended chunks do (Z_t = exp(m_t) Σ_v p0_tv exp(P_v · u_t - m_t)), so the batch still holds
every request; below it the pass is the plain one.

What a batch does not do, its requests do alone (uph.lm.engine.objective.evaluate_many, in the same round):
a request with a token whose sum underflows (the objective recomputes those exactly in log space), or,
in a round not shifted, a token whose tilt may pass EXP_SAFE after all, one on a mixture base or outside a
stack, and every request of a batch that covers under half of its stack's tokens (a pass over all of them
would cost more than theirs alone).

The batched values are J's to float32 rounding, not bit for bit those of the objective alone: the sums over
the vocabulary run in other blocks and the base is the objective's own. A token's log-partition differs by a
rounding, far below the solvers' noise floor (uph.lm.engine.solvers.NOISE); a user's value does not depend on
which other users share its round beyond the float64 rounding of the cumulative sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from uph.device import DEVICE_PART
from uph.lm.engine.objective import EXP_SAFE, LOG2E, UNDERFLOW, Objective, Value, evaluate_many, shared_scratch
from uph.lm.engine.tokens import Stack

STACK_SCRATCH = 512 * 2**20  # bytes of a batched pass's work block [V, c]: c = 2,730 tokens at V = 49,152


def batch_key(objective: Objective):
    """What a request shares a batched pass by: (its stack, its head); None where it goes alone (no stack, a
    mixture base)."""
    return None if objective.base_sum is None else (objective.tokens.stack, objective.shared.head)


def evaluate_round(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool = True) -> list[Value]:
    """J (and its gradient) of each (objective, residual theta) of a round: the requests of each stack and
    head in one batched pass (module docstring), the others, and those a batch leaves, by evaluate_many."""
    return finish_round(queue_round(requests, need_grad))


@dataclass
class QueuedRound:
    """A round whose batched passes are queued on the device and being copied back, not yet waited for
    (queue_round): the host may work meanwhile (uph.lm.engine.lockstep runs another stack's fits)."""

    requests: list[tuple[Objective, torch.Tensor]]
    thetas: list[torch.Tensor]  # float64, host
    need_grad: bool
    batches: list[tuple[list[int], _InFlight]]  # the requests of each batched pass, its sums on their way


def queue_round(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool = True) -> QueuedRound:
    """A round's batched passes queued (finish_round waits for them and evaluates the rest)."""
    thetas = [theta.detach().double().cpu() for _, theta in requests]
    batches: dict[tuple, list[int]] = {}
    for i, ((objective, _), theta) in enumerate(zip(requests, thetas)):
        key = batch_key(objective)
        if key is not None and theta.any():
            batches.setdefault(key, []).append(i)
    queued = QueuedRound(requests, thetas, need_grad, [])
    for (stack, _), members in batches.items():
        objectives = [requests[i][0] for i in members]
        if 2 * sum(objective.tokens.n for objective in objectives) >= stack.n:
            passed = _device_part(stack, objectives, [thetas[i] for i in members], need_grad)
            queued.batches.append((members, passed))
    return queued


def finish_round(queued: QueuedRound) -> list[Value]:
    """The Values of a queued round: each batched pass's sums waited for, the requests it flags and the
    others evaluated by evaluate_many."""
    requests, thetas, need_grad = queued.requests, queued.thetas, queued.need_grad
    values: list[Value | None] = [None] * len(requests)
    for members, passed in queued.batches:
        sums, grads = passed.read()
        for r, i in enumerate(members):
            objective = requests[i][0]
            if sums[r, 1] > 0:  # a token the fast path flags: alone
                continue
            grad = None if not need_grad else (sums[r, 2:] if objective.a is not None else grads[r]).clone()
            values[i] = objective.value_at(thetas[i], need_grad, float(sums[r, 0]) - objective.base_sum, grad)
    alone = [i for i, value in enumerate(values) if value is None]
    for i, value in zip(alone, evaluate_many([(requests[i][0], thetas[i]) for i in alone], need_grad)):
        values[i] = value
    return values


@dataclass
class _InFlight:
    """A batched pass's per-request sums on their way to the host: copied into pinned memory without waiting,
    behind an event on a GPU (on a CPU, there already)."""

    host: torch.Tensor  # float64: [R, 2 (+ d)] sums, then [R, d] gradients of an unconditional head
    rows: int
    sums: int  # elements of the sums
    grads: bool
    event: torch.cuda.Event | None

    def read(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the sums [R, 2 (+ d)], the gradients [R, d] or None), once the copy has landed."""
        if self.event is not None:
            self.event.synchronize()
        sums = self.host[: self.sums].view(self.rows, -1)
        return sums, self.host[self.sums :].view(self.rows, -1) if self.grads else None


def _device_part(stack: Stack, objectives: list[Objective], thetas: list[torch.Tensor], need_grad: bool) -> _InFlight:
    """The batched pass queued, and its per request Σ_t log Z_t, how many tokens are flagged (and, for a
    conditional head, Σ_t a_t ⊙ P^T p_t; for an unconditional head g_r [R, d] after them) copied back
    without waiting (float64)."""
    first, R = objectives[0], len(objectives)
    V, N = stack.p0.shape
    width = max(1, min(N, STACK_SCRATCH // (V * stack.p0.element_size())))
    blocks = [(lo, min(lo + width, N)) for lo in range(0, N, width)]
    totals = torch.stack([objective.offset for objective in objectives]) + torch.stack(thetas)  # [R, d] host
    # a conditional head's tilts may pass EXP_SAFE: the host's bound (module docstring), in numpy (no dispatch)
    shifted = first.a is not None and bool(
        np.linalg.norm(_a_maxima(stack, first, objectives) * totals.numpy(), axis=1).max() * first.reach > EXP_SAFE
    )
    with torch.profiler.record_function(DEVICE_PART):
        owner, ends = _layout(stack, objectives)
        rows = _theta_rows(totals, first)
        scratch = shared_scratch(first.device, first.dtype, V * width)
        if first.a is not None:
            per_token, grads = _conditional(stack, first, owner, rows, blocks, scratch, need_grad, shifted)
        else:
            per_token, grads = _unconditional(stack, first, owner, rows, blocks, scratch, need_grad)
        cumulative = torch.cat([per_token.new_zeros(1, per_token.shape[1]), per_token.cumsum(0)])
        sums = cumulative.index_select(0, ends[R:]) - cumulative.index_select(0, ends[:R])  # [R, 2 (+ d)]
        flat = torch.cat([part.reshape(-1) for part in ([sums] if grads is None else [sums, grads])])
        if flat.device.type != "cuda":
            return _InFlight(flat.cpu(), R, sums.numel(), grads is not None, None)
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _InFlight(host, R, sums.numel(), grads is not None, event)


def _a(stack: Stack, objective: Objective) -> torch.Tensor:
    """a = A h [N, d] of the stack's tokens for the objective's conditional head, on its device (once)."""
    head = objective.shared.head
    a = stack.derived.get(head)
    if a is None:
        a = stack.derived[head] = stack.hidden.to(objective.dtype) @ head.A.to(objective.device, objective.dtype).T
    return a


def _a_maxima(stack: Stack, objective: Objective, objectives: list[Objective]) -> np.ndarray:
    """amax [R, d] (numpy, float64): each dimension's largest |a_ti| over each request's tokens, so that
    ‖a_t ⊙ theta_r‖ <= ‖amax_r ⊙ theta_r‖ for every token t of request r (read back once per set of
    requests)."""
    spans = _spans(objectives)
    key = (objective.shared.head, spans, "a maxima")
    maxima = stack.derived.get(key)
    if maxima is None:
        a = _a(stack, objective).abs()
        maxima = stack.derived[key] = torch.stack([a[lo:hi].amax(dim=0) for lo, hi in spans]).double().cpu().numpy()
    return maxima


def _conditional(stack, objective, owner, rows, blocks, scratch, need_grad, shifted):
    """Per token [N, 2 + d] float64: log Z_t, a flag (Z_t underflows; not `shifted`: also a tilt that may
    pass EXP_SAFE), and where need_grad a_t ⊙ P^T p_t; no per-request part. `shifted`: each token's largest
    tilt m_t subtracted before the exp and added back to log Z_t (module docstring)."""
    P_log2e, N = objective.P_log2e, stack.n
    a = _a(stack, objective)
    u = a * rows.index_select(0, owner)  # [N, d]
    z = torch.empty(N, dtype=objective.dtype, device=objective.device)
    shift = torch.empty(N, dtype=objective.dtype, device=objective.device) if shifted else None
    p_sum = torch.empty(N, objective.d, dtype=objective.dtype, device=objective.device) if need_grad else None
    for lo, hi in blocks:
        s = torch.mm(P_log2e, u[lo:hi].T, out=scratch[: len(P_log2e) * (hi - lo)].view(-1, hi - lo))
        if shifted:  # in units of ln 2, as s
            torch.amax(s, dim=0, out=shift[lo:hi])
            s.sub_(shift[lo:hi])
        e = s.exp2_().mul_(stack.p0[:, lo:hi])  # p_t up to 1 / Z_t
        torch.sum(e, dim=0, out=z[lo:hi])
        if need_grad:
            torch.mm(e.T, objective.P, out=p_sum[lo:hi])
    flag = z < UNDERFLOW
    if not shifted:
        flag |= u.norm(dim=1) * objective.reach > EXP_SAFE
    log_z = z.log() if shift is None else z.log() + shift / LOG2E
    columns = [log_z[:, None], flag[:, None]]
    if need_grad:
        columns.append(a * (p_sum / z[:, None]))
    return torch.cat([column.double() for column in columns], dim=1), None


def _unconditional(stack, objective, owner, rows, blocks, scratch, need_grad):
    """Per token [N, 2] float64: log Z_t and whether Z_t underflows; and where need_grad each request's g_r
    [R, d] float64."""
    P, V, N = objective.P, *stack.p0.shape
    tilts = rows.T if P is None else P @ rows.T  # [V, R + 1]
    shift = tilts.amax(dim=0)
    E = (tilts - shift).exp_()
    z = torch.empty(N, dtype=objective.dtype, device=objective.device)
    inverse_z_p0 = torch.zeros(V, len(rows), dtype=torch.float64, device=objective.device) if need_grad else None
    for lo, hi in blocks:
        e = torch.index_select(E, 1, owner[lo:hi], out=scratch[: V * (hi - lo)].view(V, hi - lo))
        e.mul_(stack.p0[:, lo:hi])
        torch.sum(e, dim=0, out=z[lo:hi])
        if need_grad:
            inverse_z = z[lo:hi].reciprocal().masked_fill_(z[lo:hi] < UNDERFLOW, 0)
            weights = torch.zeros(hi - lo, len(rows), dtype=z.dtype, device=z.device)
            inverse_z_p0 += stack.p0[:, lo:hi] @ weights.scatter_(1, owner[lo:hi, None], inverse_z[:, None])
    per_token = torch.stack([(z.log() + shift.index_select(0, owner)).double(), (z < UNDERFLOW).double()], dim=1)
    if not need_grad:
        return per_token, None
    fast = E * inverse_z_p0
    return per_token, (fast.T if P is None else fast.T @ P.double())[:-1]


def _spans(objectives: list[Objective]) -> tuple[tuple[int, int], ...]:
    """Each request's columns of its stack: (first, end)."""
    return tuple((objective.tokens.start, objective.tokens.start + objective.tokens.n) for objective in objectives)


def _layout(stack: Stack, objectives: list[Objective]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the request of each of the stack's tokens [N] (R: none), the requests' first tokens then their ends
    [2R]) on the stack's device, made once per set of requests."""
    spans = _spans(objectives)
    layout = stack.derived.get(spans)
    if layout is None:
        owner = torch.full((stack.n,), len(spans), dtype=torch.long)
        for r, (start, stop) in enumerate(spans):
            if (owner[start:stop] != len(spans)).any():
                raise ValueError("a round's requests on one stack hold disjoint tokens (one request a user)")
            owner[start:stop] = r
        ends = torch.tensor([start for start, _ in spans] + [stop for _, stop in spans])
        layout = stack.derived[spans] = (owner.to(stack.p0.device), ends.to(stack.p0.device))
    return layout


def _theta_rows(thetas: torch.Tensor, objective: Objective) -> torch.Tensor:
    """Θ [R + 1, d] (thetas [R, d] float64, then a row of zeros) on the device in the compute dtype: one copy,
    from pinned memory and not waited for on a GPU. A fresh host buffer each time: torch's pinned-memory
    cache hands one out again only once its copy has run, where a buffer kept and rewritten by the next
    batch of the same round could change under a copy still queued."""
    rows = torch.zeros(len(thetas) + 1, objective.d, dtype=objective.dtype, pin_memory=objective.device.type == "cuda")
    rows[:-1] = thetas
    return rows.to(objective.device, non_blocking=True)
