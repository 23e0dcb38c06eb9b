"""Fitting theta: one engine for every head (uph.lm.engine.objective's J over the ball ‖theta‖ <= radius),
with two solvers (uph.lm.engine.solvers), one radius or a path of them, alone or beside other fits
(uph.lm.engine.lockstep).

theta never leaves the ball. A NaN or inf, which only a scale that overflows float32 can
cause (the schema caps fit.alphas and fit.lm_head_update.gamma, and the cache refuses non-finite
hidden states), raises FitDivergedError: a table never averages a NaN. A fit that stops short of
tol is no error: its certificate is in every row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from dataclasses import dataclass, field, fields

import torch

from uph.errors import ConfigError, FitDivergedError
from uph.lm.engine.heads import Head
from uph.lm.engine.lockstep import run
from uph.lm.engine.objective import HeadOnTokens, Objective, Value
from uph.lm.engine.solvers import NOISE, SOLVERS, SolverSettings, minimize, projected_gradient_norm
from uph.lm.engine.tokens import Tokens

SEED_RADIUS = 5.0  # seed 002's ball (its max_norm); the study chooses its radius on validation (uph.lm.engine.capacity)


@dataclass
class FitResult:
    solver: str
    radius: float  # of the ball theta was fitted in
    objective: float
    ce: float
    kl: float
    certificate: float  # projected-gradient norm at theta
    iterations: int
    evaluations: int
    seconds: float
    theta_norm: float
    model: torch.Tensor | None = field(default=None, repr=False)  # exact's quasi-Newton model at theta

    def as_dict(self) -> dict:
        """The fit's columns (the model stays out: a warm start's, WarmStart)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}


@dataclass(frozen=True)
class WarmStart:
    """Where a refit starts: a path's theta at the chosen radius and the exact solver's BFGS model there,
    fitted on the user's fit part (uph.lm.jobs.validate). J on all train tokens is a convex neighbour of the fit
    part's, so the refit needs a few steps from it instead of a cold start's curvature pass and path from
    zero; its optimum and certificate are the same as a cold refit's."""

    theta: torch.Tensor
    model: torch.Tensor


def fit_theta(
    tokens: Tokens,
    head: Head,
    solver: str,
    settings: SolverSettings,
    radius: float = SEED_RADIUS,
    offset: torch.Tensor | None = None,
    user: str = "?",
    label: str = "?",
    shared: HeadOnTokens | None = None,
    start: WarmStart | None = None,
) -> tuple[torch.Tensor, FitResult]:
    """Fit theta [d] over the ball of `radius` for `head` on `tokens` (one user's train split, or
    `pool(...)` of all); with `offset`, the residual theta on top of that fixed one (module docstring);
    `shared`: the work of the other arms of `head` on `tokens` (HeadOnTokens); `start`: the exact
    solver's warm start (else theta = 0 and the curvature at the base).

    A NaN or inf raises FitDivergedError naming `user` and `label` (the sweep point)."""
    return run(fit_theta_steps(tokens, head, solver, settings, radius, offset, user, label, shared, start))


def fit_theta_steps(tokens, head, solver, settings, radius=SEED_RADIUS, *args, **kwargs):
    """fit_theta as a fit's steps (uph.lm.engine.lockstep): a generator of evaluation requests."""
    return (yield from fit_path_steps(tokens, head, solver, settings, [radius], *args, **kwargs))[0]


def fit_path(*args, **kwargs) -> list[tuple[torch.Tensor, FitResult]]:
    """fit_theta at every radius of `radii` (ascending): fit_path_steps (its arguments), run alone."""
    return run(fit_path_steps(*args, **kwargs))


@dataclass
class Evaluations:
    """J's evaluations on one Objective for one fit, counted: `evaluate(theta, iteration)` requests J's Value
    at theta from the driver (a generator: `yield from`) and raises FitDivergedError, naming the fit, at a
    NaN or inf."""

    objective: Objective
    user: str
    label: str
    solver: str
    count: int = 0

    def __call__(self, theta: torch.Tensor, iteration: int):
        self.count += 1
        value = yield self.objective, theta
        if not (math.isfinite(value.objective) and torch.isfinite(value.grad).all() and torch.isfinite(theta).all()):
            raise FitDivergedError(
                f"fit of user {self.user!r} ({self.label}, solver {self.solver}) diverged at iteration "
                f"{iteration}: objective {value.objective}, |theta| {float(theta.norm())}; "
                "lower config key 'fit.alphas' or 'fit.radii'"
            )
        return value


def fit_path_steps(
    tokens: Tokens,
    head: Head,
    solver: str,
    settings: SolverSettings,
    radii,
    offset: torch.Tensor | None = None,
    user: str = "?",
    label: str = "?",
    shared: HeadOnTokens | None = None,
    start: WarmStart | None = None,
) -> Generator[tuple[Objective, torch.Tensor], Value, list[tuple[torch.Tensor, FitResult]]]:
    """fit_theta at every radius of `radii` (ascending), on one Objective (p0's passes for a, ybar, mbar
    and the curvature once for the whole path). exact walks the path warm: each ball starts from the
    last ball's theta and BFGS model, and a theta strictly inside its ball with its certificate met is
    the unconstrained minimizer, so every larger ball's too (no evaluation). adam runs seed 002's
    schedule from zero in every ball, as a fit on its own would. A generator of the path's evaluation
    requests (uph.lm.engine.lockstep: `run` walks it alone, `run_lockstep` beside other users' fits); a ball's
    `seconds` count the rounds it shared."""
    if solver not in SOLVERS:
        raise ConfigError(f"config key 'fit.solvers': unknown solver '{solver}' (known: {', '.join(SOLVERS)})")
    if list(radii) != sorted(radii):
        raise ValueError(f"a path of radii goes up: {list(radii)}")
    clock = time.perf_counter()
    objective = Objective(tokens, head, settings.beta, settings.lam, offset, shared)
    evaluate = Evaluations(objective, user, label, solver)
    path, theta, hessian, value = [], torch.zeros(head.d, dtype=objective.dtype), None, None
    if start is not None and solver == "exact":
        theta, hessian = start.theta.double(), start.model.double()
    for radius in radii:
        theta, value, hessian, iterations = yield from ball_steps(
            solver, evaluate, theta, value, hessian, radius, settings
        )
        seconds, clock = time.perf_counter() - clock, time.perf_counter()
        result = FitResult(
            solver,
            float(radius),
            value.objective,
            value.ce,
            value.kl,
            projected_gradient_norm(theta, value.grad, radius),
            iterations,
            evaluate.count,
            seconds,
            float(theta.norm()),
            hessian,
        )
        path.append((theta, result))
        evaluate.count = 0
    return path


def ball_steps(solver: str, evaluate: Evaluations, theta, value: Value | None, hessian, radius, settings):
    """One ball of a path from the last ball's (theta, value, hessian) (value None at the first): (theta,
    value, hessian, iterations) at its minimizer, with no evaluation where exact's last theta is certified
    inside it. A generator of evaluation requests."""
    certified = value is not None and solver == "exact"
    if certified and projected_gradient_norm(theta, value.grad, radius) <= settings.tol:
        return theta, value, hessian, 0
    if hessian is None and solver == "exact":
        hessian = evaluate.objective.curvature()
    noise = NOISE[evaluate.objective.dtype]
    solution = yield from minimize(solver, evaluate, theta, radius, settings, hessian, noise, value)
    return solution.theta, solution.value, solution.hessian, solution.iterations
