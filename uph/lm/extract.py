"""Extraction: run the frozen body once over every user's tokens and cache the final hidden states.

Each split region of a user's stream (train [0, train_end), test [test_start, n)) is cut into
windows of `context` inputs; window s feeds tokens[s : s+context] and predicts tokens[s+1 :
s+context+1], both clipped to the region, so every region token but the first is a target exactly
once and no window crosses the train/test gap. Only the body runs (no V×H lm_head product, no
per-layer hidden states kept); batches are right-padded, which a causal model never attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from uph.lm.models import final_hidden


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
    """Final hidden states [len(inputs), H] for each window (in the given order), on the CPU."""
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


def extract_users(model, users, context: int, batch_size: int, device: torch.device, write) -> int:
    """Cache every user of the `users` table (user_id, tokens, train_end, test_start) with `write`.

    Returns the number of cached tokens. Users are processed one at a time (bounded memory).
    """
    per_user = []
    for row in users.itertuples():
        tokens = np.array(row.tokens, dtype=np.int64)
        per_user.append(
            (row.user_id, tokens, user_windows(row.user_id, tokens, row.train_end, row.test_start, context))
        )
    total = sum(len(w.inputs) for _, _, windows in per_user for w in windows)
    with tqdm(total=total, unit="tok", desc="extract", mininterval=5, smoothing=0.1) as progress:
        for user_id, tokens, windows in per_user:
            states = hidden_states(model, windows, batch_size, device, progress)
            for split in ("train", "test"):
                mine = [i for i, w in enumerate(windows) if w.split == split]
                positions, targets = zip(*(targets_of(windows[i], tokens) for i in mine))
                write(
                    user_id,
                    split,
                    np.concatenate(positions),
                    np.concatenate(targets),
                    torch.cat([states[i] for i in mine]),
                )
    return total
