"""Training the character MLP (uph.feedback.char_lm) four ways, which differ only in each hidden layer's delta:

    backprop          delta_l = g_l, the true gradient at h_l (propagated back through the network)
    dfa               delta_l = e_L B_l^T, B_l (d_l x V) fixed Gaussian with variance 1/V (direct feedback alignment)
    feedback_frozen   delta_l = alpha_l (e_L C^T) U_l^T with the random U_l and alpha_l frozen (uph.feedback.subspace)
    feedback_learned  the same with U_l and alpha_l updated every step towards g_hat = g_l

The output layer always learns from its own local gradient. Each step: forward, output error
e_L, the true g_l (the oracle alignment signal, and the reference every delta is measured
against), the method's deltas (computed before its feedback update), parameter gradients,
one Adam step. The same seed gives every method the same initial network and the same batches.

Every `log_every` steps a curve row holds the means over the steps since the last row of the
training loss and accuracy, the per-layer alignment (the batch mean of the per-example cosine
between delta_l and g_l) and, for the factored methods, alpha_l, alpha_star_l, rho_l and
tangent_norm_l; plus the held-out loss and accuracy on fixed evenly spaced windows of the tail.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from uph.errors import ConfigError, TrainingDivergedError
from uph.feedback.char_lm import CharCorpus, CharMLP, evenly_spaced_windows, output_error, sample_batch
from uph.feedback.subspace import FeedbackSystem, UpdateConfig

METHODS = ("backprop", "dfa", "feedback_frozen", "feedback_learned")


class Adam:
    """Adam with torch's defaults: m <- b1 m + (1-b1) g, v <- b2 v + (1-b2) g^2,
    p <- p - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). Written out because constructing
    torch.optim.Adam imports torch._dynamo, seconds of every short job."""

    def __init__(
        self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        (b1, b2), self.t = self.betas, self.t + 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denominator = (v / (1 - b2**self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denominator, value=-self.lr / (1 - b1**self.t))


@dataclass(frozen=True)
class TrainConfig:
    context: int = 32
    hidden: tuple[int, ...] = (256, 256)
    steps: int = 3000
    batch_size: int = 64
    lr: float = 1e-3
    log_every: int = 100
    eval_windows: int = 2048
    rank: int = 32
    update: UpdateConfig = field(default_factory=UpdateConfig)


class Backprop:
    def to(self, device: torch.device) -> Backprop:
        return self

    def deltas(self, e: torch.Tensor, true: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict]:
        return true, {}


class DirectFeedback:
    def __init__(self, vocab_size: int, dims: list[int], generator: torch.Generator):
        self.B = [torch.randn(d, vocab_size, generator=generator) / vocab_size**0.5 for d in dims]

    def to(self, device: torch.device) -> DirectFeedback:
        self.B = [B.to(device) for B in self.B]
        return self

    def deltas(self, e: torch.Tensor, true: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict]:
        return [e @ B.T for B in self.B], {}


class FactoredFeedback:
    def __init__(
        self,
        vocab_size: int,
        dims: list[int],
        rank: int,
        update: UpdateConfig,
        frozen: bool,
        generator: torch.Generator,
    ):
        self.system = FeedbackSystem(vocab_size, dims, rank, generator)
        self.update, self.frozen = update, frozen

    def to(self, device: torch.device) -> FactoredFeedback:
        self.system.to(device)
        return self

    def deltas(self, e: torch.Tensor, true: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict]:
        c = self.system.compress_error(e)
        deltas = self.system.compute_deltas(c)
        diagnostics = self.system.update_all(true, c, self.update, self.frozen)
        return deltas, {
            f"{name}_l{l}": value for l, layer in enumerate(diagnostics, 1) for name, value in layer.items()
        }


def make_method(method: str, vocab_size: int, config: TrainConfig, generator: torch.Generator):
    dims = list(config.hidden)
    if method == "backprop":
        return Backprop()
    if method == "dfa":
        return DirectFeedback(vocab_size, dims, generator)
    if method in ("feedback_frozen", "feedback_learned"):
        return FactoredFeedback(vocab_size, dims, config.rank, config.update, method == "feedback_frozen", generator)
    raise ValueError(f"unknown method {method!r} (known: {', '.join(METHODS)})")


@torch.no_grad()
def evaluate(model: CharMLP, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of next-character prediction on windows x, y."""
    loss = correct = 0.0
    for start in range(0, len(y), chunk):
        _, z = model.forward(x[start : start + chunk])
        loss += F.cross_entropy(z, y[start : start + chunk], reduction="sum").item()
        correct += (z.argmax(-1) == y[start : start + chunk]).sum().item()
    return loss / len(y), correct / len(y)


@torch.no_grad()
def train(
    corpus: CharCorpus, method: str, seed: int, config: TrainConfig, device: torch.device | str = "cpu"
) -> pd.DataFrame:
    """Train one network with one method; returns its curves (one row per log step). A NaN or inf
    training loss raises TrainingDivergedError: no table holds a diverged run."""
    vocab_size = len(corpus.vocab)
    model = CharMLP(vocab_size, config.context, list(config.hidden), torch.Generator().manual_seed(seed)).to(device)
    rule = make_method(method, vocab_size, config, torch.Generator().manual_seed(seed + 1_000_000)).to(device)
    batches = torch.Generator().manual_seed(seed + 2_000_000)
    optimizer = Adam(model.params, lr=config.lr)
    x_test, y_test = (t.to(device) for t in evenly_spaced_windows(corpus.test, config.context, config.eval_windows))
    rows, sums, since, start = [], defaultdict(float), 0, time.perf_counter()
    for step in range(1, config.steps + 1):
        x, y = (t.to(device) for t in sample_batch(corpus.train, config.context, config.batch_size, batches))
        hs, z = model.forward(x)
        e = output_error(z, y)
        true = model.backprop_deltas(hs, e)
        deltas, diagnostics = rule.deltas(e, true)
        optimizer.step(model.gradients(x, hs, e, deltas))

        loss = F.cross_entropy(z, y).item()
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"feedback training with {method}, seed {seed}: the training loss is {loss} "
                f"at step {step}; lower config key 'feedback.lr' ({config.lr})"
            )
        sums["train_loss"] += loss
        sums["train_acc"] += (z.argmax(-1) == y).float().mean().item()
        for l, (delta, g) in enumerate(zip(deltas, true), 1):
            sums[f"alignment_l{l}"] += F.cosine_similarity(delta, g, dim=1, eps=1e-12).mean().item()
        for name, value in diagnostics.items():
            sums[name] += value
        since += 1
        if step % config.log_every == 0 or step == config.steps:
            test_loss, test_acc = evaluate(model, x_test, y_test)
            rows.append(
                {
                    "method": method,
                    "seed": seed,
                    "step": step,
                    "seconds": time.perf_counter() - start,
                    **{name: total / since for name, total in sums.items()},
                    "test_loss": test_loss,
                    "test_acc": test_acc,
                }
            )
            sums, since = defaultdict(float), 0
    return pd.DataFrame(rows)


def summarize(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, seed): final held-out loss and accuracy, the mean over the run and the
    final value of the alignment averaged over hidden layers."""
    rows = []
    for (method, seed), run in curves.groupby(["method", "seed"], sort=False):
        run = run.sort_values("step")
        alignment = run.filter(regex=r"^alignment_l\d+$").dropna(axis=1, how="all").mean(axis=1)
        last = run.iloc[-1]
        rows.append(
            {
                "method": method,
                "seed": seed,
                "final_loss": last["test_loss"],
                "final_acc": last["test_acc"],
                "mean_alignment": alignment.mean(),
                "final_alignment": alignment.iloc[-1],
                "final_train_loss": last["train_loss"],
                "steps": int(last["step"]),
            }
        )
    order = {method: i for i, method in enumerate(METHODS)}
    table = pd.DataFrame(rows)
    return table.sort_values(
        ["method", "seed"], key=lambda s: s.map(order) if s.name == "method" else s, kind="stable"
    ).reset_index(drop=True)


def train_config(section: dict) -> TrainConfig:
    """The validated `feedback:` config section as a TrainConfig."""
    update = UpdateConfig(**section["update"])
    if update.alpha_min > update.alpha_max:
        raise ConfigError(
            f"config key 'feedback.update.alpha_min': {update.alpha_min} is above "
            f"feedback.update.alpha_max={update.alpha_max}"
        )
    keys = ("context", "steps", "batch_size", "lr", "log_every", "eval_windows", "rank")
    return TrainConfig(hidden=tuple(section["hidden"]), update=update, **{key: section[key] for key in keys})
