"""Several runs as one model (uph.attention.runs): each run starts, steps and trains as it would alone."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
from test_attention_study import study

from uph.attention.model import build_model
from uph.attention.runs import RunAdamW, RunLinear
from uph.attention.self_attention import ATTENTIONS
from uph.attention.training import train_runs

TINY = study(vocab=8, items=3, distractors=2, ms=[1, 4], train_ms=[1, 4], pairs=[2, 3], d_model=8, n_head=2)
TINY = dataclasses.replace(
    TINY, train_len=12, max_steps=30, log_every=5, eval_size=8, batch_size=8, probe_size=4, patience=1, min_delta=0.0
)


def test_each_run_starts_where_the_torch_layers_built_under_its_seed_start():
    """Run r of a model built for seeds [3, 5] holds what nn.Embedding, nn.Linear and diff's N(0, 0.1) λ
    draw, in constructor order, after torch.manual_seed(seeds[r])."""
    cfg = dataclasses.replace(TINY, d_model=16)
    model = build_model("seed", "diff", cfg, [3, 5])
    for r, seed in enumerate([3, 5]):
        torch.manual_seed(seed)
        embed = nn.Embedding(cfg.vocab, 16)
        proj, out = nn.Linear(16, 3 * 16, bias=False), nn.Linear(16, 16, bias=False)
        lambdas = 0.1 * torch.randn(4, 4)
        unembed = nn.Linear(16, cfg.vocab, bias=False)
        expected = [embed.weight, proj.weight, out.weight, lambdas, unembed.weight]
        got = [model.embed.weight, model.attention.proj.weight, model.attention.out.weight]
        got += [model.attention.lambdas, model.unembed.weight]
        for want, have in zip(expected, got, strict=True):
            torch.testing.assert_close(have[r], want, rtol=0, atol=0)


def test_adamw_and_clipping_per_run_are_torchs_on_each_run():
    """Two runs of a model of two maps at lrs 0.01 and 0.003, with gradients clipped to norm 0.1, step as
    two torch models of nn.Linear with torch.optim.AdamW and clip_grad_norm_ do, each on its own data, up
    to float32 rounding (the norms sum in another order); a run then left alone steps as before."""
    torch.manual_seed(0)
    stacked_model = nn.Sequential(RunLinear(2, 6, 5), nn.Tanh(), RunLinear(2, 5, 4))
    alone = [nn.Sequential(nn.Linear(6, 5, bias=False), nn.Tanh(), nn.Linear(5, 4, bias=False)) for _ in range(2)]
    for r, model in enumerate(alone):
        for mine, theirs in zip(stacked_model.parameters(), model.parameters()):
            theirs.data.copy_(mine.data[r])
    lrs = [0.01, 0.003]
    optimizer = RunAdamW(stacked_model, lrs, weight_decay=0.1)
    references = [torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1) for model, lr in zip(alone, lrs)]
    for step in range(6):
        if step == 4:  # run 0 leaves the batch; run 1 goes on as the only run
            optimizer.keep_runs(torch.tensor([1]))
            alone, references = alone[1:], references[1:]
        x, y = torch.randn(len(alone), 10, 6), torch.randn(len(alone), 10, 4)
        optimizer.zero_grad()
        (stacked_model(x) - y).square().mean((1, 2)).sum().backward()
        norms = optimizer.clip_grad_norms(0.1)
        optimizer.step()
        for r, (model, reference) in enumerate(zip(alone, references)):
            reference.zero_grad()
            (model(x[r]) - y[r]).square().mean().backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            reference.step()
            assert norms[r].item() == pytest.approx(norm.item(), rel=1e-6)
            assert norm.item() > 0.1  # the clipping was exercised
            for mine, theirs in zip(stacked_model.parameters(), model.parameters()):
                torch.testing.assert_close(mine[r], theirs, rtol=1e-6, atol=1e-7)


def test_a_kept_subset_of_runs_computes_what_those_runs_computed():
    torch.manual_seed(0)
    model = build_model("residual", "triple_capped", TINY, [0, 1, 2])
    optimizer = RunAdamW(model, [0.01] * 3, weight_decay=0.1)
    tokens = torch.randint(0, TINY.vocab, (3, 4, 12))
    with torch.no_grad():
        before = model(tokens)
        optimizer.keep_runs(torch.tensor([0, 2]))
        torch.testing.assert_close(model(tokens[[0, 2]]), before[[0, 2]], rtol=0, atol=0)
    with pytest.raises(ValueError, match="leading run dimension"):
        model(tokens[0])


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_runs_trained_at_once_are_the_runs_trained_one_at_a_time(attention):
    """Three runs (lrs 0.01, 0.003, 0.01; seeds 0, 1, 2) trained as one model and each alone: the same
    curve rows and best weights, up to float32 rounding, over 30 steps (patience 1, so runs stop at
    different steps for some kinds and leave the batch). Some kernels sum in a different order when the
    batch of runs changes their tensors' shapes (a rounding of about 1e-7 of each value per op); 30
    AdamW steps grow it to at most about 1e-5 here, so rows must agree to 1e-4 relative and weights to
    5e-5, far below what a wrong run (its own seed, data, lr, clipping or stop) would give."""
    runs = [(0.01, 0), (0.003, 1), (0.01, 2)]
    together = train_runs(TINY, "loud_copy", "residual", attention, runs, torch.device("cpu"))
    for run, batched in zip(runs, together):
        (alone,) = train_runs(TINY, "loud_copy", "residual", attention, [run], torch.device("cpu"))
        assert batched.progress == alone.progress and batched.diverged == alone.diverged
        assert [row["step"] for row in batched.rows] == [row["step"] for row in alone.rows]
        for got, want in zip(batched.rows, alone.rows):
            assert got.keys() == want.keys()
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), (key, got["step"])
        for name, weight in alone.state.items():
            torch.testing.assert_close(batched.state[name], weight, rtol=0, atol=5e-5)
    assert all(math.isfinite(run.final["val_loss"]) for run in together)
