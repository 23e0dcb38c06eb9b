"""Solvers over the ball ‖theta‖ <= radius (the capacity knob, uph.lm.capacity): "adam" is seed 002's
schedule (Adam from zero, gradient-norm clipping at clip_norm, then projection onto the ball; `steps`
steps at `lr`); "exact" stops when the projected-gradient norm, reported as `certificate`, is <= tol:
up to d = DENSE_MAX_D a projected quasi-Newton method (a BFGS model, started from the Hessian diagonal
at the base or handed on from a smaller ball, minimized exactly over the ball; Armijo backtracking),
beyond it limited-memory BFGS inside the ball and the spectral projected gradient method on it
(Barzilai-Borwein steps, non-monotone Armijo; no d×d matrix). The exact solver may start anywhere in
the ball (a warm start along a path of radii): J is convex, so where it starts changes only how long
it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from uph.config import dataclass_fields, schema_defaults

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


def on_ball(norm, radius: float):
    """Whether theta's norm (a float or an array of them) lies on the ball's sphere, to rounding: there
    the constraint binds, and the radius, not the data, decides the fit."""
    return norm >= radius * (1 - 1e-6)


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
    value: object  # uph.lm.fit.Value at theta
    hessian: torch.Tensor | None  # the exact solver's last BFGS model (d <= DENSE_MAX_D), to start the next ball


def minimize(
    solver: str, evaluate, start: torch.Tensor, radius: float, settings: SolverSettings, hessian, noise: float
) -> Solution:
    """Minimize J over the ball of `radius`: `evaluate(theta, iteration)` is J's Value with its gradient.
    adam runs seed 002's schedule from zero in `start`'s dtype; exact starts at `start` (float64) with
    the BFGS model `hessian` (up to d = DENSE_MAX_D), and stops where a step's predicted decrease is below
    `noise` |J| (NOISE of the tokens' dtype)."""
    if solver == "adam":
        theta = _adam(evaluate, torch.zeros_like(start), settings.lr, settings.steps, settings.clip_norm, radius)
        return Solution(theta, settings.steps, evaluate(theta, settings.steps), None)
    theta = project(start.double(), radius)
    if len(theta) <= DENSE_MAX_D:
        return _projected_bfgs(evaluate, theta, hessian, radius, settings.tol, settings.max_iter, noise)
    return Solution(*_projected_lbfgs(evaluate, theta, radius, settings.tol, settings.max_iter, noise), None)


def _adam(evaluate, theta: torch.Tensor, lr: float, steps: int, clip_norm: float, radius: float) -> torch.Tensor:
    """Seed 002: Adam on J, the gradient clipped to norm clip_norm, theta projected onto the ball."""
    theta = theta.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=lr)
    for step in range(steps):
        theta.grad = evaluate(theta.detach(), step).grad.to(theta.dtype)
        torch.nn.utils.clip_grad_norm_([theta], max_norm=clip_norm)
        optimizer.step()
        with torch.no_grad():
            theta.copy_(project(theta, radius))
    return theta.detach()


def _projected_bfgs(evaluate, theta, B: torch.Tensor, radius: float, tol: float, max_iter: int, noise: float):
    """Minimize J over the ball from the model Hessian B: each step minimizes the BFGS model
    g·s + ½ s^T B s exactly over the ball, then backtracks (Armijo) along it. Stops at
    certificate <= tol, or when no step decreases J any more (the float noise floor)."""
    value = evaluate(theta, 0)
    for iteration in range(max_iter):
        if projected_gradient_norm(theta, value.grad, radius) <= tol:
            return Solution(theta, iteration, value, B)
        step = _ball_model_minimizer(theta, value.grad, B, radius) - theta
        slope, t = float(value.grad @ step), 1.0
        if slope >= 0:
            return Solution(theta, iteration, value, B)
        for _ in range(20):  # t >= 2^-19: a step cut further is lost in the float noise floor
            if -t * slope < noise * max(1.0, abs(value.objective)):
                return Solution(theta, iteration, value, B)
            trial = evaluate(theta + t * step, iteration + 1)
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


def _ball_model_minimizer(theta, grad, B, radius) -> torch.Tensor:
    """argmin over ‖x‖ <= radius of grad·(x - theta) + ½ (x - theta)^T B (x - theta), B positive
    definite: x(mu) = (B + mu I)^-1 (B theta - grad), with mu >= 0 the least that lands in the ball
    (‖x(mu)‖ decreases in mu; bisection)."""
    eigenvalues, Q = torch.linalg.eigh(B)
    eigenvalues = eigenvalues.clamp_min(eigenvalues.max() * 1e-12)
    c = Q.T @ (B @ theta - grad)

    def x(mu: float) -> torch.Tensor:
        return Q @ (c / (eigenvalues + mu))

    if x(0.0).norm() <= radius:
        return x(0.0)
    low, high = 0.0, float(c.norm()) / radius
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if x(middle).norm() > radius else (low, middle)
    return x(high)


def _projected_lbfgs(evaluate, theta, radius: float, tol: float, max_iter: int, noise: float, memory: int = 10):
    """Limited-memory BFGS inside the ball, spectral projected gradient on it. Each iteration takes the
    two-loop direction d from the last `memory` pairs (s, y) when x + d stays in the ball; else the
    Barzilai-Borwein projected gradient step proj(x - lambda g) - x, lambda = s·s / s·y of the last pair
    (Birgin, Martínez and Raydan's SPG, which binding balls suit). Then Armijo backtracking against the
    largest of the last 10 objectives (non-monotone; the step is feasible: the ball is convex). Memory
    O(memory d): the exact solver for large d (the full bias, whose curvatures span four decades, where
    gradient steps alone crawl once the ball lets go)."""
    value, pairs, history = evaluate(theta, 0), [], []
    for iteration in range(max_iter):
        grad = value.grad
        if projected_gradient_norm(theta, grad, radius) <= tol:
            return theta, iteration, value
        history = [*history[-9:], value.objective]
        step = None
        if pairs:
            q, alphas = grad.clone(), []
            for s, y, rho in reversed(pairs):
                alphas.append(rho * float(s @ q))
                q -= alphas[-1] * y
            q *= float(pairs[-1][0] @ pairs[-1][1]) / float(pairs[-1][1] @ pairs[-1][1])
            for (s, y, rho), alpha in zip(pairs, reversed(alphas)):
                q += (alpha - rho * float(y @ q)) * s
            if (theta - q).norm() <= radius:
                step = -q
        if step is None or float(grad @ step) >= 0:
            bb = float(pairs[-1][0] @ pairs[-1][0]) * pairs[-1][2] if pairs else 1.0
            step = project(theta - min(max(bb, 1e-10), 1e10) * grad, radius) - theta
        slope, t = float(grad @ step), 1.0
        if slope >= 0:
            return theta, iteration, value
        for _ in range(20):
            if -t * slope < noise * max(1.0, abs(value.objective)):
                return theta, iteration, value
            trial = evaluate(theta + t * step, iteration + 1)
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
