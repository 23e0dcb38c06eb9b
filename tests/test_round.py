"""A lockstep round as one computation (uph.lm.engine.round): a stacked group's requests of one head in one
batched pass, each user's value its own to float32 rounding, and as many operations for 12 users as for 1."""

from __future__ import annotations

import pytest
import torch
from test_fit import BETA_LAM, HEAD_SETTINGS, D

import uph.lm.engine.lockstep
import uph.lm.engine.objective
import uph.lm.engine.round
from uph.device import count_dispatched_ops
from uph.lm.data.models import OutputLayer
from uph.lm.engine.fit import fit_path, fit_path_steps
from uph.lm.engine.heads import full_bias_head, make_head
from uph.lm.engine.lockstep import run_lockstep
from uph.lm.engine.objective import Objective
from uph.lm.engine.round import evaluate_round
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import on_device, prepare, prepare_halves, prepare_stack

UNIT = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff


def heads_of(W, svd):
    return [
        *(make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd) for name in ("cvh", "uncond", "svd_cvh")),
        full_bias_head(W),
    ]


def rounding_bounds(objective: Objective, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Bounds on |J batched - J alone| and on each |gradient element's| difference. Each token's Z_t is, in
    either evaluation, a float32 sum of V positive terms, each an exp of a d-term product P_v · u_t rounded:
    its relative error is at most (V + d + 2) u (1 + |P_v · u_t| max) (u: float32's unit roundoff), an
    absolute error of log Z_t. J moves by (1 + beta) times its mean over the tokens, and a gradient
    element (1 + beta) mean_t a_ti Σ_v P_vi p_tv by at most (1 + beta) max |a_ti| max |P_vi| twice that."""
    total = objective.offset + theta
    if objective.a is None:
        tilt = float((total if objective.P is None else objective.P.double().cpu() @ total).abs().max())
        a = torch.ones(objective.d, dtype=torch.float64)
    else:
        a = torch.cat(objective.a).double().cpu().abs().amax(dim=0)
        tilt = objective.reach * float((torch.cat(objective.a).double().cpu() * total).norm(dim=1).max())
    V = objective.tokens.layer.W.shape[0]
    per_token = 2 * (V + objective.d + 2) * UNIT * (1 + tilt)  # two evaluations' errors
    P = (
        torch.ones(objective.d, dtype=torch.float64)
        if objective.P is None
        else objective.P.double().cpu().abs().amax(0)
    )
    return (1 + objective.beta) * per_token, (1 + objective.beta) * 2 * per_token * a * P


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_a_stacked_round_gives_each_user_its_own_value_to_float32_rounding(lm, device, monkeypatch):
    """Four users' tokens stacked; requests on a whole split, a residual on an offset, a fit part (prefix)
    and a validation part (slice): each batched Value is the objective's own alone within the rounding
    bounds, for every kind of head; at thetas that tilt a conditional head's tokens past EXP_SAFE the batched
    pass subtracts each token's largest tilt and still holds every request (an objective alone mends such
    chunks the same way), and a request evaluated alone would be bit for bit its own; on a GPU too (its
    thetas copied from pinned memory)."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), device)
    cuts = [0, 60, 150, 210, 300]
    splits = [(h[lo:hi].float(), y[lo:hi]) for lo, hi in zip(cuts, cuts[1:])]
    stacked = prepare_stack(splits, layer, chunk=32, device=device)
    assert [t.start for t in stacked] == cuts[:-1] and stacked[0].stack.p0.shape == (W.shape[0], 300)
    parts = [stacked[0], stacked[1], stacked[2].prefix(45), stacked[3].slice(20, 90)]
    alone, shifted = [], []  # the objectives evaluated alone; each conditional pass's `shifted`
    monkeypatch.setattr(
        uph.lm.engine.round, "evaluate_many", lambda r, g: alone.extend(o for o, _ in r) or evaluate(r, g)
    )
    evaluate, conditional = uph.lm.engine.objective.evaluate_many, uph.lm.engine.round._conditional
    monkeypatch.setattr(uph.lm.engine.round, "_conditional", lambda *a: shifted.append(a[-1]) or conditional(*a))
    generator = torch.Generator().manual_seed(4)
    for head in heads_of(W.float(), svd):
        offsets = [None, 0.2 * torch.randn(head.d, generator=generator, dtype=torch.float64), None, None]
        objectives = [Objective(part, head, *BETA_LAM, offset) for part, offset in zip(parts, offsets)]
        for scale in (0.3, 3.0, 100.0):
            thetas = [scale * torch.randn(head.d, generator=generator, dtype=torch.float64) for _ in parts]
            alone.clear(), shifted.clear()
            values = evaluate_round(list(zip(objectives, thetas)))
            for objective, theta, value in zip(objectives, thetas, values):
                own = objective(theta)
                bound, grad_bounds = rounding_bounds(objective, theta)
                assert abs(value.objective - own.objective) <= bound, (head.name, scale)
                assert abs(value.kl - own.kl) <= bound
                assert ((value.grad - own.grad).abs() <= grad_bounds).all(), (head.name, scale)
                if objective in alone:
                    assert value.objective == own.objective and torch.equal(value.grad, own.grad)
            if scale == 0.3:
                assert alone == [] and shifted in ([], [False]), head.name  # every request batched, as is
            if scale == 100.0 and head.conditional:
                assert alone == [] and shifted == [True], head.name  # tilts past EXP_SAFE: batched, shifted


def test_a_round_dispatches_as_many_operations_for_twelve_stacked_users_as_for_one(lm):
    """The operations one round dispatches (uph.device.count_dispatched_ops) for 1 and 12 users of 25 tokens:
    within 10 % of each other stacked, for a conditional and an unconditional head, at thetas whose tilts
    stay below EXP_SAFE and at thetas 300 times larger (the conditional pass shifted); twelve users not
    stacked dispatch each user's evaluation on its own (over 5 times one's)."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), "cpu")
    splits = [(h[25 * i : 25 * (i + 1)].float(), y[25 * i : 25 * (i + 1)]) for i in range(12)]
    generator = torch.Generator().manual_seed(6)
    for head, scale in [(head, scale) for head in heads_of(W.float(), svd)[:2] for scale in (0.3, 100.0)]:
        thetas = [scale * torch.randn(D, generator=generator, dtype=torch.float64) for _ in splits]
        counts = {}
        for label, users in [
            ("stacked 1", prepare_stack(splits[:1], layer)),
            ("stacked 12", prepare_stack(splits, layer)),
            ("alone 1", [prepare(*split, layer) for split in splits[:1]]),
            ("alone 12", [prepare(*split, layer) for split in splits]),
        ]:
            requests = [(Objective(tokens, head, *BETA_LAM), theta) for tokens, theta in zip(users, thetas)]
            evaluate_round(requests)  # warm-up: the layout and buffers a round makes once
            counts[label] = count_dispatched_ops(evaluate_round, requests)[1]
        assert abs(counts["stacked 12"] - counts["stacked 1"]) <= 0.1 * counts["stacked 1"], (head.name, scale, counts)
        assert counts["alone 12"] > 5 * counts["alone 1"], (head.name, scale, counts)


def test_stacked_users_in_lockstep_reach_their_own_paths_with_one_head_a_round(lm, monkeypatch):
    """Three stacked users walking two heads' paths in lockstep: every round evaluates requests of one head
    (a fit that moves on waits for the others), and each path's objectives are those of the user fitted
    alone to the solvers' noise floor."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), "cpu")
    splits = [(h[100 * i : 100 * (i + 1)].float(), y[100 * i : 100 * (i + 1)]) for i in range(3)]
    heads = heads_of(W.float(), svd)[:2]
    settings, radii = SolverSettings.defaults(), [0.5, 5.0]

    def walk(tokens):
        objectives = []
        for head in heads:
            path = yield from fit_path_steps(tokens, head, "exact", settings, radii)
            objectives += [result.objective for _, result in path]
        return objectives

    rounds, queue = [], uph.lm.engine.lockstep.queue_round
    monkeypatch.setattr(
        uph.lm.engine.lockstep, "queue_round", lambda r: rounds.append({o.shared.head for o, _ in r}) or queue(r)
    )
    together = run_lockstep([walk(tokens) for tokens in prepare_stack(splits, layer)])
    assert len(rounds) > 4 and all(len(heads_in_round) == 1 for heads_in_round in rounds)
    for split, objectives in zip(splits, together):
        tokens = prepare(*split, layer)
        own = [result.objective for head in heads for _, result in fit_path(tokens, head, "exact", settings, radii)]
        assert objectives == pytest.approx(own, rel=1e-6)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_two_stacks_rounds_alternate_and_each_stack_gets_what_it_gets_alone(lm, device, monkeypatch):
    """Six users in two stacks (as a GPU job's group in two halves, prepare_halves) walking paths in lockstep:
    one stack's round is queued while the other's Values are taken (two rounds in flight, the stacks
    alternating; on a GPU their sums on their way through pinned memory), and each fit returns, bit for bit,
    what it returns in lockstep beside its own stack's fits alone."""
    h, y, W, b, svd = lm
    layer = on_device(OutputLayer(W.float(), b.float()), device)
    splits = [(h[50 * i : 50 * (i + 1)].float(), y[50 * i : 50 * (i + 1)]) for i in range(6)]
    tokens = prepare_halves(splits, layer, device=device)
    halves = [tokens[:3], tokens[3:]]
    assert tokens[2].stack is tokens[0].stack is not tokens[3].stack
    head, settings = heads_of(W.float(), svd)[2], SolverSettings.defaults()

    def fits(stacks):
        return [fit_path_steps(tokens, head, "exact", settings, [0.5, 5.0]) for tokens in stacks]

    events, queue, finish = [], uph.lm.engine.lockstep.queue_round, uph.lm.engine.lockstep.finish_round
    half = {id(tokens[0].stack): k for k, tokens in enumerate(halves)}

    def queued(requests):
        events.append(("queue", half[id(requests[0][0].tokens.stack)]))
        return queue(requests)

    def finished(round_):
        events.append(("finish", half[id(round_.requests[0][0].tokens.stack)]))
        return finish(round_)

    monkeypatch.setattr(uph.lm.engine.lockstep, "queue_round", queued)
    monkeypatch.setattr(uph.lm.engine.lockstep, "finish_round", finished)
    together = run_lockstep(fits(halves[0]) + fits(halves[1]))
    monkeypatch.undo()
    assert events[:4] == [("queue", 0), ("queue", 1), ("finish", 0), ("queue", 0)]
    in_flight = [sum(1 if kind == "queue" else -1 for kind, _ in events[: k + 1]) for k in range(len(events))]
    assert max(in_flight) == 2 and sum(count == 2 for count in in_flight) > 4
    alone = run_lockstep(fits(halves[0])) + run_lockstep(fits(halves[1]))
    for path, own in zip(together, alone, strict=True):
        for (theta, result), (own_theta, own_result) in zip(path, own, strict=True):
            assert torch.equal(theta, own_theta) and result.objective == own_result.objective
