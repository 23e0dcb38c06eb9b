"""Training the character MLP (uph.feedback.char_lm) five ways, which differ only in each hidden layer's delta:

    backprop                 delta_l = g_l, the true gradient at h_l (propagated back through the network)
    dfa                      delta_l = e_L B_l^T, B_l (d_l x V) fixed Gaussian with variance 1/V (direct feedback alignment)
    feedback_frozen          delta_l = alpha_l (e_L C^T) U_l^T with the random U_l and alpha_l frozen (uph.feedback.subspace)
    feedback_learned         the same with U_l and alpha_l updated every step towards a backprop-free g_hat, the
                             config's `signal`: node_perturbation (uph.feedback.node_perturbation, one extra
                             forward pass with noise on every h_l at once)
    feedback_learned_oracle  the same updated towards g_hat = g_l, the true gradient: an oracle upper bound that
                             needs backprop's full backward pass every step, so it is no backprop-free rule

The seed's other suggested signal, a local reconstruction error, is not offered: the seed names no
reconstruction (what from what, with which weights), and a reconstruction error with fixed local
weights (h_l against a decoding of an encoding of it) does not depend on the loss, so its
cross-covariance with c carries no gradient information; making it carry some needs learned
inverses whose targets are propagated down (difference target propagation), a learning rule of its
own with its own weights, not a g_hat for seed 003.

The output layer always learns from its own local gradient. Each step: forward, output error
e_L, the true g_l (the reference every delta is measured against; measured for every method, not
timed, and never passed to a rule), then the learning step `learn`: the rule's deltas (computed
before its feedback update) and feedback update, parameter gradients, one Adam step. Only the
forward pass and `learn` are timed: `update_seconds`. The same seed gives every method the same
initial network and batches, and the factored methods the same C and initial U_l.

Every `log_every` steps a curve row holds the means over the steps since the last row of the
training loss and accuracy, the per-layer alignment (the batch mean of the per-example cosine
between delta_l and g_l) and, for the learned factored methods, alpha_l, alpha_star_l, rho_l and
tangent_norm_l (alpha_l alone for the frozen one); plus the held-out loss and accuracy on fixed
evenly spaced windows of the tail, and the method's signal, whether it needs a backward pass and
its forward passes per step.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from uph.errors import ConfigError, TrainingDivergedError
from uph.feedback.char_lm import CharCorpus, CharMLP, evenly_spaced_windows, output_error, sample_batch
from uph.feedback.comparison import METHODS
from uph.feedback.node_perturbation import node_perturbation
from uph.feedback.subspace import FeedbackSystem, UpdateConfig
from uph.optim import Adam

SIGNALS = ("node_perturbation",)  # the backprop-free g_hat of feedback_learned (config key feedback.signal)


@dataclass(frozen=True)
class TrainConfig:
    """The `feedback:` config section's training keys (defaults: schemas/feedback.schema.yaml); None for
    a key the method does not read (rank: the factored methods, update: the learned ones, signal and
    sigma: feedback_learned)."""

    context: int
    hidden: tuple[int, ...]
    steps: int
    batch_size: int
    lr: float
    log_every: int
    eval_windows: int
    rank: int | None
    signal: str | None
    sigma: float | None
    update: UpdateConfig | None

    @classmethod
    def from_config(cls, section: dict) -> TrainConfig:
        """The validated `feedback:` config section as a TrainConfig. A training job gets only the keys its
        method reads (rules/feedback.smk): rank, update, signal and node_perturbation may be missing, and
        are None then."""
        update = UpdateConfig(**section["update"]) if "update" in section else None
        if update and update.alpha_min > update.alpha_max:
            raise ConfigError(
                f"config key 'feedback.update.alpha_min': {update.alpha_min} is above "
                f"feedback.update.alpha_max={update.alpha_max}"
            )
        keys = ("context", "steps", "batch_size", "lr", "log_every", "eval_windows")
        return cls(
            hidden=tuple(section["hidden"]),
            rank=section.get("rank"),
            signal=section.get("signal"),
            sigma=section.get("node_perturbation", {}).get("sigma"),
            update=update,
            **{key: section[key] for key in keys},
        )


@dataclass
class Batch:
    """One step's batch and the clean forward pass through the network."""

    x: torch.Tensor
    y: torch.Tensor
    hs: list[torch.Tensor]
    z: torch.Tensor
    e: torch.Tensor  # output error e_L


class Backprop:
    signal, needs_backward, forward_passes = "backprop", True, 1

    def step(self, model: CharMLP, batch: Batch) -> tuple[list[torch.Tensor], dict]:
        return model.backprop_deltas(batch.hs, batch.e), {}


class DirectFeedback:
    signal, needs_backward, forward_passes = "none", False, 1

    def __init__(self, vocab_size: int, dims: list[int], generator: torch.Generator, device: torch.device):
        self.B = [(torch.randn(d, vocab_size, generator=generator) / vocab_size**0.5).to(device) for d in dims]

    def step(self, model: CharMLP, batch: Batch) -> tuple[list[torch.Tensor], dict]:
        return [batch.e @ B.T for B in self.B], {}


class FactoredFeedback:
    """Seed 003's feedback; `signal` picks the g_hat its update reads: none (frozen U and alpha),
    node_perturbation (backprop-free) or oracle (the true gradient, by a full backward pass)."""

    def __init__(
        self,
        vocab_size: int,
        dims: list[int],
        config: TrainConfig,
        signal: str,
        generator: torch.Generator,
        device: torch.device,
    ):
        self.system = FeedbackSystem(vocab_size, dims, config.rank, generator).to(device)
        self.update, self.sigma, self.generator = config.update, config.sigma, generator
        self.signal = signal
        self.needs_backward = signal == "oracle"
        self.forward_passes = 2 if signal == "node_perturbation" else 1

    def g_hat(self, model: CharMLP, batch: Batch) -> list[torch.Tensor]:
        if self.signal == "oracle":
            return model.backprop_deltas(batch.hs, batch.e)
        return node_perturbation(
            lambda noise: F.cross_entropy(model.forward(batch.x, noise)[1], batch.y, reduction="none"),
            F.cross_entropy(batch.z, batch.y, reduction="none"),
            [h.shape for h in batch.hs],
            self.sigma,
            self.generator,
        )

    def step(self, model: CharMLP, batch: Batch) -> tuple[list[torch.Tensor], dict]:
        c = self.system.compress_error(batch.e)
        deltas = self.system.compute_deltas(c)
        if self.signal == "none":
            return deltas, {f"alpha_l{l}": layer.alpha.item() for l, layer in enumerate(self.system.layers, 1)}
        diagnostics = self.system.update_all(self.g_hat(model, batch), c, self.update)
        return deltas, {
            f"{name}_l{l}": value for l, layer in enumerate(diagnostics, 1) for name, value in layer.items()
        }


def make_method(method: str, vocab_size: int, config: TrainConfig, generator: torch.Generator, device="cpu"):
    dims, device = list(config.hidden), torch.device(device)
    if method == "backprop":
        return Backprop()
    if method == "dfa":
        return DirectFeedback(vocab_size, dims, generator, device)
    signals = {"feedback_frozen": "none", "feedback_learned": config.signal, "feedback_learned_oracle": "oracle"}
    if method in signals:
        return FactoredFeedback(vocab_size, dims, config, signals[method], generator, device)
    raise ValueError(f"unknown method {method!r} (known: {', '.join(METHODS)})")


def learn(model: CharMLP, rule, optimizer: Adam, batch: Batch) -> tuple[list[torch.Tensor], dict]:
    """The learning step after the forward pass: the rule's deltas and feedback update, the parameter
    gradients from the deltas, one Adam step. Returns the deltas and the rule's diagnostics."""
    deltas, diagnostics = rule.step(model, batch)
    optimizer.step(model.gradients(batch.x, batch.hs, batch.e, deltas))
    return deltas, diagnostics


@torch.no_grad()
def evaluate(model: CharMLP, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of next-character prediction on windows x, y."""
    loss = correct = 0.0
    for start in range(0, len(y), chunk):
        _, z = model.forward(x[start : start + chunk])
        loss += F.cross_entropy(z, y[start : start + chunk], reduction="sum").item()
        correct += (z.argmax(-1) == y[start : start + chunk]).sum().item()
    return loss / len(y), correct / len(y)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def train(
    corpus: CharCorpus, method: str, seed: int, config: TrainConfig, device: torch.device | str = "cpu"
) -> pd.DataFrame:
    """Train one network with one method; returns its curves (one row per log step). A NaN or inf
    training loss raises TrainingDivergedError: no table holds a diverged run."""
    vocab_size, device = len(corpus.vocab), torch.device(device)
    model = CharMLP(vocab_size, config.context, list(config.hidden), torch.Generator().manual_seed(seed)).to(device)
    rule = make_method(method, vocab_size, config, torch.Generator().manual_seed(seed + 1_000_000), device)
    batches = torch.Generator().manual_seed(seed + 2_000_000)
    optimizer = Adam(model.params, lr=config.lr)
    x_test, y_test = (t.to(device) for t in evenly_spaced_windows(corpus.test, config.context, config.eval_windows))
    properties = {
        "signal": rule.signal,
        "needs_backward": rule.needs_backward,
        "forward_passes_per_step": rule.forward_passes,
    }
    rows, sums, since, update_seconds, start = [], defaultdict(float), 0, 0.0, time.perf_counter()
    for step in range(1, config.steps + 1):
        x, y = (t.to(device) for t in sample_batch(corpus.train, config.context, config.batch_size, batches))
        batch, true, deltas, diagnostics, seconds = timed_step(model, rule, optimizer, x, y, device)
        update_seconds += seconds
        loss = F.cross_entropy(batch.z, y).item()
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"feedback training with {method}, seed {seed}: the training loss is {loss} "
                f"at step {step}; lower config key 'feedback.lr' ({config.lr})"
            )
        for name, value in step_metrics(loss, batch, deltas, true, diagnostics).items():
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
                    "update_seconds": update_seconds,
                    **{name: total / since for name, total in sums.items()},
                    "test_loss": test_loss,
                    "test_acc": test_acc,
                    **properties,
                }
            )
            sums, since = defaultdict(float), 0
    return pd.DataFrame(rows)


def train_seeds(
    corpus: CharCorpus,
    method: str,
    seeds: list[int],
    config: TrainConfig,
    device: torch.device | str = "cpu",
    progress: Callable[[pd.DataFrame], None] | None = None,
) -> pd.DataFrame:
    """`train` with one method for each of `seeds`, one after another: one job's runs (rules/feedback.smk),
    so that a process starts and reads the text once per method, not once per seed. Each seed's curves are
    its run alone, bit for bit: every draw comes from generators seeded by the seed, none from torch's
    global state, and nothing carries over from one run to the next. The curves in the order of `seeds`,
    told apart by their `seed` column; `progress(curves)` after each seed's run (the job's log line)."""
    runs = []
    for seed in seeds:
        runs.append(train(corpus, method, seed, config, device))
        if progress is not None:
            progress(runs[-1])
    return pd.concat(runs, ignore_index=True)


def timed_step(model: CharMLP, rule, optimizer: Adam, x: torch.Tensor, y: torch.Tensor, device: torch.device):
    """The forward pass and the learning step on one batch: (Batch, backprop's deltas, the rule's deltas,
    its diagnostics, the seconds they took). Backprop's deltas are the alignment reference only: they never
    reach the rule, and their time is not counted."""
    _synchronize(device)
    timer = time.perf_counter()
    hs, z = model.forward(x)
    batch = Batch(x, y, hs, z, output_error(z, y))
    _synchronize(device)
    forward_seconds = time.perf_counter() - timer
    true = model.backprop_deltas(hs, batch.e)
    timer = time.perf_counter()
    deltas, diagnostics = learn(model, rule, optimizer, batch)
    _synchronize(device)
    return batch, true, deltas, diagnostics, forward_seconds + time.perf_counter() - timer


def step_metrics(loss: float, batch: Batch, deltas: list, true: list, diagnostics: dict) -> dict[str, float]:
    """One step's training loss and accuracy, each layer's cosine between the rule's deltas and backprop's
    (mean over the batch), and the rule's diagnostics."""
    metrics = {"train_loss": loss, "train_acc": (batch.z.argmax(-1) == batch.y).float().mean().item()}
    for l, (delta, g) in enumerate(zip(deltas, true), 1):
        metrics[f"alignment_l{l}"] = F.cosine_similarity(delta, g, dim=1, eps=1e-12).mean().item()
    return {**metrics, **diagnostics}
