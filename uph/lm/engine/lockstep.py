"""Fits in lockstep: several users' fits advance together, one evaluation each a round.

A fit's steps (uph.lm.engine.fit.fit_path_steps, the solvers of uph.lm.engine.solvers) are a generator: it yields the
request (objective, theta) for J's Value with its gradient and is sent the Value back. `run` drives one
fit, evaluating each request as it comes; `run_lockstep` drives several (a job's users, each walking its
paths of radii): each round it takes every fit's pending request and evaluates them all at once
(`evaluate_many`), so the device work of all of them is queued back to back and read back once.

Why. On a GPU one user's evaluation is a few large kernels (its p0 blocks, [V, 1024] floats each) and a
read back of J and its gradient, after which the device idles while the host runs the solver's step
(the BFGS model, the ball's projection: a quarter of a millisecond at d = 32) and dispatches the next
evaluation's fifty-odd operations. One fit at a time leaves the GPU waiting on the host and the host on
the GPU at every step, and each evaluation reads back on its own; in lockstep a round queues every user's
kernels while the host works through the others' steps, and reads back once (twice where a chunk needs
mending). On a CPU the kernels are the whole cost and the order changes nothing: each fit's arithmetic is
exactly its own, so its values are bit-identical however many fits share its rounds (tests/test_fit.py,
tests/test_evaluate.py).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from uph.lm.engine.fit import Objective, Value


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
        values.append(objective._value(theta, need_grad, change, grad))
    return values


def _device_round(requests: list[tuple[Objective, torch.Tensor]], need_grad: bool) -> list[tuple]:
    """(Σ_t of the log-partition change, Σ_t a_t ⊙ P^T p_t or None) on the host for each (objective,
    residual theta). Every fast pass is queued, then one read brings back all their sums and their chunks'
    flags; where a chunk needs mending (a tilt that may overflow, a sum that underflows: uph.lm.engine.fit's
    Numerics), every such objective's mended chunks are queued and one more read brings them back; a token
    that still underflows (rarer still) costs its objective a read of its own."""
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


LOCKSTEP_BYTES = 4 * 2**30  # the cached p0 of a lockstep group's users together (V floats a train token)


def lockstep_groups(train_tokens: dict[str, int], vocab: int, budget: float = LOCKSTEP_BYTES) -> list[list[str]]:
    """The users (user -> train tokens), in their order, cut into groups that run in lockstep: each as many
    users as their p0 (vocab float32s a token, cached for the whole path) fit in `budget` together, at
    least one. At the default's scale (24 users of 1,640 train tokens, V = 49152: 320 MB each) a group
    holds 12 users: a GPU job's whole share (fit.gpu_jobs 2)."""
    groups, used = [], 0
    for user, n in train_tokens.items():
        size = 4 * vocab * n
        if not groups or used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(user)
        used += size
    return groups


def user_groups(tokens: dict[str, int], vocab: int, device: torch.device, lockstep: bool | None = None):
    """The groups a job's users (user -> the tokens whose p0 it holds) are fitted in: lockstep_groups where
    `lockstep` (default: on a GPU), else one user a group (on a CPU the order gains nothing)."""
    if device.type != "cpu" if lockstep is None else lockstep:
        return lockstep_groups(tokens, vocab)
    return [[user] for user in tokens]


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
