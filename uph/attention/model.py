"""The attention study's models: a small pre-norm residual transformer, and seed 004's one-layer model.

ResidualModel (L blocks, RoPE inside the attention, no positional embedding):

    x_0 = embed(tokens)
    x_l = x_{l-1} + attention(rmsnorm(x_{l-1}), loud);   x_l += mlp(rmsnorm(x_l))   (l = 1..L)
    logits = unembed(rmsnorm(x_L)),   mlp(x) = W_2 gelu(W_1 x), W_1: C -> 4C.

A loud token's factor multiplies its key vectors in every attention layer (CausalSelfAttention), so
the pre-norm cannot erase it. Block l's attention is told its 0-based index l - 1 (diff's λ_init
reads it); the one-layer model's is 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from uph.attention.self_attention import CausalSelfAttention
from uph.attention.study_config import AttentionStudyConfig

MODELS = ("seed", "residual")


class OneLayerModel(nn.Module):
    """Seed 004's model: token embedding -> attention -> unembedding; no positional embedding,
    no residual, no norm: position enters only through RoPE. `loud`: see CausalSelfAttention."""

    def __init__(self, vocab: int, d_model: int, n_head: int, attention: str):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.attention = CausalSelfAttention(d_model, n_head, attention)
        self.unembed = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        return self.unembed(self.attention(self.embed(tokens), loud))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, attention: str, layer: int = 0):
        super().__init__()
        self.norm_attention, self.norm_mlp = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.attention = CausalSelfAttention(d_model, n_head, attention, layer)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(), nn.Linear(4 * d_model, d_model, bias=False)
        )

    def forward(self, x: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.norm_attention(x), loud)
        return x + self.mlp(self.norm_mlp(x))


class ResidualModel(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_head: int, attention: str, n_layer: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, attention, layer) for layer in range(n_layer))
        self.norm = nn.RMSNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, loud)
        return self.unembed(self.norm(x))


def build_model(model: str, attention: str, cfg: AttentionStudyConfig) -> nn.Module:
    """`seed` (OneLayerModel) or `residual` (ResidualModel of cfg.n_layer blocks), cfg.vocab tokens, width
    cfg.d_model."""
    if model == "seed":
        return OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention)
    if model == "residual":
        return ResidualModel(cfg.vocab, cfg.d_model, cfg.n_head, attention, cfg.n_layer)
    raise ValueError(f"model {model!r} is not one of {MODELS}")


def attention_layers(model: nn.Module) -> list[CausalSelfAttention]:
    return [module for module in model.modules() if isinstance(module, CausalSelfAttention)]


def attention_grad_norm(model: nn.Module) -> float:
    """The L2 norm of the gradients the attention weights now hold (NaN if none)."""
    grads = [p.grad for layer in attention_layers(model) for p in layer.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item() if grads else math.nan


def attention_stats(model: nn.Module, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> dict[str, float]:
    """score_abs: the mean |score| over causal entries on `tokens`, mean over attention layers;
    attention_grad_norm: the L2 norm of the gradients the attention weights now hold (NaN if none)."""
    layers = attention_layers(model)
    grad_norm = attention_grad_norm(model)
    for layer in layers:
        layer.measure_scores = True
    with torch.no_grad():
        model(tokens, loud)
    for layer in layers:
        layer.measure_scores = False
    return {"score_abs": sum(layer.score_abs for layer in layers) / len(layers), "attention_grad_norm": grad_norm}
