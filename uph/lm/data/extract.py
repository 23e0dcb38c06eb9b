"""Extraction: run the frozen body once over every user's tokens and cache the final hidden states.

Each split region of a user's stream (train [0, train_end), test [test_start, n)) is cut into
windows of `context` inputs; window s feeds tokens[s : s+context] and predicts tokens[s+1 :
s+context+1], both clipped to the region, so every region token but the first is a target exactly
once and no window crosses the train/test gap. Only the body runs (no V×H lm_head product, no
per-layer hidden states kept); batches are right-padded, which a causal model never attends to.

Batches. Every window is `context` long but the last of each region (at most two shorter windows a
user), so windows are sorted longest first before they are cut into batches: only the batch where the
full windows run out mixes lengths, its short windows padded to its longest. At the default config (a
user's 2,048 tokens are 16 windows of 128, 14 of them full, one batch) that pads 6 % of the positions
computed (benchmarks/bench_extract.py); avoiding it would take a second, smaller forward pass.
`extract.batch_size` windows go through the model at once; null sizes it by device (uph.config.batch_windows,
resolved at DAG build):
CPU_BATCH on a CPU (the size the CPU caches have always been built with, so their bytes stay as they
were), GPU_BATCH_TOKENS of windows on CUDA. On a CPU each user is batched alone, as before (float32
states depend on the batch they were computed in, by rounding, so the CPU's batches are kept as they
were); on CUDA consecutive users are gathered until they fill a batch (16 windows a user at the
default, hundreds a GPU batch), their windows batched together and each user written once its group
is done, so memory holds the states of about a batch and a user.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from uph.config import batch_windows
from uph.lm.data.models import final_hidden


@dataclass(frozen=True)
class Window:
    user_id: str
    split: str
    inputs: np.ndarray  # token ids fed to the model
    first: int  # stream index of the first target (inputs[0] predicts tokens[first])


def user_windows(user_id: str, tokens: np.ndarray, train_end: int, test_start: int, context: int) -> list[Window]:
    windows = []
    for split, lo, hi in (("train", 0, train_end), ("test", test_start, len(tokens))):
        for s in range(lo, hi - 1, context):
            windows.append(Window(user_id, split, tokens[s : min(s + context, hi - 1)], s + 1))
    return windows


def targets_of(window: Window, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positions = np.arange(window.first, window.first + len(window.inputs))
    return positions, tokens[positions]


@torch.inference_mode()
def hidden_states(
    model, windows: list[Window], batch_size: int, device: torch.device, progress: tqdm | None = None
) -> list[torch.Tensor]:
    """Final hidden states [len(inputs), H] for each window (in the given order), on the CPU; the
    windows go through the model longest first (a stable sort), `batch_size` at a time."""
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i].inputs))
    out: list[torch.Tensor | None] = [None] * len(windows)
    for b in range(0, len(order), batch_size):
        batch = order[b : b + batch_size]
        longest = len(windows[batch[0]].inputs)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(windows[i].inputs)] = torch.from_numpy(windows[i].inputs)
        h = final_hidden(model, ids.to(device)).cpu()
        for row, i in enumerate(batch):
            out[i] = h[row, : len(windows[i].inputs)]
        if progress is not None:
            progress.update(sum(len(windows[i].inputs) for i in batch))
    return out


def user_groups(counts: list[int], batch_size: int, across_users: bool) -> Iterator[range]:
    """The users (indices into `counts`, each user's number of windows) whose windows are batched
    together: one at a time, or `across_users` consecutive users until they hold a batch or more."""
    start, held = 0, 0
    for i, n in enumerate(counts):
        held += n
        if not across_users or held >= batch_size:
            yield range(start, i + 1)
            start, held = i + 1, 0
    if start < len(counts):
        yield range(start, len(counts))


def extract_users(
    model, users, context: int, batch_size: int | None, device: torch.device, write, across_users: bool | None = None
) -> int:
    """Cache every user of the `users` table (user_id, tokens, train_end, test_start) with `write`,
    user by user in table order, train before test.

    `batch_size`: windows per forward pass (None: `batch_windows` by device). `across_users`: batch
    the windows of consecutive users together (`user_groups`); None: on CUDA only. Returns the number
    of cached tokens.
    """
    batch_size = batch_windows(batch_size, context, device)
    if across_users is None:
        across_users = torch.device(device).type == "cuda"
    per_user = []
    for row in users.itertuples():
        tokens = np.array(row.tokens, dtype=np.int64)
        per_user.append(
            (row.user_id, tokens, user_windows(row.user_id, tokens, row.train_end, row.test_start, context))
        )
    total = sum(len(w.inputs) for _, _, windows in per_user for w in windows)
    with tqdm(total=total, unit="tok", desc="extract", mininterval=5, smoothing=0.1) as progress:
        for group in user_groups([len(windows) for _, _, windows in per_user], batch_size, across_users):
            states = iter(
                hidden_states(model, [w for u in group for w in per_user[u][2]], batch_size, device, progress)
            )
            for u in group:
                user_id, tokens, windows = per_user[u]
                mine = [next(states) for _ in windows]
                for split in ("train", "test"):
                    ids = [i for i, w in enumerate(windows) if w.split == split]
                    positions, targets = zip(*(targets_of(windows[i], tokens) for i in ids))
                    write(
                        user_id,
                        split,
                        np.concatenate(positions),
                        np.concatenate(targets),
                        torch.cat([mine[i] for i in ids]),
                    )
    return total
