"""The attention study's configuration: the section a training job reads, its evaluation lengths and
its learning-rate schedules."""

from __future__ import annotations

import math
from dataclasses import dataclass

from uph.config import dataclass_fields

SOLVED = 0.99  # token accuracy from which a run counts as having solved its task (validation or test)
TIE = 1 - SOLVED  # an lr this far behind the best validation accuracy (best_lr) is worse: the study's finest decision
# per run, in its rows; `stopped` says why it stopped: STOPS
PROGRESS = ["steps_run", "best_step", "steps_to_90", "steps_to_99", "at_step_limit", "stopped"]
STOPS = ("solved", "patience", "step_limit", "diverged")  # solved_accuracy's stop, patience's, the step limit, a NaN


@dataclass(frozen=True)
class AttentionStudyConfig:
    """The `attention:` config section as one training job reads it: every key but the models and
    attentions its wildcards pick (rules/attention.smk). schemas/attention.schema.yaml documents each
    key and holds the defaults."""

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    sweep_seeds: int
    seeds_if_split: int | None
    split_kinds: tuple[str, ...]
    lrs: tuple[float, ...]
    lr_extensions: int
    lr_step: float
    schedule: str
    warmup: float
    weight_decay: float
    vocab: int
    train_len: int
    eval_factors: tuple[int, ...]
    items: int
    distractors: int
    ms: tuple[float, ...]
    train_ms: tuple[float, ...]
    pairs: tuple[int, ...]
    d_model: int
    n_head: int
    n_layer: int
    max_steps: int
    max_steps_extended: int | None
    patience: int
    min_delta: float
    solved_accuracy: float | None
    solved_evaluations: int
    grad_clip: float
    batch_size: int
    log_every: int
    eval_size: int
    probe_size: int

    @classmethod
    def from_config(cls, section: dict) -> AttentionStudyConfig:
        """From the validated section, or the part of it a job's params hold (lists become tuples)."""
        return cls(**dataclass_fields(cls, section))


def step_limit(cfg: AttentionStudyConfig) -> int:
    """The most steps a run takes: max_steps_extended for a run still improving at max_steps, if set."""
    return max(cfg.max_steps, cfg.max_steps_extended or cfg.max_steps)


def eval_lengths(cfg: AttentionStudyConfig) -> list[int]:
    return [cfg.train_len * factor for factor in [1, *cfg.eval_factors]]


SCHEDULES = {  # config key attention.schedule: lr multiplier after warmup, at fraction x of the remaining steps
    "cosine": lambda x: 0.5 * (1 + math.cos(math.pi * x)),
    "constant": lambda x: 1.0,
}


def schedule(cfg: AttentionStudyConfig):
    """lr multiplier of step s (0-based): warmup from 1/W to 1 over W steps, then SCHEDULES[schedule] to
    max_steps, and its last value beyond (a run extended past max_steps: step_limit)."""
    steps, warmup, decay = cfg.max_steps, max(1, round(cfg.warmup * cfg.max_steps)), SCHEDULES[cfg.schedule]

    def factor(step: int) -> float:
        return (step + 1) / warmup if step < warmup else decay(min(1.0, (step - warmup) / max(1, steps - warmup)))

    return factor
