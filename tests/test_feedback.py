"""Seed 003's feedback system, the four training methods, and the feedback stage of the workflow."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO

from uph.config import validate
from uph.errors import ConfigError
from uph.feedback.char_lm import CharMLP, char_corpus, evenly_spaced_windows, output_error
from uph.feedback.subspace import (
    FeedbackLayer,
    FeedbackSystem,
    UpdateConfig,
    qr_retraction,
    random_stiefel,
    tangent_projection,
)
from uph.feedback.training import METHODS, Adam, TrainConfig, evaluate, make_method, summarize, train, train_config
from uph.lm.corpus import load_shakespeare_roles


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def principal_cosines(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Cosines of the principal angles between the column spaces of orthonormal A and B."""
    return torch.linalg.svdvals(A.T @ B)


@pytest.mark.parametrize("vocab, rank, r", [(50, 8, 8), (6, 128, 6)])
def test_compressor_is_row_orthonormal_with_rank_clipped_to_the_vocabulary(vocab, rank, r):
    system = FeedbackSystem(vocab, [12, 9], rank, gen())
    assert system.C.shape == (r, vocab) and system.rank == r
    torch.testing.assert_close(system.C @ system.C.T, torch.eye(r), atol=1e-5, rtol=0)
    assert [layer.U.shape for layer in system.layers] == [(12, r), (9, r)]
    e = torch.randn(3, vocab, generator=gen(1))
    c = system.compress_error(e)
    torch.testing.assert_close(c, e @ system.C.T)
    for layer, delta in zip(system.layers, system.compute_deltas(c)):
        torch.testing.assert_close(delta, 0.1 * c @ layer.U.T)


def test_a_rank_above_a_hidden_width_names_the_key():
    with pytest.raises(ConfigError, match=r"'feedback.rank': 10 \(clipped to the vocabulary of 10\) exceeds .* 7"):
        FeedbackSystem(10, [12, 7], 32, gen())


def test_tangent_step_is_skew_against_U_before_clipping():
    U = random_stiefel(20, 5, gen())
    G = 50 * torch.randn(20, 5, generator=gen(1))
    Delta = tangent_projection(U, G)
    assert torch.linalg.norm(Delta) > 1.0  # would be clipped at the seed's max_step_frob
    torch.testing.assert_close(U.T @ Delta + Delta.T @ U, torch.zeros(5, 5), atol=1e-4, rtol=0)


def test_qr_retraction_is_orthonormal_with_a_positive_r_diagonal():
    X = torch.randn(12, 4, generator=gen())
    Q = qr_retraction(X)
    torch.testing.assert_close(Q.T @ Q, torch.eye(4), atol=1e-6, rtol=0)
    assert (torch.diagonal(Q.T @ X) > 0).all()  # R = Q^T X
    torch.testing.assert_close(Q @ (Q.T @ X), X, atol=1e-5, rtol=0)


def test_one_update_matches_the_seed_formulas_step_by_step():
    layer, config = FeedbackLayer(9, 3, gen()), UpdateConfig(eta_B=0.5, tau=0.9, max_step_frob=0.05)
    layer.ema_G = torch.randn(9, 3, generator=gen(2))
    U, alpha, ema = layer.U.clone(), layer.alpha.item(), layer.ema_G.clone()
    g_hat, c = torch.randn(16, 9, generator=gen(3)), torch.randn(16, 3, generator=gen(4))
    diagnostics = layer.update(g_hat, c, config)

    G = g_hat.T @ c / 16
    ema = 0.9 * ema + 0.1 * G
    Delta = ema - U @ ((U.T @ ema + ema.T @ U) / 2)
    norm = torch.linalg.norm(Delta)
    assert norm > 0.05
    Q, R = torch.linalg.qr(U + 0.5 * alpha * Delta * 0.05 / (norm + 1e-8))
    U_new = Q * torch.sign(torch.diagonal(R))
    alpha_star = float((U_new * G).sum() / (c.square().sum(1).mean() + 1e-8))
    alpha_star = min(max(alpha_star, 1e-4), 10.0)
    torch.testing.assert_close(layer.ema_G, ema)
    torch.testing.assert_close(layer.U, U_new)
    assert diagnostics["tangent_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert diagnostics["alpha_star"] == pytest.approx(alpha_star, rel=1e-5)
    assert layer.alpha.item() == pytest.approx(0.99 * alpha + 0.01 * alpha_star, rel=1e-6)
    rho = (G * U_new).sum() / (torch.linalg.norm(G) * 3**0.5 + 1e-8)
    assert diagnostics["rho"] == pytest.approx(rho.item(), rel=1e-5)


def test_frozen_mode_only_accumulates_the_cross_covariance():
    layer = FeedbackLayer(8, 2, gen())
    U, alpha = layer.U.clone(), layer.alpha.clone()
    expected = torch.zeros(8, 2)
    for step in range(5):
        g_hat, c = torch.randn(10, 8, generator=gen(10 + step)), torch.randn(10, 2, generator=gen(20 + step))
        diagnostics = layer.update(g_hat, c, UpdateConfig(eta_B=1.0), frozen=True)
        expected = 0.99 * expected + 0.01 * g_hat.T @ c / 10
    assert torch.equal(layer.U, U) and torch.equal(layer.alpha, alpha)
    torch.testing.assert_close(layer.ema_G, expected)
    assert diagnostics["alpha"] == pytest.approx(0.1)


def test_U_stays_orthonormal_after_1000_updates():
    layer, g = FeedbackLayer(64, 16, gen()), gen(1)
    for _ in range(1000):
        c = torch.randn(8, 16, generator=g)
        layer.update(
            torch.randn(8, 64, generator=g) + c @ torch.randn(16, 64, generator=g),
            c,
            UpdateConfig(eta_B=5.0, alpha_max=100.0),
        )
    assert (layer.U.T @ layer.U - torch.eye(16)).abs().max() < 1e-5


def test_learned_U_and_alpha_recover_a_planted_expander_and_gain():
    d, r, gain, g = 32, 4, 0.7, gen(0)
    U_star = random_stiefel(d, r, g)
    layer = FeedbackLayer(d, r, g)
    assert principal_cosines(layer.U, U_star).min() < 0.5
    for _ in range(600):
        c = torch.randn(64, r, generator=g)
        diagnostics = layer.update(gain * c @ U_star.T, c, UpdateConfig(eta_B=1.0, tau=0.9))
    assert principal_cosines(layer.U, U_star).min() > 0.99
    assert layer.alpha.item() == pytest.approx(gain, rel=0.01)
    assert diagnostics["alpha_star"] == pytest.approx(gain, rel=1e-4)


def test_adam_matches_torch_optim_adam():
    ours = [torch.randn(5, 3, generator=gen()), torch.randn(4, generator=gen(1))]
    theirs = [p.clone() for p in ours]
    adam, reference = Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    for step in range(30):
        grads = [torch.randn(p.shape, generator=gen(100 + step)) for p in ours]
        adam.step(grads)
        for p, grad in zip(theirs, grads):
            p.grad = grad.clone()
        reference.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_each_method_delivers_its_own_deltas():
    vocab, dims, config = 13, [6, 5], TrainConfig(hidden=(6, 5), rank=4)
    e = output_error(torch.randn(7, vocab, generator=gen()), torch.arange(7))
    true = [torch.randn(7, d, generator=gen(d)) for d in dims]
    deltas, _ = make_method("backprop", vocab, config, gen()).deltas(e, true)
    assert deltas is true
    dfa = make_method("dfa", vocab, config, gen())
    deltas, _ = dfa.deltas(e, true)
    for delta, B in zip(deltas, dfa.B):
        torch.testing.assert_close(delta, e @ B.T)
    for method, moves in (("feedback_frozen", False), ("feedback_learned", True)):
        rule = make_method(method, vocab, config, gen())
        before = [layer.U.clone() for layer in rule.system.layers]
        deltas, diagnostics = rule.deltas(e, true)
        c = e @ rule.system.C.T
        for delta, U in zip(deltas, before):  # computed before the update
            torch.testing.assert_close(delta, 0.1 * c @ U.T)
        assert set(diagnostics) == {f"{k}_l{l}" for k in ("alpha", "alpha_star", "rho", "tangent_norm") for l in (1, 2)}
        assert all(not torch.equal(U, layer.U) for U, layer in zip(before, rule.system.layers)) == moves


@pytest.fixture(scope="module")
def hamlet():
    return char_corpus("\n".join(load_shakespeare_roles(["hamlet"])["text"]), 0.1, 8)


def test_training_curves_are_finite_and_share_the_initial_network_and_batches(hamlet):
    config = TrainConfig(
        context=8,
        hidden=(32, 32),
        steps=40,
        batch_size=32,
        lr=3e-3,
        log_every=20,
        eval_windows=256,
        rank=8,
        update=UpdateConfig(eta_B=1.0),
    )
    curves = {method: train(hamlet, method, 3, config) for method in METHODS}
    initial = CharMLP(len(hamlet.vocab), 8, [32, 32], gen(3))
    initial_loss, _ = evaluate(initial, *evenly_spaced_windows(hamlet.test, 8, 256))
    for method, run in curves.items():
        assert run["step"].tolist() == [20, 40] and (run["method"] == method).all()
        numeric = run.drop(columns=["method"])
        assert np.isfinite(numeric.to_numpy(dtype=float)).all(), method
        assert run["test_loss"].iloc[-1] < initial_loss - 0.2, method
    assert curves["backprop"][["alignment_l1", "alignment_l2"]].to_numpy() == pytest.approx(1.0)
    assert "alpha_l1" in curves["feedback_learned"] and "alpha_l1" not in curves["dfa"]
    assert curves["feedback_frozen"]["alpha_l2"].to_numpy() == pytest.approx(0.1)
    # same seed: same network and batches, so the first step's training loss is shared
    first = [
        train(hamlet, method, 3, TrainConfig(context=8, hidden=(32, 32), steps=1, log_every=1, eval_windows=8, rank=8))[
            "train_loss"
        ].item()
        for method in METHODS
    ]
    assert first == pytest.approx([first[0]] * 4)


def test_summarize_takes_the_last_row_and_averages_alignment_over_layers_and_run():
    curves = pd.DataFrame(
        {
            "method": ["dfa"] * 2 + ["backprop"] * 2,
            "seed": [1, 1, 0, 0],
            "step": [10, 20, 10, 20],
            "seconds": [1.0, 2.0, 1.0, 2.0],
            "train_loss": [3.0, 2.5, 3.0, 2.0],
            "test_loss": [3.1, 2.6, 3.0, 2.1],
            "test_acc": [0.1, 0.2, 0.1, 0.3],
            "alignment_l1": [0.1, 0.3, 1.0, 1.0],
            "alignment_l2": [0.2, 0.6, 1.0, 1.0],
        }
    )
    table = summarize(curves)
    assert table["method"].tolist() == ["backprop", "dfa"]
    dfa = table.iloc[1]
    assert (dfa["final_loss"], dfa["final_acc"], dfa["steps"]) == (2.6, 0.2, 20)
    assert dfa["mean_alignment"] == pytest.approx(0.3) and dfa["final_alignment"] == pytest.approx(0.45)


def test_config_errors_name_the_key():
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["feedback"]["update"] = {"alpha_min": 2.0, "alpha_max": 1.0}
    with pytest.raises(ConfigError, match=r"'feedback.update.alpha_min': 2.0 is above feedback.update.alpha_max=1.0"):
        train_config(validate(config)["feedback"])
    config["feedback"]["methods"] = ["backprop", "sgd"]
    with pytest.raises(ConfigError, match=r"config key 'feedback.methods\[1\]'"):
        validate(config)


def test_feedback_stage_runs_through_snakemake(tmp_path):
    results = tmp_path / "results"
    command = [
        str(REPO / ".venv" / "bin" / "snakemake"),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        "--config",
        f"results={results}",
        "--cores",
        "2",
        str(results / "tables" / "feedback.csv"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_csv(results / "tables" / "feedback.csv")
    assert list(table.columns[:5]) == ["method", "seed", "final_loss", "final_acc", "mean_alignment"]
    assert table["method"].tolist() == list(METHODS) and (table["seed"] == 0).all()
    assert (results / "tables" / "feedback.md").exists() and (results / "tables" / "feedback.tex").exists()
    curves = pd.read_parquet(results / "feedback" / "method~feedback_learned" / "seed~0" / "curves.parquet")
    assert curves["step"].tolist() == [10, 20, 30]
    assert (results / "benchmarks" / "feedback_train-method~dfa-seed~0.tsv").exists()
