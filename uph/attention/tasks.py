"""Tasks of the attention study that need content, not position: every batch is `Batch(inputs,
targets, loud, level)`, inputs and targets [B, T] (target -100: not scored), loud [B, T] (each
position's loudness factor, 1 for an ordinary token) and level [B] (the task's swept quantity).

Token 0 is the filler; content tokens are 1..vocab-1, drawn without replacement within a sequence.

offset_copy    n items, then the same items again, in a sequence of T + 1 tokens whose other
               T + 1 - 2n tokens are filler cut at two uniform points into a prefix, a gap
               between the copies and a suffix: the copy offset n + gap changes from sequence to
               sequence, so only content (an induction mechanism) finds it. The model reads tokens
               0..T-1; scored are the next tokens inside the second copy after its first item
               (its first item cannot be known: the gap is random). level = 1.
loud_copy      offset_copy in which `distractors` filler positions before the second copy (in the
               prefix or the gap, so every scored query sees every distractor) hold distractors:
               content tokens that are none of the items (never a true match), each with loudness m
               (its key vectors scaled by m, see CausalSelfAttention), the sequence's level: drawn
               from `train_ms` in training and validation, one of `ms` for each test set. The gap is
               drawn as offset_copy's, then widened by the distractors' count (the suffix shrinks).
mqar           multi-query associative recall (as in the Zoology benchmark): N key-value pairs
               k_1 v_1 .. k_N v_N (keys distinct, from the lower half of the content tokens, values
               uniform from the upper half), then T - 2N positions of filler holding the N keys
               again at random distinct places, each a query scored on its value. level = N, drawn
               from `pairs` (or fixed for an eval set); 3N <= T.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from uph.attention.study_config import AttentionStudyConfig

TASKS = ("offset_copy", "loud_copy", "mqar")
IGNORE = -100  # target of a position that is not scored (F.cross_entropy's ignore_index)


class Batch(NamedTuple):
    inputs: torch.Tensor  # [B, T] token ids
    targets: torch.Tensor  # [B, T] token ids, IGNORE where not scored
    loud: torch.Tensor  # [B, T] loudness factor of each input token
    level: torch.Tensor  # [B] the swept quantity: pairs (mqar), m (loud_copy), 1 (offset_copy)


def levels(task: str, cfg: AttentionStudyConfig) -> tuple:
    """The values of the swept quantity of `task` (the test sets' levels)."""
    return {"offset_copy": (1,), "loud_copy": cfg.ms, "mqar": cfg.pairs}[task]


def training_levels(task: str, cfg: AttentionStudyConfig) -> tuple:
    """The levels training and validation sequences draw from."""
    return cfg.train_ms if task == "loud_copy" else levels(task, cfg)


def _draw(choices: tuple, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.tensor(choices, dtype=torch.float32)[
        torch.randint(0, len(choices), (batch_size,), generator=generator)
    ]


def _content(batch_size: int, count: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[B, count] distinct content tokens per row, a uniform random ordered choice from 1..vocab-1."""
    return torch.rand(batch_size, vocab - 1, generator=generator).argsort(-1)[:, :count] + 1


def copy_batch(
    batch_size: int,
    length: int,
    vocab: int,
    generator: torch.Generator,
    n: int,
    n_distractors: int = 0,
    loudness: torch.Tensor | None = None,
) -> Batch:
    """offset_copy of n items (n_distractors = 0) or loud_copy, whose distractors have loudness
    `loudness` [B] (the level); see the module docstring."""
    S = length + 1
    fillers = S - 2 * n
    if n < 2 or n + n_distractors > vocab - 1 or n_distractors > fillers:
        raise ValueError(
            f"a copy of {n} items and {n_distractors} distractors needs n >= 2, vocab > n + distractors "
            f"(vocab is {vocab}) and length >= 2n - 1 + distractors (length is {length})"
        )
    content = _content(batch_size, n + n_distractors, vocab, generator)
    items, distractors = content[:, :n], content[:, n:]
    cuts = torch.randint(0, fillers - n_distractors + 1, (batch_size, 2), generator=generator).sort(-1).values
    first, second = cuts[:, :1], cuts[:, 1:] + n + n_distractors  # where each copy starts
    pos = torch.arange(S)
    in_first, in_second = (pos >= first) & (pos < first + n), (pos >= second) & (pos < second + n)
    index = torch.where(in_first, pos - first, pos - second).clamp(0, n - 1)
    tokens = torch.where(in_first | in_second, items.gather(1, index), 0)
    loud = torch.ones(batch_size, S)
    if n_distractors:
        before = pos < second  # fillers a scored query sees: at least n_distractors of them
        priority = torch.rand(batch_size, S, generator=generator).masked_fill_(in_first | ~before, -1)
        spots = priority.topk(n_distractors, dim=1).indices
        tokens.scatter_(1, spots, distractors)
        loud.scatter_(1, spots, loudness[:, None].expand(-1, n_distractors).float())
    scored = (pos[1:] > second) & (pos[1:] < second + n)
    targets = tokens[:, 1:].masked_fill(~scored, IGNORE)
    level = loudness if loudness is not None else torch.ones(batch_size)
    return Batch(tokens[:, :-1], targets, loud[:, :-1], level.float())


def mqar_batch(batch_size: int, length: int, vocab: int, generator: torch.Generator, pairs: torch.Tensor) -> Batch:
    """Multi-query associative recall with pairs[b] key-value pairs in row b; see the module docstring."""
    n_keys = (vocab - 1) // 2
    most = int(pairs.max())
    if 3 * most > length or most > n_keys:
        raise ValueError(f"mqar with {most} pairs needs length >= {3 * most} and vocab >= {2 * most + 1}")
    keys = _content(batch_size, most, n_keys + 1, generator)  # 1..n_keys
    values = torch.randint(n_keys + 1, vocab, (batch_size, most), generator=generator)
    pairs = pairs.long()[:, None]
    pos = torch.arange(length)
    in_context = pos < 2 * pairs
    index = (pos // 2).clamp(max=most - 1).expand(batch_size, -1)
    tokens = torch.where(in_context, torch.where(pos % 2 == 0, keys.gather(1, index), values.gather(1, index)), 0)
    priority = torch.rand(batch_size, length, generator=generator).masked_fill_(in_context, -1)
    spots = priority.topk(most, dim=1).indices  # query j of row b at spots[b, j] (j < pairs[b])
    asked = torch.arange(most) < pairs
    tokens.scatter_(1, spots, torch.where(asked, keys, tokens.gather(1, spots)))
    targets = torch.full((batch_size, length), IGNORE).scatter_(1, spots, torch.where(asked, values, IGNORE))
    return Batch(tokens, targets, torch.ones(batch_size, length), pairs[:, 0].float())


def make_batch(
    task: str, cfg: AttentionStudyConfig, batch_size: int, length: int, generator: torch.Generator, level=None
) -> Batch:
    """A batch of `task` at `length`; each row's level is `level`, or drawn uniformly from training_levels."""
    drawn = (
        torch.full((batch_size,), float(level))
        if level is not None
        else _draw(training_levels(task, cfg), batch_size, generator)
    )
    if task == "offset_copy":
        return copy_batch(batch_size, length, cfg.vocab, generator, cfg.items)
    if task == "loud_copy":
        return copy_batch(batch_size, length, cfg.vocab, generator, cfg.items, cfg.distractors, drawn)
    if task == "mqar":
        return mqar_batch(batch_size, length, cfg.vocab, generator, drawn)
    raise ValueError(f"task {task!r} is not one of {TASKS}")
