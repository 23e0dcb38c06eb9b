"""Solvers over the ball ‖theta‖ <= radius (the capacity knob, uph.lm.engine.capacity): "adam" is seed 002's
schedule (Adam from zero, gradient-norm clipping at clip_norm, then projection onto the ball; `steps`
steps at `lr`); "exact" stops when the projected-gradient norm, reported as `certificate`, is <= tol:
up to d = DENSE_MAX_D a projected quasi-Newton method (a BFGS model, started from the Hessian diagonal
at the base or handed on from a smaller ball, minimized exactly over the ball; Armijo backtracking),
beyond it limited-memory BFGS inside the ball and a diagonal model minimized over it (both scaled by
the Hessian diagonal at the base, non-monotone Armijo; no d×d matrix). The exact solver may start anywhere in
the ball (a warm start along a path of radii): J is convex, so where it starts changes only how long
it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from uph.config import dataclass_fields, schema_defaults
from uph.lm.engine.capacity import on_ball
from uph.optim import Adam, clip_grad_norm_

SOLVERS = ("adam", "exact")  # adam: seed 002's schedule; exact: certified optimum
DENSE_MAX_D = 1024  # the exact solver keeps a d×d BFGS model up to this d
# J sums float32 log-partitions in float64: two evaluations a step apart differ by rounding up to about
# 1e-8 |J| (measured: ±2e-8 at J = 4.5). A trial whose predicted decrease is below that cannot be judged
# by Armijo's test, so the exact solver stops there (it would spend up to 20 evaluations a step on
# rounding); its certificate says how close it got. float64 tokens round far below what fit.tol resolves.
NOISE = {torch.float32: 1e-8, torch.float64: 0.0}


@dataclass(frozen=True)
class SolverSettings:
    """The fit section's solver keys (schemas/fit.schema.yaml documents each and holds the defaults)."""

    beta: float
    lam: float
    clip_norm: float
    lr: float
    steps: int
    tol: float
    max_iter: int

    @classmethod
    def from_config(cls, fit: dict) -> SolverSettings:
        return cls(**dataclass_fields(cls, fit))

    @classmethod
    def defaults(cls, **changes) -> SolverSettings:
        """The schema's defaults, with `changes`."""
        return cls.from_config({**schema_defaults("fit"), **changes})


def projected_gradient_norm(theta: torch.Tensor, grad: torch.Tensor, radius: float) -> float:
    """‖grad‖ without the part the ball blocks: on the sphere an outward -grad is no descent.
    Zero exactly at the constrained minimizer (KKT: grad = -mu theta, mu >= 0)."""
    theta, grad = theta.double(), grad.double()
    norm = theta.norm()
    if on_ball(norm, radius):
        outward = theta / norm
        grad = grad - torch.clamp(grad @ outward, max=0) * outward
    return float(grad.norm())


def project(theta: torch.Tensor, radius: float) -> torch.Tensor:
    norm = theta.norm()
    return theta * (radius / norm) if norm > radius else theta


@dataclass
class Solution:
    theta: torch.Tensor
    iterations: int
    value: object  # uph.lm.engine.objective.Value at theta
    hessian: torch.Tensor | None  # the exact solver's model to start the next ball: BFGS's [d, d], L-BFGS's diagonal


def minimize(
    solver: str,
    evaluate,
    start: torch.Tensor,
    radius: float,
    settings: SolverSettings,
    hessian,
    noise: float,
    start_value=None,
) -> Solution:
    """Minimize J over the ball of `radius`, as a generator of J's evaluations (a fit's steps, which
    uph.lm.engine.lockstep drives alone or beside other fits'): `evaluate(theta, iteration)` is a generator that
    yields the request for J's Value with its gradient at theta and returns it (`yield from`); exact's
    steps also yield each BallModel they minimize, and are sent its minimizer.
    adam runs seed 002's schedule from zero in `start`'s dtype; exact starts at `start` (float64; its
    Value `start_value` when known and `start` lies in the ball, as a smaller ball's minimizer does) with
    `hessian`: a smaller ball's model, or J's Hessian diagonal at the base [d] (a BFGS model's start up to
    d = DENSE_MAX_D, L-BFGS's scaling beyond); it stops where a step's predicted decrease is below
    `noise` |J| (NOISE of the tokens' dtype)."""
    if solver == "adam":
        theta = yield from _adam(
            evaluate, torch.zeros_like(start), settings.lr, settings.steps, settings.clip_norm, radius
        )
        return Solution(theta, settings.steps, (yield from evaluate(theta, settings.steps)), None)
    theta = project(start.double(), radius)
    if start_value is not None and torch.equal(theta, start.double()):
        value = start_value
    else:
        value = yield from evaluate(theta, 0)
    if len(theta) <= DENSE_MAX_D:
        B = torch.diag(hessian) if hessian.dim() == 1 else hessian
        return (yield from _projected_bfgs(evaluate, theta, value, B, radius, settings.tol, settings.max_iter, noise))
    found = yield from _projected_lbfgs(evaluate, theta, value, hessian, radius, settings.tol, settings.max_iter, noise)
    return Solution(*found, hessian)


def _adam(evaluate, theta: torch.Tensor, lr: float, steps: int, clip_norm: float, radius: float) -> torch.Tensor:
    """Seed 002: Adam on J, the gradient clipped to norm clip_norm, theta projected onto the ball (torch's
    Adam and clipping, uph.optim)."""
    theta = theta.clone()
    optimizer = Adam([theta], lr=lr)
    for step in range(steps):
        grad = (yield from evaluate(theta, step)).grad.to(theta.dtype)
        clip_grad_norm_([grad], clip_norm)
        optimizer.step([grad])
        theta.copy_(project(theta, radius))
    return theta


def _projected_bfgs(evaluate, theta, value, B: torch.Tensor, radius: float, tol: float, max_iter: int, noise: float):
    """Minimize J over the ball from theta (its Value `value`) and the model Hessian B: each step
    minimizes the BFGS model g·s + ½ s^T B s exactly over the ball, then backtracks (Armijo) along it.
    Stops at certificate <= tol, or when no step decreases J any more (the float noise floor)."""
    for iteration in range(max_iter):
        if projected_gradient_norm(theta, value.grad, radius) <= tol:
            return Solution(theta, iteration, value, B)
        step = (yield BallModel(theta, value.grad, B, radius)) - theta
        slope, t = float(value.grad @ step), 1.0
        if slope >= 0:
            return Solution(theta, iteration, value, B)
        for _ in range(20):  # t >= 2^-19: a step cut further is lost in the float noise floor
            if -t * slope < noise * max(1.0, abs(value.objective)):
                return Solution(theta, iteration, value, B)
            trial = yield from evaluate(theta + t * step, iteration + 1)
            if trial.objective <= value.objective + 1e-4 * t * slope:
                break
            t /= 2
        else:
            return Solution(theta, iteration, value, B)
        s, y = t * step, trial.grad - value.grad
        if float(s @ y) > 1e-12 * float(s.norm() * y.norm()):
            Bs = B @ s
            B = B - torch.outer(Bs, Bs) / (s @ Bs) + torch.outer(y, y) / (s @ y)
        theta, value = theta + s, trial
    return Solution(theta, max_iter, value, B)


@dataclass(frozen=True)
class BallModel:
    """A solver's request to the host (beside its requests for J's Value): the minimizer over ‖x‖ <= radius
    of the quadratic model grad·(x - theta) + ½ (x - theta)^T B (x - theta), B positive definite (a [d, d]
    matrix, or its diagonal [d]). A fit yields it and is sent the minimizer [d]; the driver
    (uph.lm.engine.lockstep) answers the requests of all the fits a round moves on together
    (ball_model_minimizers), each the same, bit for bit, as it would be alone."""

    theta: torch.Tensor
    grad: torch.Tensor
    B: torch.Tensor
    radius: float


def ball_model_minimizers(models: list[BallModel]) -> list[torch.Tensor]:
    """The minimizer of each BallModel: in B's eigenbasis Q, x = Q y with y(mu) = c / (eigenvalues + mu),
    c = Q^T (B theta - grad), mu >= 0 the least that lands in the ball (_into_balls). The models of one
    shape share one Newton iteration (each row its own mu), so a round of several fits pays the
    interpreter's steps once (benchmarks/bench_ball_step.py); the eigendecompositions and the products
    with Q are each model's own, Q in the layout eigh gives it (a batched eigh, or Q copied into a stack,
    changes the products' kernels and so their rounding on some CPUs: an AMD EPYC's). Every operation is
    row by row, so a model's minimizer is the same bit for bit whichever models share its batch."""
    answers = [None] * len(models)
    shapes: dict[tuple, list[int]] = {}
    for i, model in enumerate(models):
        shapes.setdefault(tuple(model.B.shape), []).append(i)
    for shape, members in shapes.items():
        group = [models[i] for i in members]
        radii = [m.radius for m in group]
        if len(shape) == 1:
            ys = _into_balls([m.B * m.theta - m.grad for m in group], torch.stack([m.B for m in group]), radii)
        else:
            eigenvalues, Q = zip(*(torch.linalg.eigh(m.B) for m in group))  # each Q in LAPACK's own layout
            cs = [q.T @ (m.B @ m.theta - m.grad) for q, m in zip(Q, group)]
            ys = [q @ y for q, y in zip(Q, _into_balls(cs, torch.stack(eigenvalues), radii))]
        for i, y in zip(members, ys):
            answers[i] = y
    return answers


def _into_balls(cs: list[torch.Tensor], eigenvalues: torch.Tensor, radii: list[float]) -> list[torch.Tensor]:
    """For each row k: y(mu) = c_k / (lambda_k + mu), mu >= 0 the least with ‖y(mu)‖ <= r_k (lambda_k:
    eigenvalues[k], floored at 1e-12 of the largest). Where y(0) is outside, mu solves the secular
    equation psi(mu) = 1/‖y(mu)‖ - 1/r = 0 by Newton's method from mu = 0 (Moré and Sorensen 1983;
    Nocedal and Wright, Algorithm 4.3):

        mu <- mu + (‖y‖ - r) ‖y‖² / (r S3),   S3 = sum_i c_i² / (lambda_i + mu)³ = -½ d‖y‖²/dmu.

    psi is increasing and concave, so each step stays left of the root and ‖y‖ falls to r from above,
    quadratically once near (a few steps). A row stops at ‖y‖ <= r (1 + 1e-12), or when mu stops moving,
    and its y is scaled onto the sphere: within 1e-12 of the model's minimizer, never outside the ball
    by more than the scaling's rounding. numpy on every row at once; each row's arithmetic is its own."""
    c = torch.stack(cs).numpy()
    eigenvalues = eigenvalues.clamp_min(eigenvalues.amax(dim=1, keepdim=True) * 1e-12).numpy()
    radius = np.asarray(radii, dtype=c.dtype)
    mu = np.zeros(len(cs), dtype=c.dtype)
    for _ in range(100):
        shifted = eigenvalues + mu[:, None]
        y = c / shifted
        squares = (y * y).sum(axis=1)
        norm = np.sqrt(squares)
        moving = norm > radius * (1 + 1e-12)  # y = 0 is never moving, so no quotient below is 0 / 0
        cubes = np.where(moving, (y * y / shifted).sum(axis=1), 1.0)
        new_mu = np.where(moving, mu + (norm - radius) * squares / (radius * cubes), mu)
        if not (new_mu != mu).any():
            break
        mu = new_mu
    outside = norm > radius
    return list(torch.from_numpy(y * np.where(outside, radius / np.where(outside, norm, 1.0), 1.0)[:, None]))


def _projected_lbfgs(
    evaluate, theta, value, diagonal, radius: float, tol: float, max_iter: int, noise: float, memory: int = 10
):
    """Limited-memory BFGS inside the ball, a diagonal model on it; `diagonal` [d] is J's Hessian
    diagonal at the base (Objective.curvature: the full bias's curvatures span four decades, where
    unscaled gradient steps crawl). Each iteration takes the two-loop direction d from the last
    `memory` pairs (s, y), started from H0 = gamma diagonal^-1 (gamma = s·y / y·diagonal^-1·y of the
    last pair, 1 before any), when x + d stays in the ball; else the minimizer over the ball of
    g·s + ½ s^T (diagonal / gamma) s (BallModel). Then Armijo backtracking against the
    largest of the last 10 objectives (non-monotone; the step is feasible: the ball is convex).
    Memory O(memory d), no d×d matrix."""
    pairs, history = [], []
    for iteration in range(max_iter):
        grad = value.grad
        if projected_gradient_norm(theta, grad, radius) <= tol:
            return theta, iteration, value
        history = [*history[-9:], value.objective]
        gamma = 1.0
        if pairs:
            s_last, y_last, _ = pairs[-1]
            gamma = float(s_last @ y_last) / float(y_last @ (y_last / diagonal))
        q, alphas = grad.clone(), []
        for s, y, rho in reversed(pairs):
            alphas.append(rho * float(s @ q))
            q -= alphas[-1] * y
        q *= gamma / diagonal
        for (s, y, rho), alpha in zip(pairs, reversed(alphas)):
            q += (alpha - rho * float(y @ q)) * s
        step = -q
        if (theta + step).norm() > radius or float(grad @ step) >= 0:
            step = (yield BallModel(theta, grad, diagonal / gamma, radius)) - theta
        slope, t = float(grad @ step), 1.0
        if slope >= 0:
            return theta, iteration, value
        for _ in range(20):
            if -t * slope < noise * max(1.0, abs(value.objective)):
                return theta, iteration, value
            trial = yield from evaluate(theta + t * step, iteration + 1)
            if trial.objective <= max(history) + 1e-4 * t * slope:
                break
            t /= 2
        else:
            return theta, iteration, value
        s, y = t * step, trial.grad - grad
        if float(s @ y) > 1e-12 * float(s.norm() * y.norm()):
            pairs = [*pairs[-(memory - 1) :], (s, y, 1.0 / float(s @ y))]
        theta, value = theta + s, trial
    return theta, max_iter, value
