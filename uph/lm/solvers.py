"""Solvers: "adam" is seed 002's schedule (Adam from zero, gradient-norm clipping at max_norm, then
projection onto the ball of radius max_norm; `steps` steps at `lr`); "exact" stops when the
projected-gradient norm, reported as `certificate`, is <= tol: up to d = DENSE_MAX_D a projected
quasi-Newton method (a BFGS model, started from the Hessian diagonal at the base, minimized
exactly over the ball; Armijo backtracking), beyond it the spectral projected gradient method
(Barzilai-Borwein steps, non-monotone Armijo; no d×d matrix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from uph.config import dataclass_fields, schema_defaults

SOLVERS = ("adam", "exact")  # adam: seed 002's schedule; exact: certified optimum
DENSE_MAX_D = 1024  # the exact solver keeps a d×d BFGS model up to this d


@dataclass(frozen=True)
class SolverSettings:
    """The fit section's solver keys (schemas/fit.schema.yaml documents each and holds the defaults)."""

    beta: float
    lam: float
    max_norm: float
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


def minimize(solver: str, evaluate, d: int, dtype: torch.dtype, settings: SolverSettings, curvature):
    """(theta, iterations, last Value) minimizing J over the ball of radius settings.max_norm from theta = 0:
    `evaluate(theta, iteration)` is J's Value with its gradient, `curvature()` J's Hessian diagonal at 0
    (the exact solver's first BFGS model up to d = DENSE_MAX_D); adam runs in `dtype`, exact in float64."""
    theta, radius = torch.zeros(d, dtype=torch.float64), settings.max_norm
    if solver == "adam":
        theta = _adam(evaluate, theta.to(dtype), settings.lr, settings.steps, radius)
        return theta, settings.steps, evaluate(theta, settings.steps)
    if d <= DENSE_MAX_D:
        B = torch.diag(curvature())
        return _projected_bfgs(evaluate, theta, B, radius, settings.tol, settings.max_iter)
    return _spectral_projected_gradient(evaluate, theta, radius, settings.tol, settings.max_iter)


def _adam(evaluate, theta: torch.Tensor, lr: float, steps: int, max_norm: float) -> torch.Tensor:
    """Seed 002: Adam on J, the gradient clipped to norm max_norm, theta projected onto the ball."""
    theta = theta.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=lr)
    for step in range(steps):
        theta.grad = evaluate(theta.detach(), step).grad.to(theta.dtype)
        torch.nn.utils.clip_grad_norm_([theta], max_norm=max_norm)
        optimizer.step()
        with torch.no_grad():
            theta.copy_(project(theta, max_norm))
    return theta.detach()


def _projected_bfgs(evaluate, theta: torch.Tensor, B: torch.Tensor, radius: float, tol: float, max_iter: int):
    """Minimize J over the ball from the model Hessian B: each step minimizes the BFGS model
    g·s + ½ s^T B s exactly over the ball, then backtracks (Armijo) along it. Stops at
    certificate <= tol, or when no step decreases J any more (the float noise floor)."""
    value = evaluate(theta, 0)
    for iteration in range(max_iter):
        if projected_gradient_norm(theta, value.grad, radius) <= tol:
            return theta, iteration, value
        step = _ball_model_minimizer(theta, value.grad, B, radius) - theta
        slope, t = float(value.grad @ step), 1.0
        if slope >= 0:
            return theta, iteration, value
        for _ in range(20):  # t >= 2^-19: a step cut further is lost in the float noise floor
            trial = evaluate(theta + t * step, iteration + 1)
            if trial.objective <= value.objective + 1e-4 * t * slope:
                break
            t /= 2
        else:
            return theta, iteration, value
        s, y = t * step, trial.grad - value.grad
        if float(s @ y) > 1e-12 * float(s.norm() * y.norm()):
            Bs = B @ s
            B = B - torch.outer(Bs, Bs) / (s @ Bs) + torch.outer(y, y) / (s @ y)
        theta, value = theta + s, trial
    return theta, max_iter, value


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


def _spectral_projected_gradient(evaluate, theta: torch.Tensor, radius: float, tol: float, max_iter: int):
    """Birgin, Martínez and Raydan's SPG over the ball: x+ = proj(x - lambda g) with the
    Barzilai-Borwein step lambda = s·s / s·y, then Armijo backtracking against the largest of the
    last 10 objectives (non-monotone). Memory O(d): the exact solver for large d."""
    value, history, step = evaluate(theta, 0), [], 1.0
    for iteration in range(max_iter):
        if projected_gradient_norm(theta, value.grad, radius) <= tol:
            return theta, iteration, value
        history = [*history[-9:], value.objective]
        direction = project(theta - step * value.grad, radius) - theta
        slope, t = float(value.grad @ direction), 1.0
        if slope >= 0:
            return theta, iteration, value
        for _ in range(20):
            trial = evaluate(theta + t * direction, iteration + 1)
            if trial.objective <= max(history) + 1e-4 * t * slope:
                break
            t /= 2
        else:
            return theta, iteration, value
        s, y = t * direction, trial.grad - value.grad
        sy = float(s @ y)
        step = min(max(float(s @ s) / sy, 1e-10), 1e10) if sy > 0 else 1e10
        theta, value = theta + s, trial
    return theta, max_iter, value
