"""The attention study's models: a small pre-norm residual transformer, and seed 004's one-layer model.

ResidualModel (L blocks, RoPE inside the attention, no positional embedding):

    x_0 = embed(tokens)
    x_l = x_{l-1} + attention(rmsnorm(x_{l-1}), loud);   x_l += mlp(rmsnorm(x_l))   (l = 1..L)
    logits = unembed(rmsnorm(x_L)),   mlp(x) = W_2 gelu(W_1 x), W_1: C -> 4C.

A loud token's factor multiplies its key vectors in every attention layer (CausalSelfAttention), so
the pre-norm cannot erase it. Block l's attention is told its 0-based index l - 1 (diff's λ_init
reads it); the one-layer model's is 0.

Every model holds R independent runs (uph.attention.runs): tokens [R, B, T] -> logits [R, B, T, V], or
tokens [B, T] -> [B, T, V] for one run.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from uph.attention.runs import RunEmbedding, RunLinear, RunRMSNorm, grad_norms, init_runs, runs_of, with_run_dim
from uph.attention.self_attention import CausalSelfAttention
from uph.attention.study_config import AttentionStudyConfig

MODELS = ("seed", "residual")


class OneLayerModel(nn.Module):
    """Seed 004's model: token embedding -> attention -> unembedding; no positional embedding,
    no residual, no norm: position enters only through RoPE. `loud`: see CausalSelfAttention."""

    def __init__(self, vocab: int, d_model: int, n_head: int, attention: str, runs: int = 1):
        super().__init__()
        self.embed = RunEmbedding(runs, vocab, d_model)
        self.attention = CausalSelfAttention(d_model, n_head, attention, runs=runs)
        self.unembed = RunLinear(runs, d_model, vocab)

    def forward(self, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        tokens, loud, one = with_run_dim(tokens, loud, runs_of(self), 2)
        logits = self.unembed(self.attention(self.embed(tokens), loud))
        return logits[0] if one else logits


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, attention: str, layer: int = 0, runs: int = 1):
        super().__init__()
        self.norm_attention, self.norm_mlp = RunRMSNorm(runs, d_model), RunRMSNorm(runs, d_model)
        self.attention = CausalSelfAttention(d_model, n_head, attention, layer, runs)
        self.mlp = nn.Sequential(
            RunLinear(runs, d_model, 4 * d_model), nn.GELU(), RunLinear(runs, 4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.norm_attention(x), loud)
        return x + self.mlp(self.norm_mlp(x))


class ResidualModel(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_head: int, attention: str, n_layer: int, runs: int = 1):
        super().__init__()
        self.embed = RunEmbedding(runs, vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, attention, layer, runs) for layer in range(n_layer))
        self.norm = RunRMSNorm(runs, d_model)
        self.unembed = RunLinear(runs, d_model, vocab)

    def forward(self, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> torch.Tensor:
        tokens, loud, one = with_run_dim(tokens, loud, runs_of(self), 2)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, loud)
        logits = self.unembed(self.norm(x))
        return logits[0] if one else logits


def build_model(model: str, attention: str, cfg: AttentionStudyConfig, seeds: list[int] | None = None) -> nn.Module:
    """`seed` (OneLayerModel) or `residual` (ResidualModel of cfg.n_layer blocks), cfg.vocab tokens, width
    cfg.d_model: one run drawn from the current generator, or one run per seed, run r drawn as the one-run
    model built under torch.manual_seed(seeds[r])."""
    runs = 1 if seeds is None else len(seeds)
    if model == "seed":
        built = OneLayerModel(cfg.vocab, cfg.d_model, cfg.n_head, attention, runs)
    elif model == "residual":
        built = ResidualModel(cfg.vocab, cfg.d_model, cfg.n_head, attention, cfg.n_layer, runs)
    else:
        raise ValueError(f"model {model!r} is not one of {MODELS}")
    if seeds is not None:
        init_runs(built, seeds)
    return built


def attention_layers(model: nn.Module) -> list[CausalSelfAttention]:
    return [module for module in model.modules() if isinstance(module, CausalSelfAttention)]


def attention_grad_norm(model: nn.Module) -> torch.Tensor:
    """[R] each run's L2 norm of the gradients its attention weights now hold (NaN if none)."""
    return grad_norms([p for layer in attention_layers(model) for p in layer.parameters()])


def attention_stats(model: nn.Module, tokens: torch.Tensor, loud: torch.Tensor | None = None) -> dict[str, list[float]]:
    """Per run: score_abs, the mean |score| over causal entries on `tokens` ([R, B, T], or [B, T] for
    one run), mean over attention layers; attention_grad_norm, the L2 norm of the gradients the attention
    weights now hold (NaN if none)."""
    layers = attention_layers(model)
    grad_norm = attention_grad_norm(model)
    for layer in layers:
        layer.measure_scores = True
    with torch.no_grad():
        model(tokens, loud)
    for layer in layers:
        layer.measure_scores = False
    score_abs = sum(layer.score_abs for layer in layers) / len(layers)
    return {"score_abs": score_abs.tolist(), "attention_grad_norm": grad_norm.tolist()}
