"""A tiny real Llama (random weights, saved and loaded back through transformers) for the theta
tests: its final hidden states, lm_head, and text sampled from it with a planted theta*."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from uph.lm.data.models import tiny_config

VOCAB, HIDDEN = 97, 32


def tiny_llama(folder, dtype: torch.dtype = torch.float64):
    """tiny:llama's architecture (uph.lm.data.models.tiny_config) at half its width, its lm_head its own;
    initializer_range 0.15 gives logits of a trained model's spread (std ~1)."""
    config = tiny_config("llama", VOCAB, hidden=HIDDEN, tie_word_embeddings=False, initializer_range=0.15)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder).to(dtype).eval()


@torch.no_grad()
def final_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    """Last hidden state (the lm_head input) of each position, [batch, length, H]."""
    return model.model(ids).last_hidden_state


@torch.no_grad()
def sample_text(model, logits_of, batch: int, length: int, seed: int) -> torch.Tensor:
    """Token ids [batch, length] sampled from softmax(logits_of(h)) of the last hidden state."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    for _ in range(length - 1):
        probs = torch.softmax(logits_of(final_hidden(model, ids)[:, -1]).double(), dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return ids


def user_split(model, ids: torch.Tensor, train_fraction: float = 0.8):
    """(hidden, targets) of the train and test positions: the first rows of sequences train."""
    hidden, targets = final_hidden(model, ids[:, :-1]), ids[:, 1:]
    cut = int(len(ids) * train_fraction)

    def flat(x):
        return x.reshape(-1, *x.shape[2:])

    return (flat(hidden[:cut]), flat(targets[:cut])), (flat(hidden[cut:]), flat(targets[cut:]))
