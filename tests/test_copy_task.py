"""Copy task data, metrics, training, the resilience table, config checks, and the Snakemake stage."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO

from uph.attention.copy_task import (
    CopyTaskConfig,
    copied_targets,
    copy_batch,
    copy_metrics,
    gram_resilience,
    train,
)
from uph.config import schema_defaults, validate
from uph.errors import ConfigError

# The table printed at the end of seed 004: (magnitude, Dot(Q,K), Gram(Q,K,R)), reference row first.
SEED_TABLE = [
    (1.0, 0.7071, -0.0),
    (1.0, 0.1, -1.0),
    (5.0, 0.1, -25.0),
    (10.0, 0.1, -100.0),
    (50.0, 0.1, -2500.0),
    (100.0, 0.1, -10000.0),
]

TINY = CopyTaskConfig.from_config(
    {
        **schema_defaults("copy_task"),
        "vocab": 8,
        "train_len": 8,
        "eval_lens": [16],
        "d_model": 16,
        "n_head": 2,
        "steps": 150,
        "batch_size": 32,
        "lr": 0.005,
        "log_every": 50,
        "eval_size": 64,
    }
)


def test_copy_batch_repeats_its_first_half_and_targets_are_the_next_tokens():
    inputs, targets = copy_batch(5, 12, 7, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (5, 11)
    data = torch.cat((inputs[:, :1], targets), dim=1)
    assert torch.equal(data[:, 6:], data[:, :6]) and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert 0 <= data.min() and data.max() < 7


def test_copied_targets_are_exactly_those_seen_half_a_sequence_earlier():
    inputs, targets = copy_batch(3, 10, 50, torch.Generator().manual_seed(1))
    copied = copied_targets(10)
    assert copied.tolist() == [False] * 4 + [True] * 5
    for t in range(9):
        source = t + 1 - 5  # input position holding the copied token
        assert copied[t] == (source >= 0)
        if copied[t]:
            assert torch.equal(targets[:, t], inputs[:, source])


def test_copy_metrics_recover_planted_errors():
    inputs, targets = copy_batch(4, 10, 6, torch.Generator().manual_seed(2))
    logits = F.one_hot(targets, 6).float() * 5
    perfect = copy_metrics(logits, targets)
    assert perfect["token_acc"] == 1.0 and perfect["seq_acc"] == 1.0
    logits[1, 2] = logits[1, 2].roll(1)  # a wrong guess on an unpredictable target
    assert copy_metrics(logits, targets)["token_acc"] == 1.0
    logits[2, 7] = logits[2, 7].roll(1)  # a wrong guess on a copied target
    metrics = copy_metrics(logits, targets)
    assert metrics["token_acc"] == pytest.approx(1 - 1 / 20) and metrics["seq_acc"] == pytest.approx(3 / 4)
    expected = F.cross_entropy(logits[:, 4:].reshape(-1, 6), targets[:, 4:].reshape(-1))
    assert metrics["loss"] == pytest.approx(expected.item())


def test_gram_resilience_matches_the_table_of_seed_004():
    table = gram_resilience()
    assert list(table.columns[:3]) == ["magnitude", "dot", "gram"]
    assert list(zip(table["magnitude"], table["dot"], table["gram"])) == SEED_TABLE
    assert table["result"].tolist() == ["True Match"] + ["Loud Mismatch"] * 5


def test_standard_attention_learns_the_tiny_copy_task_reproducibly():
    """Bit for bit on CPU, where the copy task runs by default; on CUDA standard attention's fused SDPA
    backward accumulates with atomics, so a rerun there matches only to a tolerance (uph.device)."""
    curves, final = train(TINY, "standard", seed=0, device=torch.device("cpu"))
    assert curves["step"].tolist() == [0, 50, 100, 150]
    assert {"attention", "seed", "step", "train_loss", "loss", "token_acc", "seq_acc"} <= set(curves.columns)
    assert curves["token_acc"].iloc[-1] >= 0.97 and curves["token_acc"].iloc[0] < 0.3
    assert final[["train_len", "eval_len"]].values.tolist() == [[8, 8], [8, 16]]
    assert final["token_acc"].iloc[0] == curves["token_acc"].iloc[-1]
    again, _ = train(TINY, "standard", seed=0, device=torch.device("cpu"))
    pd.testing.assert_frame_equal(curves, again)


@pytest.mark.parametrize("attention", ["triple", "triple_normed"])
def test_triple_attentions_train_under_bfloat16_autocast(attention):
    curves, final = train(
        dataclasses.replace(TINY, dtype="bfloat16", steps=100), attention, seed=0, device=torch.device("cpu")
    )
    assert curves[["train_loss", "loss"]].iloc[1:].notna().all().all()
    assert final["token_acc"].iloc[0] >= 0.9


def test_a_training_job_reads_every_key_but_the_lists_its_wildcards_pick():
    listed = {"attentions", "seeds", "device"}  # each job is one of them (rules/copy_task.smk); its own device param
    assert set(CopyTaskConfig.__dataclass_fields__) == set(schema_defaults("copy_task")) - listed


def test_head_width_must_be_even_and_divide_the_model_width():
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    for d_model, n_head in ((24, 8), (26, 4)):
        config["copy_task"].update(d_model=d_model, n_head=n_head)
        with pytest.raises(
            ConfigError,
            match=f"config key 'copy_task.d_model': {d_model} must split into "
            f"copy_task.n_head={n_head} heads of even width",
        ):
            validate(config)
    config["copy_task"].update(d_model=24, n_head=4)
    validate(config)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attentions": ["cosine"]}, "config key 'copy_task.attentions[0]': 'cosine' is not one of"),
        ({"train_len": 9}, "config key 'copy_task.train_len': 9 is not a multiple of 2"),
        ({"steps": 0}, "config key 'copy_task.steps': 0 is less than the minimum of 1"),
        ({"lenght": 8}, "config key 'copy_task.lenght' is not known"),
    ],
)
def test_schema_errors_name_the_key(change, message):
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["copy_task"].update(change)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(config)


def test_schema_defaults_are_the_embedded_default():
    embedded = validate(yaml.safe_load((REPO / "config.yaml").read_text()))["copy_task"]
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    del config["copy_task"]
    assert validate(config)["copy_task"] == embedded


def test_the_tiny_study_runs_the_copy_task_stage_on_the_test_config(tiny_study):
    """The copy-task stage's tables, run files, companions, benchmark and log, as the tiny study wrote them
    (`results` written as an absolute path plans the same jobs: tests/test_reliability.py's
    test_the_results_folder_written_any_way_plans_the_same_jobs_without_warnings)."""
    workdir, run = tiny_study.workdir, tiny_study.run
    targets = [f"results/tables/{name}.csv" for name in ("copy_task", "gram_resilience")]
    assert run.returncode == 0, run.stderr[-3000:]
    cfg = yaml.safe_load((REPO / "config/test.yaml").read_text())["copy_task"]
    table = pd.read_csv(workdir / targets[0])
    assert list(table.columns) == ["attention", "seed", "train_len", "eval_len", "final_loss", "token_acc", "seq_acc"]
    lengths = sorted({cfg["train_len"], *cfg["eval_lens"]})
    assert len(table) == len(cfg["attentions"]) * len(cfg["seeds"]) * len(lengths)
    assert set(table["attention"]) == set(cfg["attentions"]) and set(table["eval_len"]) == set(lengths)
    for attention in cfg["attentions"]:
        for seed in cfg["seeds"]:
            curves = pd.read_parquet(workdir / f"results/copy_task/attention~{attention}/seed~{seed}/curves.parquet")
            assert curves["step"].iloc[-1] == cfg["steps"] and (curves["attention"] == attention).all()
    resilience = pd.read_csv(workdir / targets[1])
    assert list(zip(resilience["magnitude"], resilience["dot"], resilience["gram"])) == SEED_TABLE
    assert (workdir / "results/tables/copy_task.md").exists() and (workdir / "results/tables/copy_task.tex").exists()
    assert (workdir / "results/benchmarks/copy_task_table.tsv").exists()
    assert "Loud Mismatch" in (workdir / "results/logs/gram_resilience.log").read_text()
    assert not list((workdir / "results").rglob(".tmp-*"))
