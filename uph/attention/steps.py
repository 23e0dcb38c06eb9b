"""The attention study's training step: eager on a CPU, on a GPU one graph launch each.

    train_step = RunAdamW.advance (the host's part: the step count and its scalars)
                 + update (the device's: each run's mean loss, backward, clipping, RunAdamW.apply)

A step of the study's small models is 1,100-1,500 kernels of a few microseconds (docs/performance.md,
"Training branches"): on a GPU it costs its launches (10-17 ms), not its arithmetic. TrainSteps runs
uph.attention.training.train_runs' steps:

- on a CPU, each is train_step, as it always was;
- on a GPU, the device's part of a step (update) is captured once as a CUDA graph, after WARMUP eager steps on a side stream, and each
  later step is two copies from pinned memory (the batch into the graph's static inputs,
  RunAdamW.advance's scalars) and one launch. A replay runs the eager step's kernels on the same
  buffers, so it computes what the eager step computes.

A logging step (its attention gradient norm measured) runs eagerly. Dropping runs (keep_runs: a run
left the batch) moves the optimizer's buffers, so the graph is dropped and the steps after it warm
up and capture anew: a stage captures at most once per run that stops before the others. A capture
that fails (an operation that reads a value on the host) is logged once, and the job goes on eagerly.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from uph.attention.model import attention_grad_norm
from uph.attention.runs import RunAdamW
from uph.attention.tasks import IGNORE, Batch

WARMUP = 2  # eager steps on the capture stream before a capture: cuBLAS and autograd set up lazily

log = logging.getLogger(__name__)


def run_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[R] each run's mean cross-entropy over its scored targets (logits [R, ..., V], targets [R, ...])."""
    nll = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    scored = (targets != IGNORE).flatten(1)
    return nll.view(scored.shape).sum(1) / scored.sum(1)


def update(
    model: torch.nn.Module, optimizer: RunAdamW, batch: Batch, grad_clip: float, measure: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The device's part of a step of every run of `model` on its slice of `batch` [R, B, T]: each run's
    weights get the gradient of its own mean loss, clipped to its own norm `grad_clip`, and AdamW's update
    at the scalars RunAdamW.advance wrote. Reads no value on the host (a GPU captures it). Returns the
    losses [R] and, if `measure`, each run's attention gradient norm before clipping [R]."""
    losses = run_losses(model(batch.inputs, batch.loud), batch.targets)
    optimizer.zero_grad()
    losses.sum().backward()  # run r's loss depends on run r's weights only
    grad_norm = attention_grad_norm(model) if measure else None
    optimizer.clip_grad_norms(grad_clip)
    optimizer.apply()
    return losses.detach(), grad_norm


def train_step(
    model: torch.nn.Module, optimizer: RunAdamW, batch: Batch, lr_factor: float, grad_clip: float, measure: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One AdamW step of every run at the schedule's factor `lr_factor`: advance, then update."""
    optimizer.advance(lr_factor)
    return update(model, optimizer, batch, grad_clip, measure)


def host_batch(batches: list[Batch], pinned: bool) -> Batch:
    """One batch per run -> a Batch of [R, ...] tensors on the host, in pinned memory for a GPU to copy
    without waiting (torch's pinned cache hands a block out again only once its copy has run)."""
    parts = [torch.stack(part) for part in zip(*batches)]
    return Batch(*(part.pin_memory() if pinned else part for part in parts))


def stacked(batches: list[Batch], device: torch.device) -> Batch:
    """One batch per run -> a Batch of [R, ...] tensors on `device` (to a GPU from pinned memory, without
    waiting for the steps queued before it)."""
    return Batch(*(part.to(device, non_blocking=True) for part in host_batch(batches, device.type == "cuda")))


class TrainSteps:
    """train_step(model, optimizer, batch, factor, grad_clip, measure) for every step of a stage, each
    from a list of one Batch per run; on a GPU replayed from a CUDA graph where it can be (module
    docstring), unless `graphs` is False. `captured` and `replayed` count graphs and steps."""

    def __init__(
        self, model: torch.nn.Module, optimizer: RunAdamW, grad_clip: float, device: torch.device, graphs: bool = True
    ):
        self.model, self.optimizer, self.grad_clip, self.device = model, optimizer, grad_clip, device
        self.graphs = graphs and device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.graphs else None
        self.captured = self.replayed = 0
        self._forget()

    def _forget(self) -> None:
        self.graph, self.inputs, self.losses, self.warm = None, None, None, 0

    def keep_runs(self, index: torch.Tensor) -> None:
        """RunAdamW.keep_runs, and the graph of the runs before it dropped."""
        self.optimizer.keep_runs(index)
        self._forget()

    def __call__(
        self, batches: list[Batch], factor: float, measure: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step of every run (train_step's losses [R] and, if `measure`, gradient norms [R])."""
        if not self.graphs or measure:
            return train_step(
                self.model, self.optimizer, stacked(batches, self.device), factor, self.grad_clip, measure
            )
        host = host_batch(batches, pinned=True)
        if self.inputs is None:
            self.inputs = Batch(*(torch.empty_like(part, device=self.device) for part in host))
        for buffer, part in zip(self.inputs, host):
            buffer.copy_(part, non_blocking=True)
        self.optimizer.advance(factor)
        if self.graph is None and self.warm >= WARMUP:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            self.replayed += 1
            return self.losses, None
        if self.graphs:  # a warm-up step, on the stream the capture will use
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                losses, _ = update(self.model, self.optimizer, self.inputs, self.grad_clip)
            current.wait_stream(self.stream)
            self.warm += 1
            return losses, None
        return update(self.model, self.optimizer, self.inputs, self.grad_clip)  # after a failed capture

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                losses, _ = update(self.model, self.optimizer, self.inputs, self.grad_clip)
        except RuntimeError as error:
            log.warning("a training step could not be captured as a CUDA graph (%s); steps run eagerly", error)
            self.graphs = False
            return
        self.graph, self.losses = graph, losses
        self.captured += 1
