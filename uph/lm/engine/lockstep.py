"""Fits in lockstep: several users' fits advance together, one evaluation each a round.

A fit's steps (uph.lm.engine.fit.fit_path_steps, the solvers of uph.lm.engine.solvers) are a generator: it yields the
request (objective, theta) for J's Value with its gradient and is sent the Value back, or a BallModel
(the exact solver's step, minimized over the ball on the host) and is sent its minimizer. `run` drives one
fit, evaluating each request as it comes; `run_lockstep` drives several (a job's users, each walking its
paths of radii): each round it takes the fits' pending requests and evaluates them all at once
(uph.lm.engine.round.queue_round and finish_round), so the device work of all of them is queued back to back
and read back once; where the group's tokens are stacked (uph.lm.engine.tokens.prepare_stack, on a GPU), the requests of
one head are one batched pass, whose operations do not grow with the users.

Why. On a GPU one user's evaluation is a few large kernels (its p0 blocks, [V, 1024] floats each) and a
read back of J and its gradient, after which the device idles while the host runs the solver's step
(the BFGS model minimized over the ball: 0.14 ms at d = 32) and dispatches the next
evaluation's fifty-odd operations. One fit at a time leaves the GPU waiting on the host and the host on
the GPU at every step, and each evaluation reads back on its own; in lockstep a round queues every user's
kernels while the host works through the others' steps, and reads back once (twice where a chunk needs
mending), and the fits a round moves on take their ball steps together (one batched eigendecomposition
and Newton iteration, uph.lm.engine.solvers.ball_model_minimizers). On a CPU the kernels are the whole
cost and the order changes nothing: each fit's arithmetic is exactly its own, so its values are
bit-identical however many fits share its rounds (tests/test_fit.py, tests/test_evaluate.py); stacked,
they are its own to float32 rounding (uph.lm.engine.round).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass

import torch

from uph.lm.engine.round import batch_key, finish_round, queue_round
from uph.lm.engine.solvers import BallModel, ball_model_minimizers

LOCKSTEP_BYTES = 4 * 2**30  # the cached p0 of a lockstep group's users together (V floats a train token); their
# objectives' work blocks are one buffer for the whole job (uph.lm.engine.objective.shared_scratch)


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
    """What each of `fits` (generators of evaluation requests) returns, driven together in rounds: each
    round evaluates the due requests of one group of fits (uph.lm.engine.round: queue_round, then
    finish_round) and sends each its Value; a fit that returns leaves the rounds. An error in any fit
    (uph.errors.FitDivergedError) stops them all.

    Without stacked tokens (a CPU's jobs), every pending request is due, in one round. A fit whose
    requests are stacked (uph.lm.engine.tokens.prepare_stack) belongs to its stack's group; each group has
    at most one round in flight, and the groups' rounds alternate: while the device computes one group's
    pass, the host takes the last group's Values and runs its fits' solver steps, their ball steps batched
    (on a GPU, host and device overlap; on a CPU the order changes nothing). Within a group, a fit that
    moves on to another head or objective waits for the fits behind it (the fewest such moves), so that
    the group's users, who walk the same heads in the same order, keep asking for the same head in the
    same rounds. Each group's rounds are the ones it would have alone, so each fit's values are too."""
    results, pending, stages = [None] * len(fits), {}, [_Stage() for _ in fits]
    _advance([(i, None) for i in range(len(fits))], fits, pending, results, stages)
    in_flight: deque[tuple[list[int], object]] = deque()
    while pending:
        busy = {i for due, _ in in_flight for i in due}
        for due in _due(pending, stages, busy):
            in_flight.append((due, queue_round([pending[i] for i in due])))
        due, queued = in_flight.popleft()
        _advance(list(zip(due, finish_round(queued))), fits, pending, results, stages)
    return results


@dataclass
class _Stage:
    """Where a fit is: how many times its requests moved to another batch (uph.lm.engine.round.batch_key, or
    another objective where it has none), the last one's, and its stack (its first stacked request's)."""

    moves: int = 0
    key: object = None
    home: object = None


def _due(pending: dict, stages: list[_Stage], busy: set) -> list[list[int]]:
    """The rounds to queue: for each group of fits (by stack; one group without stacks) with no round in
    flight, its pending fits, those of a stack's group only at its fewest moves."""
    groups: dict[object, list[int]] = {}
    for i in pending:
        groups.setdefault(stages[i].home, []).append(i)
    rounds = []
    for home, members in groups.items():
        if busy.intersection(members):
            continue
        if home is not None:
            behind = min(stages[i].moves for i in members)
            members = [i for i in members if stages[i].moves == behind]
        rounds.append(members)
    return rounds


def _advance(
    sends: list[tuple[int, object]], fits: list[Generator], pending: dict, results: list, stages: list[_Stage]
):
    """Send each fit i of `sends` its Value (None: start it) and file its next evaluation request, or its
    result when it returns; count its moves to another batch. The fits' requests to the host on the way
    (uph.lm.engine.solvers.BallModel) are answered together, as they come, until each fit asks for an
    evaluation or returns."""
    while sends:
        models = []
        for i, value in sends:
            try:
                request = fits[i].send(value)
            except StopIteration as stop:
                pending.pop(i, None)
                results[i] = stop.value
                continue
            if isinstance(request, BallModel):
                models.append((i, request))
                continue
            pending[i], stage, objective = request, stages[i], request[0]
            batch = batch_key(objective)
            if (batch or objective) != stage.key:
                stage.moves, stage.key = stage.moves + 1, batch or objective
            if stage.home is None and batch is not None:
                stage.home = batch[0]
        sends = list(zip([i for i, _ in models], ball_model_minimizers([model for _, model in models])))
