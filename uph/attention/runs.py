"""R independent runs as one model: every weight carries a leading run dimension.

A tensor that flows through these layers is [R, ...]; run r's slice only ever meets run r's weights,
so R runs cost one kernel per op instead of R. At the attention study's sizes (32-wide matrices,
768 tokens a step) one run leaves a GPU idle (its step is kernel launches) and a CPU core partly in per-op
overhead (what runs at once cost against runs alone, on each: docs/performance.md, "Training branches").
Each run keeps everything a run trained alone has: its initial weights (`init_runs`), its own
lr, Adam moments, gradient clipping and best weights (RunAdamW); a finished run leaves the batch
(RunAdamW.keep_runs) and stops costing.

    RunLinear:     y[r] = x[r] W[r]^T            W [R, out, in]: one batched product
    RunEmbedding:  y[r] = E[r][tokens[r]]        E [R, V, C]: one lookup in the flat [R V, C] table
    RunRMSNorm:    y[r] = x[r] / rms(x[r]) * g[r]

Run r's slice of each layer is drawn exactly as the torch layer it stands for draws its weight
(nn.Linear's kaiming-uniform with a = sqrt 5, nn.Embedding's N(0, 1), nn.RMSNorm's ones), at
construction (so a one-run model draws what its torch twin draws), and again by `init_runs`, which
draws each run's layers in the order a constructor builds them (a module's children, then its own
weights): run r under seed s starts where the one-run model built under torch.manual_seed(s) starts.

RunAdamW is torch.optim.AdamW (decoupled weight decay, torch's defaults) with one lr per run:

    p <- p (1 - lr_r wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr_r / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


def _per_run(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """values [R] shaped to broadcast against a tensor [R, ...] like `like`."""
    return values.view(-1, *[1] * (like.dim() - 1))


class RunLinear(nn.Module):
    """Bias-free linear maps, one per run: x [R, ..., in] -> [R, ..., out]."""

    def __init__(self, runs: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(runs, out_features, in_features))
        for r in range(runs):
            self.init_run(r)

    def init_run(self, r: int) -> None:
        nn.init.kaiming_uniform_(self.weight.data[r], a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        R, out, n_in = self.weight.shape
        return torch.matmul(x.reshape(R, -1, n_in), self.weight.mT).view(*x.shape[:-1], out)


class RunEmbedding(nn.Module):
    """Token embeddings, one table per run: tokens [R, ...] -> [R, ..., C]."""

    def __init__(self, runs: int, vocab: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(runs, vocab, dim))
        for r in range(runs):
            self.init_run(r)

    def init_run(self, r: int) -> None:
        self.weight.data[r].normal_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        R, vocab, dim = self.weight.shape
        offsets = _per_run(torch.arange(R, device=tokens.device) * vocab, tokens)
        return F.embedding(tokens + offsets, self.weight.reshape(R * vocab, dim))  # a copy where RunAdamW holds it


class RunRMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned gain per run (eps: the dtype's, as nn.RMSNorm's None)."""

    def __init__(self, runs: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(runs, dim))
        for r in range(runs):
            self.init_run(r)

    def init_run(self, r: int) -> None:
        self.weight.data[r].fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.weight.view(self.weight.shape[0], *[1] * (x.dim() - 2), -1)
        return F.rms_norm(x, x.shape[-1:]) * gain


def _init_run(module: nn.Module, r: int) -> None:
    for child in module.children():
        _init_run(child, r)
    if hasattr(module, "init_run"):
        module.init_run(r)


def init_runs(model: nn.Module, seeds: Sequence[int] | None = None) -> None:
    """Draw every run's initial weights: run r under torch.manual_seed(seeds[r]), or all runs one after
    another from the current generator when `seeds` is None."""
    for r in range(runs_of(model)):
        if seeds is not None:
            torch.manual_seed(seeds[r])
        _init_run(model, r)


def runs_of(model: nn.Module) -> int:
    return next(model.parameters()).shape[0]


def with_run_dim(
    x: torch.Tensor, loud: torch.Tensor | None, runs: int, dims: int
) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """(x and `loud` with a leading run dimension, whether one was added): a one-run model also reads x
    without it (`dims` dimensions, e.g. tokens [B, T], and loud [B, T]); R runs need x [R, ...]."""
    if x.dim() == dims:
        if runs != 1:
            raise ValueError(f"a model of {runs} runs reads inputs with a leading run dimension, not {tuple(x.shape)}")
        return x[None], (None if loud is None else loud[None]), True
    return x, loud, False


def run_state(model: nn.Module, r: int) -> dict[str, torch.Tensor]:
    """Run r's weights, a copy: {name: [...]} without the run dimension."""
    return {name: p.detach()[r].clone() for name, p in model.named_parameters()}


def _set_parameters(model: nn.Module, tensors: Sequence[torch.Tensor]) -> list[nn.Parameter]:
    """Every parameter of `model`, in parameters() order, replaced by a new one holding the next of `tensors`
    (new leaves: autograd keeps a parameter's shape, so runs are never cut out of one in place); returns them."""
    slots = [(module, name) for module in model.modules() for name in module._parameters]
    for (module, name), tensor in zip(slots, tensors, strict=True):
        module._parameters[name] = nn.Parameter(tensor)
    return [module._parameters[name] for module, name in slots]


def load_runs(model: nn.Module, states: Sequence[dict[str, torch.Tensor]]) -> nn.Module:
    """Set the model's runs to `states` (run_state's), one run each, in order; returns the model."""
    stacked = [torch.stack([state[name] for state in states]).to(p.device) for name, p in model.named_parameters()]
    _set_parameters(model, stacked)
    return model


def grad_norms(parameters: Sequence[torch.Tensor]) -> torch.Tensor:
    """[R] each run's L2 norm of the gradients its slices of `parameters` hold (NaN if none do): the norm of
    the parameters' norms, each a reduction along a run's own row, so that a run's norm does not depend on
    how many runs its batch holds (a reduction across the rows' columns would)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.full((parameters[0].shape[0],), math.nan)
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)  # [R, P]
    return torch.linalg.vector_norm(norms, dim=1)


class RunAdamW:
    """torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8) and clip_grad_norm_ for each run of `model`, run r at
    lrs[r] times the schedule's factor; the step count is shared (the runs of a batch start together).

    The model's weights live in one buffer [R, N], row r all of run r's N weights (its parameters become
    views of it), and so do their moments and, gathered by one cat after backward, their gradients: a step
    is a dozen ops on that buffer whatever the number of weights, not a dozen per weight, and a per-run
    scalar is a column [R, 1]. (Gradients written straight into views of one buffer cost more: autograd
    adds each into its view instead of handing it over.)

    A step is `advance` (the host's part: the step count, and the step's scalars, the schedule's factor
    and the two bias corrections, copied into one device tensor) then `apply` (the device's part, reading
    them there), so a GPU can capture `apply` once and replay it each step (uph.attention.steps). The
    scalars enter the same float32 and float64 operations as Python numbers would on a CPU."""

    def __init__(
        self,
        model: nn.Module,
        lrs: Sequence[float],
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.model, self.weight_decay, self.betas, self.eps, self.t = model, weight_decay, betas, eps, 0
        device = next(model.parameters()).device
        # in double, as torch computes its scalars, and on the device: no copy to it, so no wait, each step
        self.lrs = torch.tensor(lrs, dtype=torch.float64, device=device)
        # the step's factor, 1 - b1^t and sqrt(1 - b2^t), written by advance
        self.scalars = torch.ones(3, dtype=torch.float64, device=device)
        weights = torch.cat([p.detach().reshape(len(lrs), -1) for p in model.parameters()], dim=1)
        self._hold(weights, torch.zeros_like(weights), torch.zeros_like(weights))

    def _hold(self, weights: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
        """Hold the buffers [R, N] (fresh, contiguous) and the model's parameters as views of the weights."""
        self.flat, self.m, self.v = weights.contiguous(), m.contiguous(), v.contiguous()
        runs, offset, views = self.flat.shape[0], 0, []
        for p in self.model.parameters():
            size = p[0].numel()
            views.append(self.flat[:, offset : offset + size].view(runs, *p.shape[1:]))
            offset += size
        self.params, self.grad = _set_parameters(self.model, views), None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad = None

    def _gradients(self) -> torch.Tensor:
        """[R, N] the gradients backward left, gathered once after it."""
        if self.grad is None:
            self.grad = torch.cat([p.grad.reshape(p.shape[0], -1) for p in self.params], dim=1)
        return self.grad

    @torch.no_grad()
    def clip_grad_norms(self, max_norm: float) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ for each run on its own: run r's gradients (gathered into one buffer
        for `step`) times min(1, max_norm / (||g_r|| + 1e-6)); returns the norms before clipping [R]."""
        norms = torch.linalg.vector_norm(self._gradients(), dim=1)
        self.grad.mul_((max_norm / (norms + 1e-6)).clamp_(max=1.0)[:, None])
        return norms

    def step(self, factor: float = 1.0) -> None:
        self.advance(factor)
        self.apply()

    def advance(self, factor: float) -> None:
        """Count the step and write its scalars into `scalars` (from pinned memory on a GPU, not waiting)."""
        (b1, b2), self.t = self.betas, self.t + 1
        scalars = torch.tensor([factor, 1 - b1**self.t, math.sqrt(1 - b2**self.t)], dtype=torch.float64)
        if self.scalars.is_cuda:
            scalars = scalars.pin_memory()  # torch's pinned cache hands this block out again only once copied
        self.scalars.copy_(scalars, non_blocking=True)

    @torch.no_grad()
    def apply(self) -> None:
        """The step on the device, from the gradients and `scalars`: no value read on the host."""
        (b1, b2), (factor, correction1, correction2) = self.betas, self.scalars
        lrs = self.lrs * factor
        decay, step = (1 - lrs * self.weight_decay).float()[:, None], (lrs / correction1).float()[:, None]
        grad = self._gradients()
        self.flat.mul_(decay)
        self.m.lerp_(grad, 1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denominator = (self.v.sqrt() / correction2.float()).add_(self.eps)
        self.flat.addcdiv_(self.m * step, denominator, value=-1)

    def keep_runs(self, index: torch.Tensor) -> None:
        """Keep the runs `index` [K] (positions in the current run order) of the model, its moments and lrs."""
        self._hold(self.flat[index], self.m[index], self.v[index])
        self.lrs = self.lrs[index]
