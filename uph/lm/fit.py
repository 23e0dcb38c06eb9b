"""Fitting theta: one engine for every head, minimizing seed 002's objective, with two solvers.

For tokens t = 1..n with base logits z0_t = W h_t + b and head logits z_t = z0_t + P u_t, where
u_t = theta ⊙ a_t (a_t = A h_t for conditional heads, a_t = 1 otherwise; see uph.lm.heads):

    J(theta) = mean_t [CE(z_t, y_t) + beta KL(p0_t ‖ p_t)] + lam ‖theta‖²   over ‖theta‖ <= max_norm.

Both terms need only the change of log-partition L_t = log Σ_v p0_tv exp(P_v · u_t):

    CE_t = nll0_t + L_t - P_{y_t} · u_t          KL_t = L_t - m_t · u_t,   m_t = P^T p0_t
    J(theta)  = mean nll0 + (1 + beta) mean_t L_t - theta · (ybar + beta mbar) + lam ‖theta‖²
    ∇J(theta) = (1 + beta) mean_t a_t ⊙ P^T p_t - (ybar + beta mbar) + 2 lam theta

with ybar = mean_t a_t ⊙ P_{y_t}, mbar = mean_t a_t ⊙ m_t, p_t = softmax(z_t). So p0 [n, V] is
computed once per split (`prepare`: the only V×H products), a, ybar and mbar once per head
(`Objective`); an evaluation costs, per chunk of c tokens, two [c, d]×[d, V] products and one exp
(conditional heads), or two passes over p0 (unconditional heads: P theta is the same for every
token). L_t is taken relative to its value at theta = 0, computed by the same code: the KL is
exactly 0 there, and p0 need only be known up to a factor per token. J is convex (strictly for
lam > 0), so the minimizer is unique.

Solvers: "seed" is seed 002's Adam (zero start, gradient-norm clipping at max_norm, then
projection onto the ball of radius max_norm); "exact" is a projected quasi-Newton method (a BFGS
model, started from the Hessian diagonal at 0, minimized exactly over the ball; Armijo
backtracking) that stops when the projected-gradient norm, reported as `certificate`, is <= tol.

Numerics: theta never leaves the ball, so no learning rate makes a fit run away (a huge lr only
bounces the seed solver around the sphere; its certificate shows it). A NaN or inf, which only a
scale that overflows float32 can cause (the schema caps fit.alphas and fit.lm_head_update.gamma,
and the cache refuses non-finite hidden states), raises FitDivergedError: a table never averages
a NaN. A fit that stops short of tol is no error: its certificate is in every row.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from uph.errors import ConfigError, FitDivergedError
from uph.lm.heads import Head

CHUNK = 256  # tokens per chunk: p0 of a chunk is a [V, CHUNK] block, 50 MB at V = 49152
VOCAB_BLOCK = 4096  # vocabulary rows per work block: [VOCAB_BLOCK, CHUNK] float32 is 4 MB
EXP_SAFE = 60.0  # |P_v · u_t| below this cannot overflow or underflow the float32 exp sums
LOG2E = 1.4426950408889634
SOLVERS = ("seed", "exact")


@dataclass
class Chunk:
    hidden: torch.Tensor  # [c, H] as given (float32 or bfloat16)
    targets: torch.Tensor  # [c] next-token ids
    nll0: torch.Tensor  # [c] base cross-entropy per token
    p0: torch.Tensor | None  # [V, c] base probabilities up to a factor per token; None: recomputed


@dataclass
class Tokens:
    """A split's tokens with the base distribution of each token, cached within a memory budget."""

    chunks: list[Chunk]
    W: torch.Tensor
    b: torch.Tensor | None

    @property
    def n(self) -> int:
        return sum(len(chunk.targets) for chunk in self.chunks)

    @property
    def device(self) -> torch.device:
        return self.W.device

    @property
    def base_nll(self) -> float:
        return float(sum(chunk.nll0.sum(dtype=torch.float64) for chunk in self.chunks) / self.n)

    def probabilities(self):
        """(chunk, p0 [V, c] up to a factor per token) for every chunk, from the cache or recomputed."""
        for chunk in self.chunks:
            yield chunk, chunk.p0 if chunk.p0 is not None else base_distribution(chunk, self.W, self.b)[0]


def base_distribution(chunk: Chunk, W: torch.Tensor, b: torch.Tensor | None):
    """exp(z - max z) for z = W h + b, vocabulary-major [V, c] (p0 up to a factor per token, which
    every use divides out: see Objective), and the base cross-entropy of the targets [c]."""
    z = W @ chunk.hidden.to(W.dtype).T
    if b is not None:
        z += b[:, None]
    top = z.amax(dim=0, keepdim=True)
    target = z.gather(0, chunk.targets[None, :])
    unnormalized = z.sub_(top).exp_()
    nll0 = (top + unnormalized.sum(dim=0, keepdim=True).log() - target).squeeze(0)
    return unnormalized, nll0


def prepare(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None = None,
    cache_bytes: float = 4 * 2**30,
    chunk: int = CHUNK,
    device: torch.device | str = "cpu",
) -> Tokens:
    """A split's tokens (hidden [n, H], targets [n]) on `device`, p0 cached for up to `cache_bytes`.

    Chunks beyond the budget recompute p0 through the lm_head whenever they are used. Everything
    computes in float32 (float64 if W is given so)."""
    if hidden.shape[0] != targets.shape[0] or hidden.shape[1] != W.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, targets {tuple(targets.shape)} and W {tuple(W.shape)} do not fit together"
        )
    dtype = torch.float64 if W.dtype == torch.float64 else torch.float32
    W, b = W.to(device, dtype).contiguous(), None if b is None else b.to(device, dtype)
    chunks, budget = [], cache_bytes
    for start in range(0, hidden.shape[0], chunk):
        piece = Chunk(
            hidden[start : start + chunk].to(device), targets[start : start + chunk].to(device).long(), None, None
        )
        p0, piece.nll0 = base_distribution(piece, W, b)
        if p0.numel() * p0.element_size() <= budget:
            piece.p0, budget = p0, budget - p0.numel() * p0.element_size()
        chunks.append(piece)
    return Tokens(chunks, W, b)


def pool(splits: list[Tokens]) -> Tokens:
    """All the splits' tokens as one (the pooled `global` theta), sharing their caches."""
    return Tokens([chunk for split in splits for chunk in split.chunks], splits[0].W, splits[0].b)


@dataclass
class Value:
    objective: float
    ce: float
    kl: float
    grad: torch.Tensor | None  # [d] float64


class Objective:
    """Seed 002's J(theta) for one head on some tokens, with its gradient (module docstring)."""

    def __init__(self, tokens: Tokens, head: Head, beta: float = 0.05, lam: float = 1e-4):
        self.tokens, self.beta, self.lam, self.d = tokens, beta, lam, head.d
        self.dtype, self.device = tokens.W.dtype, tokens.device
        self.P = head.P.to(self.device, self.dtype).contiguous()
        self.PT = self.P.T.contiguous()
        self.P_log2e = self.P * LOG2E  # exp(x) = exp2(x log2 e), and exp2 is faster
        self.reach = float(self.P.norm(dim=1).max())  # |P_v · u| <= reach ‖u‖
        columns = max(len(chunk.targets) for chunk in tokens.chunks)
        self.scratch = torch.empty(VOCAB_BLOCK * columns, dtype=self.dtype, device=self.device)
        self.a = None
        if head.conditional:
            A = head.A.to(self.device, self.dtype)
            self.a = [chunk.hidden.to(self.dtype) @ A.T for chunk in tokens.chunks]
        self.ybar = (
            sum(
                (self._a(i, chunk) * self.P[chunk.targets]).sum(0, dtype=torch.float64)
                for i, chunk in enumerate(tokens.chunks)
            ).cpu()
            / tokens.n
        )
        self.log_z0, grad0 = self._log_partitions(torch.zeros(self.d), need_grad=True)
        self.mbar = grad0 / tokens.n

    def _block(self, rows: int, columns: int) -> torch.Tensor:
        """The reused work block [rows <= VOCAB_BLOCK, columns]: small enough to stay in cache, and
        allocated once (a fresh block per chunk would cost page faults)."""
        return self.scratch[: rows * columns].view(rows, columns)

    def _a(self, i: int, chunk: Chunk) -> torch.Tensor:
        return self.a[i] if self.a is not None else torch.ones(1, self.d, dtype=self.dtype, device=self.device)

    def _log_partitions(self, theta: torch.Tensor, need_grad: bool):
        """Per chunk log Σ_v p0_tv exp(P_v · u_t) [c]; and Σ_t a_t ⊙ P^T p_t [d] if need_grad. The
        vocabulary is walked in blocks of VOCAB_BLOCK rows, so each pass over a block hits cache."""
        theta = theta.to(self.device, self.dtype)
        log_z, grad = [], torch.zeros(self.d, dtype=torch.float64, device=self.device)
        if self.a is None:
            s = self.P @ theta
            shift = s.max()
            e = (s - shift).exp_()
            inverse_z_p0 = torch.zeros_like(e, dtype=torch.float64)  # Σ_t p0_t / Z_t
            for _chunk, p0 in self.tokens.probabilities():
                # Z_t = Σ_v p0_tv e_v by cascade sums over blocks: e @ p0 would lose ~1e-4 over V terms
                z = sum(
                    torch.mul(p, e_v[:, None], out=self._block(*p.shape)).sum(dim=0)
                    for p, e_v in zip(p0.split(VOCAB_BLOCK), e.split(VOCAB_BLOCK))
                )
                log_z.append(z.log() + shift)
                if need_grad:
                    inverse_z_p0 += p0 @ z.reciprocal()
            return log_z, (self.P.double().T @ (e * inverse_z_p0)).cpu() if need_grad else None
        blocks = list(zip(self.P_log2e.split(VOCAB_BLOCK), self.PT.split(VOCAB_BLOCK, dim=1)))
        for a, (_chunk, p0) in zip(self.a, self.tokens.probabilities()):
            u = a * theta
            shift = None
            if float(u.norm(dim=1).max()) * self.reach > EXP_SAFE:  # rare: each token's max first
                shift = torch.stack([(P_v @ u.T).amax(dim=0) for P_v, _ in blocks]).amax(dim=0)
            z = torch.zeros(len(u), dtype=self.dtype, device=self.device)
            p_sum = torch.zeros(self.d, len(u), dtype=self.dtype, device=self.device)  # Σ_v P_v p_tv Z_t
            for (P_v, PT_v), p in zip(blocks, p0.split(VOCAB_BLOCK)):
                s = torch.mm(P_v, u.T, out=self._block(len(P_v), len(u)))  # P u_t in units of ln 2
                if shift is not None:
                    s.sub_(shift)
                e = s.exp2_().mul_(p)  # p_t up to 1 / Z_t
                z += e.sum(dim=0)
                if need_grad:
                    p_sum.addmm_(PT_v, e)
            log_z.append(z.log() if shift is None else z.log() + shift / LOG2E)
            if need_grad:
                grad += (a * p_sum.T / z[:, None]).sum(0, dtype=torch.float64)
        return log_z, grad.cpu() if need_grad else None

    def curvature(self) -> torch.Tensor:
        """diag ∇²J at theta = 0 [d]: (1 + beta) mean_t a_t² ⊙ Var_{p0_t}(P) + 2 lam (the exact
        solver's first quasi-Newton model; one more [c, V]×[V, 2d] product per chunk)."""
        P_and_squares = torch.cat([self.PT, self.PT.square()])
        total = torch.zeros(self.d, dtype=torch.float64, device=self.device)
        for i, ((chunk, p0), log_z0) in enumerate(zip(self.tokens.probabilities(), self.log_z0)):
            moments = (P_and_squares @ p0).T / log_z0.exp()[:, None]
            variance = moments[:, self.d :] - moments[:, : self.d].square()
            total += (self._a(i, chunk).square() * variance).sum(0, dtype=torch.float64)
        return ((1 + self.beta) * total / self.tokens.n + 2 * self.lam).cpu()

    def __call__(self, theta: torch.Tensor, need_grad: bool = True) -> Value:
        n = self.tokens.n
        if theta.any():
            log_z, grad = self._log_partitions(theta, need_grad)
        else:  # the base model: known from the pass at theta = 0 in __init__
            log_z, grad = self.log_z0, self.mbar * n
        mean_l = float(sum((lz - lz0).sum(dtype=torch.float64) for lz, lz0 in zip(log_z, self.log_z0))) / n
        theta = theta.detach().double().cpu()
        ce = self.tokens.base_nll + mean_l - theta @ self.ybar
        kl = mean_l - theta @ self.mbar
        objective = ce + self.beta * kl + self.lam * theta @ theta
        if need_grad:
            grad = (1 + self.beta) * grad / n - self.ybar - self.beta * self.mbar + 2 * self.lam * theta
        return Value(float(objective), float(ce), float(kl), grad)


def projected_gradient_norm(theta: torch.Tensor, grad: torch.Tensor, radius: float) -> float:
    """‖grad‖ without the part the ball blocks: on the sphere an outward -grad is no descent.
    Zero exactly at the constrained minimizer (KKT: grad = -mu theta, mu >= 0)."""
    theta, grad = theta.double(), grad.double()
    norm = theta.norm()
    if norm >= radius * (1 - 1e-6):
        outward = theta / norm
        grad = grad - torch.clamp(grad @ outward, max=0) * outward
    return float(grad.norm())


def project(theta: torch.Tensor, radius: float) -> torch.Tensor:
    norm = theta.norm()
    return theta * (radius / norm) if norm > radius else theta


@dataclass
class FitResult:
    solver: str
    objective: float
    ce: float
    kl: float
    certificate: float  # projected-gradient norm at theta
    iterations: int
    evaluations: int
    seconds: float
    theta_norm: float

    def as_dict(self) -> dict:
        return asdict(self)


def fit_theta(
    tokens: Tokens,
    head: Head,
    solver: str = "seed",
    beta: float = 0.05,
    lam: float = 1e-4,
    max_norm: float = 5.0,
    lr: float = 0.05,
    steps: int = 30,
    tol: float = 1e-5,
    max_iter: int = 300,
    theta0: torch.Tensor | None = None,
    user: str = "?",
    config: str | dict = "?",
) -> tuple[torch.Tensor, FitResult]:
    """Fit theta [d] for `head` on `tokens` (one user's train split, or `pool(...)` of all).

    A NaN or inf raises FitDivergedError naming `user` and `config`."""
    if solver not in SOLVERS:
        raise ConfigError(f"config key 'fit.solvers': unknown solver '{solver}' (known: {', '.join(SOLVERS)})")
    label = " ".join(f"{k}={v}" for k, v in config.items()) if isinstance(config, dict) else config
    start = time.perf_counter()
    objective = Objective(tokens, head, beta, lam)
    evaluations = 0

    def evaluate(theta: torch.Tensor, iteration: int) -> Value:
        nonlocal evaluations
        evaluations += 1
        value = objective(theta)
        if not (
            torch.isfinite(theta).all()
            and torch.isfinite(value.grad).all()
            and torch.isfinite(torch.tensor(value.objective))
        ):
            raise FitDivergedError(
                f"fit of user '{user}' ({label}, solver {solver}) diverged at iteration "
                f"{iteration}: objective {value.objective}, |theta| {float(theta.norm())}; "
                "lower config key 'fit.alphas' or 'fit.max_norm'"
            )
        return value

    theta = torch.zeros(head.d, dtype=objective.dtype) if theta0 is None else theta0.to(objective.dtype)
    if solver == "seed":
        theta, iterations = _adam(evaluate, theta, lr, steps, max_norm), steps
        value = evaluate(theta, iterations)
    else:
        theta, iterations, value = _projected_bfgs(
            evaluate, project(theta.double(), max_norm), torch.diag(objective.curvature()), max_norm, tol, max_iter
        )
    return theta, FitResult(
        solver,
        value.objective,
        value.ce,
        value.kl,
        projected_gradient_norm(theta, value.grad, max_norm),
        iterations,
        evaluations,
        time.perf_counter() - start,
        float(theta.norm()),
    )


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
        for _ in range(40):
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
