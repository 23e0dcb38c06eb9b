"""Seed 004's copy task and its Gram-determinant resilience analysis.

A sequence of even length L is L/2 uniform random tokens followed by the same L/2 tokens again.
The model reads x_0..x_{L-2} and predicts x_1..x_{L-1}; the targets at input positions
t >= L/2 - 1 are copies (x_{t+1} = x_{t+1-L/2}), the first L/2 - 1 are unpredictable. Training
minimizes the mean next-token cross-entropy over all targets (as seed 004's batches pose it);
evaluation scores the copied targets only: their mean cross-entropy, token accuracy, and
sequence accuracy (every copied target of a sequence right).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from uph.attention.model import OneLayerModel, attention_stats
from uph.config import dataclass_fields
from uph.errors import TrainingDivergedError

DTYPES = ("float32", "bfloat16")  # config key copy_task.dtype: float32, or bfloat16 autocast (the score stays float32)
EVAL_STREAM = 1_000_003  # eval sets come from generators seeded seed * EVAL_STREAM + length
PROBE_SIZE = 16  # eval sequences at train_len on which a curve row measures the score magnitude


@dataclass(frozen=True)
class CopyTaskConfig:
    """The `copy_task:` config section as one training job reads it: every key but the attentions and
    seeds its wildcards pick (rules/copy_task.smk). schemas/copy_task.schema.yaml documents each key
    and holds the defaults."""

    vocab: int
    train_len: int
    eval_lens: tuple[int, ...]
    d_model: int
    n_head: int
    steps: int
    batch_size: int
    lr: float
    weight_decay: float
    log_every: int
    eval_size: int
    dtype: str

    @classmethod
    def from_config(cls, section: dict) -> CopyTaskConfig:
        """From the validated section, or the part of it a job's params hold."""
        return cls(**dataclass_fields(cls, section))


def copy_batch(batch_size: int, length: int, vocab: int, generator: torch.Generator):
    """Inputs and next-token targets [batch_size, length - 1] of the copy task (length even)."""
    half = torch.randint(0, vocab, (batch_size, length // 2), generator=generator)
    data = torch.cat((half, half), dim=1)
    return data[:, :-1], data[:, 1:]


def copied_targets(length: int) -> torch.Tensor:
    """[length - 1] bool: which target positions are copies of an earlier token."""
    return torch.arange(length - 1) >= length // 2 - 1


def copy_metrics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Cross-entropy, token and sequence accuracy on the copied targets of [B, L-1] sequences."""
    copied = copied_targets(targets.shape[1] + 1).to(targets.device)
    logits, targets = logits[:, copied].float(), targets[:, copied]
    right = logits.argmax(-1) == targets
    return {
        "loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item(),
        "token_acc": right.float().mean().item(),
        "seq_acc": right.all(dim=1).float().mean().item(),
    }


def eval_lengths(cfg: CopyTaskConfig) -> list[int]:
    return sorted({cfg.train_len, *cfg.eval_lens})


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, autocast: dict
) -> dict[str, float]:
    """copy_metrics over a fixed eval set, in chunks of batch_size sequences."""
    model.eval()
    with torch.autocast(**autocast):
        logits = torch.cat([model(chunk).float() for chunk in inputs.split(batch_size)])
    model.train()
    return copy_metrics(logits, targets)


def train(
    cfg: CopyTaskConfig, attention: str, seed: int, device: torch.device, log: logging.Logger | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train seed 004's one-layer model on the copy task with AdamW.

    Returns the learning curves (one row per logged step: mean training loss since the last row,
    the copy metrics on the fixed eval set at train_len, and uph.attention.model.attention_stats:
    the score magnitude on its first PROBE_SIZE sequences and the attention weights' gradient
    norm of that step's batch, NaN at step 0) and the final evaluation (one row
    per eval length). Model init uses torch.manual_seed(seed), training batches a generator
    seeded with seed, eval sets generators seeded seed * EVAL_STREAM + length. A NaN or inf mean
    training loss at a logged step raises TrainingDivergedError: no table holds a diverged run
    (its accuracies would be argmax-of-NaN noise that a mean over seeds takes in silently).
    """
    log = log or logging.getLogger(__name__)
    torch.manual_seed(seed)
    model = OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    autocast = {"device_type": device.type, "dtype": getattr(torch, cfg.dtype), "enabled": cfg.dtype != "float32"}
    batches = torch.Generator().manual_seed(seed)
    eval_sets = copy_eval_sets(cfg, seed, device)
    L, every, run = cfg.train_len, cfg.log_every, {"attention": attention, "seed": seed}
    rows = [{**run, **curve_row(model, eval_sets[L], cfg.batch_size, autocast, 0, float("nan"))}]
    running, start = [], time.perf_counter()
    for step in range(1, cfg.steps + 1):
        inputs, targets = (t.to(device) for t in copy_batch(cfg.batch_size, L, cfg.vocab, batches))
        running.append(train_step(model, optimizer, inputs, targets, autocast))
        if step % every == 0 or step == cfg.steps:
            train_loss = torch.stack(running).mean().item()
            if not math.isfinite(train_loss):
                raise TrainingDivergedError(
                    f"copy task with {attention} attention, seed {seed}: the training loss is {train_loss} by step "
                    f"{step}; lower config key 'copy_task.lr' ({cfg.lr})"
                )
            rows.append({**run, **curve_row(model, eval_sets[L], cfg.batch_size, autocast, step, train_loss)})
            running = []
            log.info(
                "%s seed %d step %d: train loss %.4f, copy loss %.4f, token acc %.4f",
                attention,
                seed,
                step,
                rows[-1]["train_loss"],
                rows[-1]["loss"],
                rows[-1]["token_acc"],
            )
    log.info("%s seed %d: %d steps in %.1f s", attention, seed, cfg.steps, time.perf_counter() - start)
    return pd.DataFrame(rows), pd.DataFrame(final_rows(model, eval_sets, cfg, autocast, run))


def copy_eval_sets(cfg: CopyTaskConfig, seed: int, device: torch.device) -> dict[int, list[torch.Tensor]]:
    """eval length -> the fixed eval set (inputs, targets) of `eval_size` sequences."""
    return {
        length: [
            t.to(device)
            for t in copy_batch(
                cfg.eval_size, length, cfg.vocab, torch.Generator().manual_seed(seed * EVAL_STREAM + length)
            )
        ]
        for length in eval_lengths(cfg)
    }


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor, autocast
) -> torch.Tensor:
    """One AdamW step on a batch's mean next-token cross-entropy; returns that loss, detached."""
    with torch.autocast(**autocast):
        logits = model(inputs)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def curve_row(model, eval_set: list[torch.Tensor], batch_size: int, autocast: dict, step: int, train_loss: float):
    """A learning curve's row after `step` steps: the copy metrics on the eval set at train_len and the
    attention stats on its first PROBE_SIZE sequences."""
    return {
        "step": step,
        "train_loss": train_loss,
        **evaluate(model, *eval_set, batch_size, autocast),
        **{name: values[0] for name, values in attention_stats(model, eval_set[0][:PROBE_SIZE]).items()},
    }


def final_rows(model, eval_sets: dict, cfg: CopyTaskConfig, autocast: dict, run: dict) -> list[dict]:
    """The final evaluation: one row per eval length."""
    final = []
    for length, eval_set in eval_sets.items():
        metrics = evaluate(model, *eval_set, cfg.batch_size, autocast)
        final.append(
            {
                **run,
                "train_len": cfg.train_len,
                "eval_len": length,
                "final_loss": metrics["loss"],
                "token_acc": metrics["token_acc"],
                "seq_acc": metrics["seq_acc"],
            }
        )
    return final


def gram_resilience() -> pd.DataFrame:
    """Seed 004's resilience table: dot and -det Gram(q, k, r) for a true match and loud mismatches.

    q = e1 and r = e2 span the reference plane. The true match is k = (q + r)/|q + r| (in the
    plane: zero volume). A loud mismatch is k = m e3 + 0.1 q: its dot with q stays 0.1 while its
    volume grows as m². Values are computed in float32 and rounded to the seed's 4 decimals.
    """
    q, r, e3 = torch.eye(4)[:3].unbind()
    rows = [("True Match", 1.0, (q + r) / torch.linalg.norm(q + r))]
    rows += [("Loud Mismatch", m, e3 * m + 0.1 * q) for m in (1.0, 5.0, 10.0, 50.0, 100.0)]
    table = []
    for result, magnitude, k in rows:
        vectors = torch.stack((q, k, r))
        gram = -torch.linalg.det(vectors @ vectors.T)
        table.append(
            {
                "magnitude": magnitude,
                "dot": round(torch.dot(q, k).item(), 4),
                "gram": round(gram.item(), 4),
                "result": result,
            }
        )
    return pd.DataFrame(table)
