"""Fits in lockstep: several users' fits advance together, one evaluation each a round.

A fit's steps (uph.lm.fit.fit_path_steps, the solvers of uph.lm.solvers) are a generator: it yields the
request (objective, theta) for J's Value with its gradient and is sent the Value back. `run` drives one
fit, evaluating each request as it comes; `run_lockstep` drives several (a job's users, each walking its
paths of radii): each round it takes every fit's pending request and evaluates them all at once
(`evaluate_many`), so the device work of all of them is queued back to back and read back once.

Why. On a GPU one user's evaluation is a few large kernels (its p0 blocks, [V, 1024] floats each) and a
read back of J and its gradient, after which the device idles while the host runs the solver's step
(the BFGS model, the ball's projection: about a millisecond of small CPU operations). One fit at a time
leaves the GPU waiting on the host and the host on the GPU at every step; in lockstep a round queues
every user's kernels while the host works through the others' steps, and waits once. On a CPU the
kernels are the whole cost and the order changes nothing: each fit's arithmetic is exactly its own,
so its values are bit-identical however many fits share its rounds (tests/test_lockstep.py).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from uph.lm.fit import Objective, Value


def evaluate_many(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool = True) -> list[Value]:
    """J (and its gradient) of each (objective, residual theta): one evaluation, or several users' next
    steps at once (fits in lockstep, uph.lm.lockstep). A theta of zeros is the objective's base, known
    from its construction; the others' passes are queued on the device back to back and read back once
    for all of them (_device_round)."""
    thetas = [theta.detach().double().cpu() for _, theta in requests]
    moving = [i for i, theta in enumerate(thetas) if theta.any()]
    results = _device_round([(requests[i][0], thetas[i]) for i in moving], need_grad)
    values = []
    for i, ((objective, _), theta) in enumerate(zip(requests, thetas)):
        change, grad = results.pop(0) if i in moving else (0.0, objective.mbar * objective.tokens.n)
        values.append(objective._value(theta, need_grad, change, grad))
    return values


def _device_round(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool) -> list[tuple]:
    """(Σ_t of the log-partition change, Σ_t a_t ⊙ P^T p_t or None) on the host for each (objective,
    residual theta): every fast pass queued, then one read back of all their flags and results; an
    objective with a flagged chunk is mended and read again (a second read, rare)."""
    if not requests:
        return []
    queued = [objective._queued(objective.offset + theta, need_grad) for objective, theta in requests]
    found = [objective._finished(each, False) for (objective, _), each in zip(requests, queued)]
    changes = torch.stack([objective._change(log_z) for (objective, _), (log_z, _) in zip(requests, found)])
    flagged, changes, *grads = _read_back(
        [torch.stack([each.flagged for each in queued]), changes] + ([grad for _, grad in found] if need_grad else [])
    )
    results = [(float(change), torch.from_numpy(grads[i]) if need_grad else None) for i, change in enumerate(changes)]
    for i in flagged.nonzero()[0]:
        objective = requests[i][0]
        log_z, grad = objective._finished(queued[i], True)
        change, *grad = _read_back([objective._change(log_z), *([grad] if need_grad else [])])
        results[i] = (float(change[0]), torch.from_numpy(grad[0]) if need_grad else None)
    return results


def _read_back(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """`tensors` on the host as float64 arrays, in one device-to-host read of them all."""
    host = torch.cat([tensor.reshape(-1).double() for tensor in tensors]).cpu().numpy()
    return np.split(host, np.cumsum([tensor.numel() for tensor in tensors])[:-1])


LOCKSTEP_BYTES = 4 * 2**30  # the cached p0 of a lockstep group's users together (V floats a train token)


def lockstep_groups(train_tokens: dict[str, int], vocab: int, budget: float = LOCKSTEP_BYTES) -> list[list[str]]:
    """The users (user -> train tokens), in their order, cut into groups that run in lockstep: each as many
    users as their p0 (vocab float32s a token, cached for the whole path) fit in `budget` together, at
    least one. At the default's scale (24 users of 1,640 train tokens, V = 49152: 320 MB each) a group
    holds 12 users: a GPU job's whole share (fit.gpu_jobs 2)."""
    groups, used = [], budget
    for user, n in train_tokens.items():
        size = 4 * vocab * n
        if used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(user)
        used += size
    return groups


def run(steps: Generator):
    """What one fit's `steps` return, each request evaluated as it comes."""
    return run_lockstep([steps])[0]


def run_lockstep(fits: list[Generator]) -> list:
    """What each of `fits` (generators of evaluation requests) returns, driven together: each round
    evaluates every pending request in one evaluate_many and sends each its Value; a fit that returns
    leaves the rounds. An error in any fit (uph.errors.FitDivergedError) stops them all."""
    results, pending = [None] * len(fits), {}
    for i, steps in enumerate(fits):
        _advance(steps, None, i, pending, results)
    while pending:
        values = evaluate_many(list(pending.values()))
        for i, value in zip(list(pending), values):
            _advance(fits[i], value, i, pending, results)
    return results


def _advance(steps: Generator, value, i: int, pending: dict, results: list) -> None:
    """Send fit i its Value (None: start it) and file its next request, or its result when it returns."""
    try:
        pending[i] = steps.send(value)
    except StopIteration as stop:
        pending.pop(i, None)
        results[i] = stop.value
