"""Seed 003's feedback system, the five training methods, node perturbation, and the feedback stage of the workflow."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, snakemake

from uph.config import validate
from uph.errors import ConfigError
from uph.feedback.char_lm import CharMLP, char_corpus, evenly_spaced_windows, output_error
from uph.feedback.comparison import paired_difference, summarize
from uph.feedback.node_perturbation import node_perturbation
from uph.feedback.subspace import (
    FeedbackLayer,
    FeedbackSystem,
    UpdateConfig,
    qr_retraction,
    random_stiefel,
    tangent_projection,
)
from uph.feedback.training import (
    METHODS,
    Batch,
    TrainConfig,
    evaluate,
    learn,
    make_method,
    train,
    train_seeds,
)
from uph.lm.data.corpus import load_shakespeare_roles
from uph.optim import Adam

SCHEMA_FEEDBACK = validate({**yaml.safe_load((REPO / "config" / "test.yaml").read_text()), "feedback": {}})[
    "feedback"
]  # the schema's defaults


def update_config(**changes) -> UpdateConfig:
    """The schema's default update settings with `changes`."""
    return UpdateConfig(**{**SCHEMA_FEEDBACK["update"], **changes})


def settings(**changes):
    """A TrainConfig: the schema's defaults with `changes`."""
    return dataclasses.replace(TrainConfig.from_config(SCHEMA_FEEDBACK), **changes)


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
    layer, config = FeedbackLayer(9, 3, gen()), update_config(eta_B=0.5, tau=0.9, max_step_frob=0.05)
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


def test_the_update_defaults_live_in_the_schema_with_the_seeds_eta_B_documented():
    schema = yaml.safe_load((REPO / "schemas" / "feedback.schema.yaml").read_text())
    eta_B = schema["properties"]["update"]["properties"]["eta_B"]
    assert eta_B["default"] == 1.0 and "3e-5" in eta_B["description"]
    assert SCHEMA_FEEDBACK["update"]["eta_B"] == 1.0
    with pytest.raises(TypeError):
        UpdateConfig()  # no second set of defaults in Python


def test_U_stays_orthonormal_after_1000_updates():
    layer, g = FeedbackLayer(64, 16, gen()), gen(1)
    for _ in range(1000):
        c = torch.randn(8, 16, generator=g)
        layer.update(
            torch.randn(8, 64, generator=g) + c @ torch.randn(16, 64, generator=g),
            c,
            update_config(eta_B=5.0, alpha_max=100.0),
        )
    assert (layer.U.T @ layer.U - torch.eye(16)).abs().max() < 1e-5


def test_learned_U_and_alpha_recover_a_planted_expander_and_gain():
    d, r, gain, g = 32, 4, 0.7, gen(0)
    U_star = random_stiefel(d, r, g)
    layer = FeedbackLayer(d, r, g)
    assert principal_cosines(layer.U, U_star).min() < 0.5
    for _ in range(600):
        c = torch.randn(64, r, generator=g)
        diagnostics = layer.update(gain * c @ U_star.T, c, update_config(eta_B=1.0, tau=0.9))
    assert principal_cosines(layer.U, U_star).min() > 0.99
    assert layer.alpha.item() == pytest.approx(gain, rel=0.01)
    assert diagnostics["alpha_star"] == pytest.approx(gain, rel=1e-4)


# --- node perturbation ----------------------------------------------------------------------------


def test_node_perturbation_is_unbiased_on_a_planted_quadratic():
    """L(h_1, h_2) = 1/2 h^T H h + <b, h> over both layers' outputs stacked (H couples the layers), so
    the gradient at h is H h + b. Each of the M = 200,000 rows is one independent draw at the same h,
    with a large sigma = 0.5 (unbiased for any sigma on a quadratic). Var of a row's estimate per
    coordinate is |g|^2 + g_i^2 + O(sigma^2), so the mean's standard error is about |g| / sqrt(M);
    tolerance: 5 standard errors, 5 |g| / sqrt(M) (about 0.011 |g|), per coordinate."""
    dims, draws, g = [5, 3], 200_000, gen(7)
    A = torch.randn(8, 8, generator=g, dtype=torch.float64)
    H, b, h = A @ A.T / 8, torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    true = H @ h + b

    def losses(noise):
        perturbed = h + torch.cat(noise, dim=1)  # (M, 8)
        return 0.5 * ((perturbed @ H) * perturbed).sum(1) + perturbed @ b

    clean = losses([torch.zeros(draws, d, dtype=torch.float64) for d in dims])
    noise = gen(8)
    estimate = node_perturbation(losses, clean, [(draws, d) for d in dims], 0.5, noise)
    estimate = [e.double() for e in estimate]
    mean = torch.cat([e.mean(0) for e in estimate])
    tolerance = 5 * torch.linalg.norm(true) / draws**0.5
    assert (mean - true).abs().max() < tolerance
    # one draw alone is far off: the average is what recovers the gradient
    single = torch.cat([e[0] for e in estimate])
    assert (single - true).abs().max() > 10 * tolerance
    # without the 1 / sigma the mean would be sigma times the gradient: the test can tell
    assert ((0.5 * mean) - true).abs().max() > 10 * tolerance


def test_node_perturbation_on_the_network_averages_to_backprops_deltas():
    """One example repeated 40,000 times through the character MLP: the mean estimate at each hidden
    output is the backprop delta within 5 standard errors (|g| / sqrt(M) per coordinate), sigma = 1e-3."""
    model = CharMLP(7, 3, [6, 4], gen(0))
    model.params = [p.double() for p in model.params]
    x, y = torch.tensor([[1, 5, 2]]).repeat(40_000, 1), torch.tensor([3]).repeat(40_000)
    hs, z = model.forward(x)
    true = model.backprop_deltas(hs, output_error(z, y))
    estimate = node_perturbation(
        lambda noise: F.cross_entropy(model.forward(x, noise)[1], y, reduction="none"),
        F.cross_entropy(z, y, reduction="none"),
        [h.shape for h in hs],
        1e-3,
        gen(1),
    )
    g_norm = torch.cat([t[0] for t in true]).norm()
    for e, t in zip(estimate, true):
        assert (e.double().mean(0) - t[0]).abs().max() < 5 * g_norm / 40_000**0.5


# --- the five methods -----------------------------------------------------------------------------


def tiny_batch(model: CharMLP, vocab: int, context: int, n: int = 7) -> Batch:
    g = gen(11)
    x, y = torch.randint(vocab, (n, context), generator=g), torch.randint(vocab, (n,), generator=g)
    hs, z = model.forward(x)
    return Batch(x, y, hs, z, output_error(z, y))


def test_each_method_delivers_its_own_deltas_and_feedback_update():
    vocab, context, config = 13, 4, settings(hidden=(6, 5), rank=4, sigma=0.01)
    model = CharMLP(vocab, context, [6, 5], gen(0))
    batch = tiny_batch(model, vocab, context)
    true = model.backprop_deltas(batch.hs, batch.e)
    deltas, _ = make_method("backprop", vocab, config, gen()).step(model, batch)
    for delta, g in zip(deltas, true):
        torch.testing.assert_close(delta, g)
    dfa = make_method("dfa", vocab, config, gen())
    deltas, _ = dfa.step(model, batch)
    for delta, B in zip(deltas, dfa.B):
        torch.testing.assert_close(delta, batch.e @ B.T)
    for method, signal in (
        ("feedback_frozen", None),
        ("feedback_learned", "noise"),
        ("feedback_learned_oracle", "true"),
    ):
        rule = make_method(method, vocab, config, gen(5))
        reference = FeedbackSystem(vocab, [6, 5], 4, gen(5))  # the same draws: C, then each U
        deltas, diagnostics = rule.step(model, batch)
        c = batch.e @ reference.C.T
        for delta, layer in zip(deltas, reference.layers):  # computed before the update
            torch.testing.assert_close(delta, 0.1 * c @ layer.U.T)
        if signal is None:
            assert set(diagnostics) == {"alpha_l1", "alpha_l2"}
            assert all(torch.equal(a.U, b.U) for a, b in zip(rule.system.layers, reference.layers))
            continue
        if signal == "true":
            g_hat = true
        else:  # the rule's generator has drawn C and the U's; its next draws are the noise
            noise = gen(5)
            FeedbackSystem(vocab, [6, 5], 4, noise)
            g_hat = node_perturbation(
                lambda n: F.cross_entropy(model.forward(batch.x, n)[1], batch.y, reduction="none"),
                F.cross_entropy(batch.z, batch.y, reduction="none"),
                [h.shape for h in batch.hs],
                0.01,
                noise,
            )
        reference.update_all(g_hat, c, config.update)
        for layer, expected in zip(rule.system.layers, reference.layers):
            torch.testing.assert_close(layer.U, expected.U)
            torch.testing.assert_close(layer.alpha, expected.alpha)
        assert set(diagnostics) == {f"{k}_l{l}" for k in ("alpha", "alpha_star", "rho", "tangent_norm") for l in (1, 2)}


def test_E_read_and_written_by_its_rows_is_the_pair_indexed_form_bit_for_bit():
    """The first layer reads E's rows t * V + x_t (index_select) and writes its gradient there (index_add_):
    the same bits as indexing E by the pairs (t, x_t) and accumulating with index_put_, with every pair hit by
    many windows (the order of the sums matters)."""
    vocab, context, n = 7, 5, 64
    model = CharMLP(vocab, context, [16, 12], gen(0))
    E, b_1 = model.params[:2]
    for seed in range(5):
        g = gen(seed)
        x, y = torch.randint(vocab, (n, context), generator=g), torch.randint(vocab, (n,), generator=g)
        hs, z = model.forward(x)
        assert torch.equal(hs[0], torch.tanh(E[torch.arange(context), x].sum(1) + b_1))
        deltas = [torch.randn(h.shape, generator=g) for h in hs]
        dE = model.gradients(x, hs, output_error(z, y), deltas)[0]
        da = deltas[0] * (1 - hs[0] * hs[0])
        expected = torch.zeros_like(E).index_put_(
            (torch.arange(context).expand(n, context), x), da[:, None, :].expand(n, context, -1) / n, accumulate=True
        )
        assert torch.equal(dE, expected)


@pytest.fixture
def no_backward(monkeypatch):
    """Every way to a gradient by backward pass raises: autograd's (Tensor.backward, autograd.backward,
    autograd.grad) and the network's hand-written one (CharMLP.backprop_deltas)."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a backward pass")

    for owner, name in (
        (torch.Tensor, "backward"),
        (torch.autograd, "backward"),
        (torch.autograd, "grad"),
        (CharMLP, "backprop_deltas"),
    ):
        monkeypatch.setattr(owner, name, forbidden)


@pytest.mark.parametrize("method", METHODS)
def test_backprop_free_methods_learn_without_any_backward_pass(method, no_backward):
    """The whole learning step after the forward pass (rule, feedback update, gradients, Adam) runs
    with autograd off and no graph (inference mode) and every backward pass forbidden, for each method
    whose row says needs_backward False; the two that say True fail exactly there."""
    vocab, context, config = 11, 4, settings(hidden=(6, 5), rank=4)
    model = CharMLP(vocab, context, [6, 5], gen(0))
    rule = make_method(method, vocab, config, gen(1))
    before = [p.clone() for p in model.params]
    with torch.inference_mode():
        batch = tiny_batch(model, vocab, context)
        assert not any(t.requires_grad for t in [*batch.hs, batch.z, *model.params])
        if rule.needs_backward:
            with pytest.raises(AssertionError, match="a backward pass"):
                learn(model, rule, Adam(model.params, lr=0.01), batch)
            return
        deltas, _ = learn(model, rule, Adam(model.params, lr=0.01), batch)
    assert [d.shape for d in deltas] == [(7, 6), (7, 5)]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.params))
    assert method in ("dfa", "feedback_frozen", "feedback_learned")


@pytest.fixture(scope="session")
def hamlet():
    return char_corpus("\n".join(load_shakespeare_roles(["hamlet"])["text"]), 0.1, 8)


TINY_RUN = dict(context=8, hidden=(32, 32), batch_size=32, lr=3e-3, log_every=20, eval_windows=256, rank=8)


def test_the_oracle_reproduces_the_learned_method_of_commit_f84eb23(hamlet):
    """Up to commit f84eb23 `feedback_learned` trained U on the true gradient; these are its curves on this
    run there. The oracle must reproduce them (feedback_frozen ends at 3.7167, so they
    tell the two apart)."""
    run = train(hamlet, "feedback_learned_oracle", 3, settings(steps=60, **TINY_RUN))
    assert run["step"].tolist() == [20, 40, 60]
    expected = {
        "test_loss": [4.16160393, 3.99233675, 3.73476815],
        "alignment_l1": [-0.084782985, -0.064263996, -0.0281419942],
        "alignment_l2": [-0.0935508643, -0.076294725, -0.0422394302],
        "alpha_l1": [0.0901459191, 0.0737491436, 0.0613820313],
    }
    for column, values in expected.items():
        assert run[column].tolist() == pytest.approx(values, rel=1e-5, abs=1e-7), column
    assert (run["signal"] == "oracle").all() and run["needs_backward"].all()


def test_training_curves_are_finite_and_share_the_initial_network_and_batches(hamlet):
    curves = {method: train(hamlet, method, 3, settings(steps=40, **TINY_RUN)) for method in METHODS}
    initial = CharMLP(len(hamlet.vocab), 8, [32, 32], gen(3))
    initial_loss, _ = evaluate(initial, *evenly_spaced_windows(hamlet.test, 8, 256))
    for method, run in curves.items():
        assert run["step"].tolist() == [20, 40] and (run["method"] == method).all()
        numeric = run.drop(columns=["method", "signal"])
        assert np.isfinite(numeric.to_numpy(dtype=float)).all(), method
        assert run["test_loss"].iloc[-1] < initial_loss - 0.2, method
        assert (run["update_seconds"].diff().dropna() > 0).all() and (run["update_seconds"] < run["seconds"]).all()
    assert curves["backprop"][["alignment_l1", "alignment_l2"]].to_numpy() == pytest.approx(1.0)
    assert "alpha_l1" in curves["feedback_learned"] and "alpha_l1" not in curves["dfa"]
    assert curves["feedback_frozen"]["alpha_l2"].to_numpy() == pytest.approx(0.1)
    properties = {
        m: tuple(run.iloc[0][["signal", "needs_backward", "forward_passes_per_step"]]) for m, run in curves.items()
    }
    assert properties == {
        "backprop": ("backprop", True, 1),
        "dfa": ("none", False, 1),
        "feedback_frozen": ("none", False, 1),
        "feedback_learned": ("node_perturbation", False, 2),
        "feedback_learned_oracle": ("oracle", True, 1),
    }
    # same seed: same network and batches, so the first step's training loss is shared
    first = [
        train(hamlet, method, 3, settings(steps=1, log_every=1, eval_windows=8, context=8, hidden=(32, 32), rank=8))[
            "train_loss"
        ].item()
        for method in METHODS
    ]
    assert first == pytest.approx([first[0]] * len(METHODS))


TIMINGS = ["seconds", "update_seconds"]  # wall clock: the one part of a run that differs from one run to the next


def test_a_jobs_seeds_each_train_as_their_run_alone(hamlet):
    """One job trains its method's seeds one after another (train_seeds): each seed's curves are those of its
    run alone, bit for bit, whatever ran before it in the process (seed 4 before seed 1 here), for every
    method (node perturbation's draws included)."""
    config = settings(steps=20, **{**TINY_RUN, "log_every": 10})
    for method in METHODS:
        logged = []
        curves = train_seeds(hamlet, method, [4, 1], config, progress=logged.append)
        assert curves["seed"].tolist() == [4, 4, 1, 1] and [run["seed"].iloc[-1] for run in logged] == [4, 1]
        for seed in (4, 1):
            alone = train(hamlet, method, seed, config).drop(columns=TIMINGS)
            run = curves[curves["seed"] == seed].reset_index(drop=True).drop(columns=TIMINGS)
            pd.testing.assert_frame_equal(run, alone, check_exact=True, obj=f"{method}, seed {seed}")


def seeds_config(tmp_path, seeds: list[int]):
    """config/test.yaml with feedback.seeds `seeds`, written for snakemake's --configfile."""
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["feedback"]["seeds"] = seeds
    path = tmp_path / f"seeds-{'-'.join(map(str, seeds))}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def planned(run, rule: str) -> list[str]:
    """The outputs of the jobs of `rule` that a dry run plans."""
    return re.findall(rf"^rule {rule}:\n(?:    (?!output).*\n)*    output: (.*)$", run.stdout, re.M)


def test_the_tiny_config_plans_one_feedback_job_per_method_for_all_its_seeds(tmp_path):
    methods = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["feedback"]["methods"]
    run = snakemake(tmp_path, "-n", "results/tables/feedback.csv", config=seeds_config(tmp_path, [0, 1, 2]))
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = sorted(f"results/feedback/method~{method}/curves.parquet" for method in methods)
    assert sorted(planned(run, "feedback_train")) == outputs
    assert len(planned(run, "feedback_table")) == 1


@pytest.mark.slow
def test_a_feedback_job_writes_each_seeds_run_alone_and_a_new_seed_list_reruns_it(tmp_path):
    """The job for one method with seeds [2, 0]: its file holds each seed's run as train computes it alone in
    this process, its log a line per seed. The same list plans nothing again; another list plans the job."""
    target, method = "results/feedback/method~feedback_learned/curves.parquet", "feedback_learned"

    def run(seeds, *args):
        done = snakemake(tmp_path, *args, target, config=seeds_config(tmp_path, seeds))
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run([2, 0])
    section = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["feedback"]
    text = "\n".join(pd.read_parquet(tmp_path / "results/corpus/roles.parquet")["text"])
    corpus = char_corpus(text, section["test_fraction"], section["context"])
    curves = pd.read_parquet(tmp_path / target)
    assert curves["seed"].drop_duplicates().tolist() == [2, 0]
    for seed in (2, 0):
        alone = train(corpus, method, seed, TrainConfig.from_config(section)).drop(columns=TIMINGS)
        written = curves[curves["seed"] == seed].reset_index(drop=True).drop(columns=TIMINGS)
        pd.testing.assert_frame_equal(written, alone, check_exact=True, obj=f"seed {seed}")
    log = (tmp_path / "results/logs/feedback_train-method~feedback_learned.log").read_text()
    assert re.findall(r"seed (\d) \((\d) of 2\) after 30 steps", log) == [("2", "1"), ("0", "2")]
    assert planned(run([2, 0], "-n"), "feedback_train") == []
    assert planned(run([2, 0, 1], "-n"), "feedback_train") == [target]


def test_summarize_takes_the_last_row_and_averages_alignment_over_layers_and_run():
    curves = pd.DataFrame(
        {
            "method": ["dfa"] * 2 + ["backprop"] * 2,
            "seed": [1, 1, 0, 0],
            "step": [10, 20, 10, 20],
            "seconds": [1.0, 2.0, 1.0, 2.0],
            "update_seconds": [0.5, 0.8, 0.6, 1.2],
            "train_loss": [3.0, 2.5, 3.0, 2.0],
            "test_loss": [3.1, 2.6, 3.0, 2.1],
            "test_acc": [0.1, 0.2, 0.1, 0.3],
            "alignment_l1": [0.1, 0.3, 1.0, 1.0],
            "alignment_l2": [0.2, 0.6, 1.0, 1.0],
            "signal": ["none"] * 2 + ["backprop"] * 2,
            "needs_backward": [False] * 2 + [True] * 2,
            "forward_passes_per_step": [1] * 4,
        }
    )
    table = summarize(curves)
    assert table["method"].tolist() == ["backprop", "dfa"]
    assert list(table.columns[:6]) == [
        "method",
        "seed",
        "signal",
        "needs_backward",
        "forward_passes_per_step",
        "seconds_per_step",
    ]
    dfa = table.iloc[1]
    assert (dfa["final_loss"], dfa["final_acc"], dfa["steps"]) == (2.6, 0.2, 20)
    assert dfa["mean_alignment"] == pytest.approx(0.3) and dfa["final_alignment"] == pytest.approx(0.45)
    assert (dfa["signal"], dfa["needs_backward"], dfa["seconds_per_step"]) == ("none", False, pytest.approx(0.04))


def test_paired_difference_over_seeds():
    table = pd.DataFrame(
        {
            "method": ["a"] * 4 + ["b"] * 4,
            "seed": [0, 1, 2, 3] * 2,
            "final_loss": [1.0, 1.1, 1.2, 1.3, 1.5, 1.2, 1.4, 1.6],
        }
    )
    difference = paired_difference(table, "a", "b")
    assert difference.mean == pytest.approx(-0.275) and (difference.lower, difference.n) == (4, 4)
    # Student-t by hand: s² = (0.225² + 0.175² + 0.075² + 0.025²) / 3, t(0.975, 3) = 3.182446 (a printed t table)
    half = 3.182446 * math.sqrt(0.0875 / 3) / 2
    assert (difference.ci_low, difference.ci_high) == pytest.approx((-0.275 - half, -0.275 + half), abs=1e-6)
    assert difference.sign_test_p is None and difference.verdict() == "lower"  # 4 seeds: a sign test gives p >= 0.125
    assert paired_difference(table, "b", "a").verdict() == "higher"
    assert paired_difference(table, "a", "missing") is None
    assert paired_difference(table[table["seed"] == 0], "b", "a").verdict() == "one seed"


def test_config_errors_name_the_key():
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["feedback"]["update"] = {"alpha_min": 2.0, "alpha_max": 1.0}
    with pytest.raises(ConfigError, match=r"'feedback.update.alpha_min': 2.0 is above feedback.update.alpha_max=1.0"):
        TrainConfig.from_config(validate(config)["feedback"])
    config["feedback"]["signal"] = "reconstruction"
    with pytest.raises(ConfigError, match=r"config key 'feedback.signal': 'reconstruction' is not one of"):
        validate(config)
    config["feedback"].update(signal="node_perturbation", methods=["backprop", "sgd"])
    with pytest.raises(ConfigError, match=r"config key 'feedback.methods\[1\]'"):
        validate(config)


def test_the_tiny_studys_feedback_table_has_a_row_per_method_and_seed(tiny_study):
    results = tiny_study.workdir / "results"
    assert tiny_study.run.returncode == 0, tiny_study.run.stderr[-3000:]
    config = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["feedback"]
    table = pd.read_csv(results / "tables" / "feedback.csv")
    assert table["method"].tolist() == config["methods"] and (table["seed"] == 0).all()
    required = ["method", "signal", "needs_backward", "forward_passes_per_step", "seconds_per_step"]
    assert set(required + ["final_loss", "final_acc", "mean_alignment"]) <= set(table.columns)
    assert (table["seconds_per_step"] > 0).all()
    learned = table.set_index("method").loc["feedback_learned"]
    assert (learned["signal"], learned["needs_backward"], learned["forward_passes_per_step"]) == (
        "node_perturbation",
        False,
        2,
    )
    assert (results / "tables" / "feedback.md").exists() and (results / "tables" / "feedback.tex").exists()
    curves = pd.read_parquet(results / "feedback" / "method~feedback_learned" / "curves.parquet")
    assert curves["step"].tolist() == [10, 20, 30] and (curves["seed"] == 0).all()
    assert (results / "benchmarks" / "feedback_train-method~dfa.tsv").exists()
    summary = (results / "summary.md").read_text()
    assert "| Does backprop-free feedback_learned beat dfa (held-out loss)? | **not shown** |" in summary
    assert "minus dfa: " in summary and "(one seed: no interval)" in summary
    assert "the oracle feedback_learned_oracle" in summary
