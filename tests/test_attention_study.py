"""The attention study: task generators' invariants, the residual model, lr selection, one cell end to end,
config checks, and the tiny study's attention table."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, snakemake

import uph.attention.self_attention as self_attention
import uph.attention.training
from uph.attention.model import ResidualModel, attention_stats, build_model
from uph.attention.runs import load_runs
from uph.attention.self_attention import ATTENTIONS, AttentionKind
from uph.attention.steps import stacked
from uph.attention.study_config import PROGRESS, STOPS, AttentionStudyConfig, eval_lengths, schedule
from uph.attention.tasks import IGNORE, copy_batch, make_batch, mqar_batch
from uph.attention.training import (
    best_lr,
    evaluate,
    extension,
    first_step,
    lr_edge,
    read_lr_jobs,
    run_cell,
    split_seeds,
    train_lr,
    train_runs,
)
from uph.config import schema_defaults, validate
from uph.errors import ConfigError


def study(**changes) -> AttentionStudyConfig:
    """The schema's defaults with `changes`, unvalidated (the tests' sizes go below the schema's minima)."""
    return AttentionStudyConfig.from_config({**schema_defaults("attention"), **changes})


TASK_CFG = study(vocab=16, items=5, distractors=3, ms=[1, 4, 16], train_ms=[1], pairs=[2, 4, 6])


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_offset_copy_repeats_distinct_items_at_offsets_that_vary_and_scores_only_the_predictable_copy():
    n, length = 5, 30
    batch = copy_batch(200, length, 16, generator(), n)
    offsets = []
    for tokens, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
        full = tokens + [None]
        content = [t for t in tokens if t != 0]
        positions = [i for i, t in enumerate(tokens) if t != 0]
        items = content[:n]
        assert len(set(items)) == n and all(1 <= t < 16 for t in items)
        first, second = positions[0], positions[n]
        assert positions[:n] == list(range(first, first + n))  # each copy is contiguous
        offsets.append(second - first)
        # the second copy may be cut at the end of the inputs (its last item is only a target)
        copied = [full[second + i] if second + i < length else targets[second + i - 1] for i in range(n)]
        assert copied == items
        scored = [t for t, target in enumerate(targets) if target != IGNORE]
        assert scored == list(range(second, second + n - 1))
        assert [targets[t] for t in scored] == items[1:]
    assert len(set(offsets)) > 5 and min(offsets) >= n  # the offset changes from sequence to sequence
    assert torch.equal(batch.loud, torch.ones_like(batch.loud))


def test_loud_copy_distractors_are_configured_in_number_and_loudness_and_never_match_an_item():
    n, distractors = 5, 3
    loudness = torch.tensor([1.0, 4.0, 16.0, 4.0] * 25)
    batch = copy_batch(100, 30, 16, generator(1), n, distractors, loudness)
    assert torch.equal(batch.level, loudness)
    counts = []
    for tokens, loud, m in zip(batch.inputs, batch.loud, loudness):
        assert set(loud.unique().tolist()) == ({1.0} if m == 1 else {1.0, m.item()})
        if m == 1:
            continue
        spots = loud == m
        counts.append(spots.sum().item())
        items = tokens[~spots & (tokens != 0)].tolist()
        assert len(set(items)) == n and all(items.count(t) <= 2 for t in items)  # the items and their copy
        assert not set(tokens[spots].tolist()) & set(items) and (tokens[spots] != 0).all()
    assert counts == [distractors] * len(counts)  # before the second copy: none falls off the end


def test_every_scored_query_in_loud_copy_sees_every_distractor():
    """A query at input position t attends to positions <= t: every distractor sits before the first
    scored position, so none is hidden from a scored query (they used to land after the scored span)."""
    n, distractors = 5, 4
    batch = copy_batch(200, 30, 16, generator(4), n, distractors, torch.full((200,), 16.0))
    for targets, loud in zip(batch.targets, batch.loud):
        spots = (loud == 16).nonzero().squeeze(1)
        scored = (targets != IGNORE).nonzero().squeeze(1)
        assert len(spots) == distractors and len(scored) == n - 1
        assert spots.max() < scored.min()


def test_mqar_keys_are_unique_per_sequence_and_each_query_is_scored_on_its_value():
    pairs = torch.tensor([2, 4, 6] * 20)
    batch = mqar_batch(60, 24, 16, generator(2), pairs)
    n_keys = 7
    for tokens, targets, n in zip(batch.inputs.tolist(), batch.targets.tolist(), pairs.tolist()):
        keys, values = tokens[0 : 2 * n : 2], tokens[1 : 2 * n : 2]
        assert len(set(keys)) == n and all(1 <= k <= n_keys for k in keys)
        assert all(n_keys < v < 16 for v in values)
        value_of = dict(zip(keys, values))
        queried = [(t, target) for t, target in enumerate(targets) if target != IGNORE]
        assert len(queried) == n and all(t >= 2 * n for t, _ in queried)
        assert sorted(tokens[t] for t, _ in queried) == sorted(keys)
        assert all(target == value_of[tokens[t]] for t, target in queried)
        assert all(tokens[t] == 0 for t in range(2 * n, 24) if targets[t] == IGNORE)


def test_training_draws_train_ms_while_each_test_set_has_its_level():
    train = make_batch("loud_copy", TASK_CFG, 64, 30, generator(3))
    assert set(train.level.tolist()) == {1.0} and torch.equal(train.loud, torch.ones_like(train.loud))
    test = make_batch("loud_copy", TASK_CFG, 8, 30, generator(3), level=16)
    assert set(test.level.tolist()) == {16.0} and test.loud.max() == 16
    mqar = make_batch("mqar", TASK_CFG, 300, 24, generator(3))
    assert set(mqar.level.tolist()) == {2.0, 4.0, 6.0}


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_residual_model_is_causal_with_loud_tokens(attention):
    torch.manual_seed(0)
    model = ResidualModel(vocab=11, d_model=16, n_head=2, attention=attention, n_layer=2)
    tokens = torch.randint(0, 11, (2, 12))
    loud = torch.ones(2, 12)
    loud[:, 4] = 8.0
    changed, louder = tokens.clone(), loud.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 11
    louder[:, 9] = 16.0
    with torch.no_grad():
        before, after = model(tokens, loud), model(changed, louder)
    torch.testing.assert_close(before[:, :9], after[:, :9], rtol=0, atol=0)
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_a_new_kind_is_one_registry_entry_and_trains(monkeypatch):
    """A toy kind (negative squared distance, -|q_i - k_j|² / sqrt(D)) added through KINDS alone trains
    one step in the study's own loop: its model builds, its loss is finite, its weights move and the
    curve row reads its score magnitude."""

    def distance_scores(q, k, r):
        T = q.shape[-2]
        scores = -torch.cdist(q, k).square() / q.shape[-1] ** 0.5
        return [scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))]

    kind = AttentionKind(family="distance", vectors=2, turned=2, loud=(1,), scores=distance_scores)
    monkeypatch.setitem(self_attention.KINDS, "distance", kind)
    cfg = study(vocab=8, items=3, distractors=2, train_len=12, d_model=8, n_head=2, n_layer=1, max_steps=1)
    cfg = dataclasses.replace(cfg, log_every=1, batch_size=8, eval_size=8, probe_size=4)
    (run,) = train_runs(cfg, "offset_copy", "residual", "distance", [(0.01, 0)], torch.device("cpu"))
    rows = run.rows
    initial = build_model("residual", "distance", cfg, [0])  # train_runs' initialization
    assert not run.diverged and math.isfinite(rows[0]["train_loss"]) and math.isfinite(run.final["val_loss"])
    assert rows[0]["score_abs"] > 0 and math.isfinite(rows[0]["attention_grad_norm"])
    moved = [name for name, before in initial.named_parameters() if not torch.equal(run.state[name], before[0])]
    assert {"blocks.0.attention.proj.weight", "blocks.0.attention.out.weight"} <= set(moved)


def test_attention_stats_read_the_held_gradients_and_the_scores():
    torch.manual_seed(0)
    model = ResidualModel(vocab=8, d_model=8, n_head=2, attention="standard", n_layer=2)
    tokens = torch.randint(0, 8, (2, 6))
    assert math.isnan(attention_stats(model, tokens)["attention_grad_norm"][0])
    model(tokens).square().sum().backward()
    stats = attention_stats(model, tokens)
    layers = [block.attention for block in model.blocks]
    expected = torch.cat([p.grad.flatten() for layer in layers for p in layer.parameters()]).norm()
    assert stats["attention_grad_norm"] == [pytest.approx(expected.item(), rel=1e-5)]
    assert stats["score_abs"][0] > 0 and not any(layer.measure_scores for layer in layers)


def test_best_lr_takes_the_middle_of_the_lrs_the_seeds_do_not_separate_from_the_best_never_a_diverged_one():
    """An lr ties with the best mean validation accuracy unless the lower end of Welch's 90 % interval of
    (best - lr) is above TIE (0.01); the middle of the tied lrs wins (of two, the higher), whatever their
    validation losses, which another CPU's rounding reorders; an lr with a diverged run never wins."""

    def sweep(accuracies: dict, diverged=()):
        return pd.DataFrame(
            [
                {"lr": lr, "val_token_acc": acc, "val_loss": 1.0 - acc + 0.1 * i, "diverged": lr in diverged}
                for i, (lr, accs) in enumerate(accuracies.items())
                for acc in accs
            ]
        )

    three = {0.001: [1.0, 1.0], 0.003: [1.0, 0.995], 0.01: [0.995, 1.0], 0.03: [0.9, 0.9]}
    assert best_lr(sweep(three)) == 0.003  # 0.001, 0.003, 0.01 tie; 0.03 is 0.1 behind, no spread
    assert best_lr(sweep({**three, 0.001: [0.97, 0.97]})) == 0.01  # two tie: the higher
    assert best_lr(sweep(three, diverged=(0.003,))) == 0.01  # 0.001 and 0.01 left
    reordered = sweep(three).assign(val_loss=lambda t: t["val_loss"].iloc[::-1].to_numpy())
    assert best_lr(reordered) == 0.003  # the losses do not break a tie
    assert best_lr(sweep(three, diverged=tuple(three))) is None
    # a bimodal kind: one seed of three stalls at 0.01. Three seeds cannot tell the lrs apart (Welch's lower
    # end -0.36: a tie, the higher wins, whichever seed a CPU's rounding makes stall); ten seeds, four of
    # them stalled, can (lower end +0.056 > TIE: 0.003 alone), and two of ten cannot (-0.025: a tie)
    assert best_lr(sweep({0.003: [1.0, 1.0, 1.0], 0.01: [1.0, 0.44, 1.0]})) == 0.01
    assert best_lr(sweep({0.003: [1.0, 1.0, 0.44], 0.01: [1.0, 1.0, 1.0]})) == 0.01
    assert best_lr(sweep({0.003: [1.0] * 10, 0.01: [1.0, 0.44] * 4 + [1.0] * 2})) == 0.003
    assert best_lr(sweep({0.003: [1.0] * 10, 0.01: [1.0, 0.44] * 2 + [1.0] * 6})) == 0.01
    assert best_lr(sweep({0.003: [1.0], 0.01: [0.98]})) == 0.003  # one seed a side: the difference itself


CELL = study(
    tasks=["mqar"],
    seeds=[0, 1, 2],
    sweep_seeds=1,
    lrs=[0.003, 0.03],
    vocab=8,
    train_len=6,
    eval_factors=[2],
    items=2,
    distractors=1,
    ms=[1, 4],
    pairs=[1, 2],
    d_model=8,
    n_head=2,
    n_layer=1,
    max_steps=40,
    patience=100,  # every run takes its 40 steps
    lr_extensions=1,
    batch_size=16,
    log_every=20,
    eval_size=16,
    probe_size=4,
)


def test_a_cell_sweeps_lrs_on_the_sweep_seeds_then_tests_every_seed_at_the_chosen_lr():
    curves, sweep, evaluation = run_cell(CELL, "mqar", "residual", "standard", torch.device("cpu"))
    tried = sorted(set(sweep.loc[sweep["seed"] == 0, "lr"]))
    chosen = best_lr(sweep[sweep["seed"] == 0])
    # two lrs: the best is an end of them, so one more lr_step beyond it trained (lr_extensions 1)
    extra = sweep.loc[sweep["extended"], "lr"].unique().tolist()
    assert len(tried) == 3 and {0.003, 0.03} <= set(tried) and extra == [t for t in tried if t not in (0.003, 0.03)]
    assert extra[0] == pytest.approx(0.003 / CELL.lr_step) or extra[0] == pytest.approx(0.03 * CELL.lr_step)
    assert set(evaluation["lr_at_edge"]) == set(sweep["lr_at_edge"]) == {lr_edge(chosen, tried)}
    assert set(sweep.loc[sweep["seed"] > 0, "lr"]) == {chosen} and sweep["chosen"].eq(sweep["lr"] == chosen).all()
    assert set(evaluation["lr"]) == {chosen} and len(evaluation) == 3 * len(eval_lengths(CELL)) * 2
    assert set(evaluation["eval_len"]) == {6, 12} and set(evaluation["level"]) == {1.0, 2.0}
    assert (
        evaluation["token_acc"].between(0, 1).all() and (evaluation["seq_acc"] <= evaluation["token_acc"] + 1e-9).all()
    )
    assert curves["step"].max() == 40 and curves[["score_abs", "attention_grad_norm"]].notna().all().all()
    assert (evaluation["steps_run"] == 40).all() and evaluation["at_step_limit"].all()
    assert set(evaluation["family"]) == {"standard"} and not evaluation["loudness_invariant"].any()
    # the test sets are fixed: a second run gives the same table (bit for bit on CPU, the study's default
    # device; on CUDA the fused SDPA backward makes a rerun match only to a tolerance: uph.device)
    again = run_cell(CELL, "mqar", "residual", "standard", torch.device("cpu"))[2]
    pd.testing.assert_frame_equal(evaluation, again)


def test_a_cell_whose_seeds_split_trains_more_seeds_at_its_lr():
    """split_seeds: runs at the chosen lr that split between solving (val token accuracy >= 0.99) and not
    (a diverged run counts as not) get seeds max + 1, ... up to the number wanted; agreeing runs, or None
    wanted, get none. run_cell tests the added seeds beside the others at the chosen lr."""
    sweep = pd.DataFrame(
        {
            "lr": [0.01, 0.01, 0.01, 0.001],
            "seed": [0, 1, 2, 0],
            "val_token_acc": [1.0, 0.44, 0.995, 0.3],
            "diverged": [False, False, False, False],
        }
    )
    assert split_seeds(sweep, 0.01, [0, 1, 2], 6) == [3, 4, 5]
    assert split_seeds(sweep, 0.01, [0, 1, 2], None) == [] and split_seeds(sweep, 0.001, [0], 6) == []
    solved_or_diverged = sweep.assign(val_token_acc=1.0, diverged=[False, True, False, False])
    assert split_seeds(solved_or_diverged, 0.01, [0, 1, 2], 6) == [3, 4, 5]
    assert split_seeds(sweep.assign(val_token_acc=1.0), 0.01, [0, 1, 2], 6) == []
    cell = dataclasses.replace(
        CELL, seeds=(0, 1), seeds_if_split=3, lrs=(0.01,), lr_extensions=0, max_steps=4, log_every=2
    )
    with pytest.MonkeyPatch.context() as patch:  # whatever the runs reached, call them split
        patch.setattr(uph.attention.training, "split_seeds", lambda s, lr, seeds, wanted: [2])
        _, sweep, evaluation = run_cell(cell, "mqar", "residual", "standard", torch.device("cpu"))
    assert sorted(sweep["seed"]) == [0, 1, 2] and sorted(evaluation["seed"].unique()) == [0, 1, 2]
    assert set(evaluation["lr"]) == {0.01} and evaluation["token_acc"].notna().all()
    with pytest.MonkeyPatch.context() as patch:  # runs that agree: no seed added
        patch.setattr(uph.attention.training, "split_seeds", lambda s, lr, seeds, wanted: [])
        assert sorted(run_cell(cell, "mqar", "residual", "standard", torch.device("cpu"))[1]["seed"]) == [0, 1]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_split_kinds_cell_sweeps_on_its_seeds_and_trains_the_later_seeds_at_the_chosen_lr_only(ahead):
    """A kind of split_kinds sweeps every lr on all of `seeds` (0 and 1), not the first sweep_seeds (1), picks
    the lr on them alone, then trains seeds 2 and 3 (up to seeds_if_split) at that lr only, split or not
    (split_seeds is never asked), in one stage after the sweep's; trained ahead (a GPU's way), the same runs
    in the same rows, the later seeds at every lr in the sweep's one call."""
    cell = dataclasses.replace(
        CELL,
        seeds=(0, 1),
        sweep_seeds=1,
        seeds_if_split=4,
        split_kinds=("standard",),
        lrs=(0.003, 0.01),
        lr_extensions=0,
        max_steps=4,
        log_every=2,
    )
    stages, train_runs = [], uph.attention.training.train_runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uph.attention.training, "split_seeds", lambda *a: pytest.fail("a split kind asks no split"))
        patch.setattr(uph.attention.training, "train_runs", lambda *a: stages.append(a[4]) or train_runs(*a))
        _, sweep, evaluation = run_cell(cell, "mqar", "residual", "standard", torch.device("cpu"), ahead=ahead)
    chosen = best_lr(sweep[sweep["seed"] < 2])
    swept = [(lr, seed) for lr in (0.003, 0.01) for seed in (0, 1)]
    if ahead:
        assert stages == [[*swept, *((lr, seed) for lr in (0.003, 0.01) for seed in (2, 3))]]
    else:
        assert stages == [swept, [(chosen, 2), (chosen, 3)]]
    assert sweep.groupby("lr")["seed"].apply(sorted).to_dict() == {
        lr: [0, 1, 2, 3] if lr == chosen else [0, 1] for lr in (0.003, 0.01)
    }
    assert sweep["chosen"].eq(sweep["lr"] == chosen).all() and set(evaluation["lr"]) == {chosen}
    assert sorted(evaluation["seed"].unique()) == [0, 1, 2, 3]


def test_a_split_kinds_cell_from_its_lr_jobs_is_the_cell_trained_in_one_job_to_the_byte():
    """The workflow's attention_lr jobs (train_lr: one lr on every seed of `seeds`), read back (read_lr_jobs)
    as run_cell's `swept`: the same three tables to the byte as the cell trained in one job, though each
    lr's runs trained in a batch of their own (a run's arithmetic does not depend on its batch's other
    runs, whose stops at patience 1 change its size), and the choosing job trains only what follows the
    sweep: the later seeds at the chosen lr, after any extension's runs."""
    cell = dataclasses.replace(
        CELL,
        seeds=(0, 1),
        seeds_if_split=4,
        split_kinds=("triple_capped",),
        lr_extensions=1,
        patience=1,
        max_steps=100,
        max_steps_extended=100,
        log_every=10,
    )
    args = ("mqar", "residual", "triple_capped", torch.device("cpu"))
    one_job = run_cell(cell, *args)
    assert one_job[1]["steps_run"].nunique() > 1  # runs left the one job's batch at different steps
    jobs = [train_lr(cell, *args[:3], lr, args[3]) for lr in cell.lrs]
    names = dict(build_model("residual", "triple_capped", cell).named_parameters())
    assert all(len(weights) == len(cell.seeds) * len(names) for _, _, weights in jobs)
    stages, train_runs_ = [], uph.attention.training.train_runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uph.attention.training, "train_runs", lambda *a: stages.append(a[4]) or train_runs_(*a))
        from_jobs = run_cell(cell, *args, swept=read_lr_jobs(jobs))
    for table, expected in zip(from_jobs, one_job, strict=True):
        pd.testing.assert_frame_equal(table, expected, check_exact=True)
    chosen = one_job[1].loc[one_job[1]["chosen"], "lr"].iloc[0]
    *extensions, later = stages
    assert later == [(chosen, 2), (chosen, 3)] and all(lr not in cell.lrs for stage in extensions for lr, _ in stage)
    with pytest.raises(ValueError, match="attention.split_kinds"):
        train_lr(cell, "mqar", "residual", "standard", cell.lrs[0], args[3])


@pytest.mark.parametrize("split_on", ["sweep seeds", "every seed"])
def test_seeds_added_where_the_sweep_seeds_split_train_in_the_remaining_seeds_stage(split_on):
    """Runs that split on the sweep seeds split on every seed, so the seeds a split adds train with the
    remaining seeds, in one stage; a split that only the remaining seeds show adds them in a stage after.
    Either way the same seeds at the chosen lr, in the same order."""
    cell = dataclasses.replace(
        CELL, seeds=(0, 1, 2), sweep_seeds=1, seeds_if_split=4, lrs=(0.01,), lr_extensions=0, max_steps=4, log_every=2
    )
    seen = 1 if split_on == "sweep seeds" else 3  # the seeds whose runs first show the split

    def split(sweep, lr, seeds, wanted):
        return uph.attention.training.seeds_to_add(seeds, wanted) if sweep["seed"].nunique() >= seen else []

    stages, train_runs = [], uph.attention.training.train_runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uph.attention.training, "split_seeds", split)
        patch.setattr(uph.attention.training, "train_runs", lambda *a: stages.append(a[4]) or train_runs(*a))
        _, sweep, evaluation = run_cell(cell, "mqar", "residual", "standard", torch.device("cpu"))
    later = [[(0.01, 1), (0.01, 2), (0.01, 3)]] if seen == 1 else [[(0.01, 1), (0.01, 2)], [(0.01, 3)]]
    assert stages == [[(0.01, 0)], *later]
    assert sweep["seed"].tolist() == [0, 1, 2, 3] and evaluation["seed"].unique().tolist() == [0, 1, 2, 3]


def test_a_cell_trained_ahead_holds_the_runs_its_stages_hold_in_one_call():
    """On a GPU run_cell trains the later seeds at every lr within the sweep (`ahead`): the same lr chosen
    on the sweep seed, the same runs in the same rows, each within the float32 rounding that runs at once
    differ by (tests/test_attention_runs.py), in one call of train_runs where the stages take two; and the
    runs it never asks for (seeds 1 and 2 at the lr not chosen, seeds a split would add) in no table."""
    cell = dataclasses.replace(CELL, lr_extensions=0, seeds_if_split=5)
    calls, tables = {}, {}
    original = uph.attention.training.train_runs
    for ahead in (False, True):
        calls[ahead] = []

        def counted(*args, ahead=ahead):
            calls[ahead].append(len(args[4]))
            return original(*args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(uph.attention.training, "train_runs", counted)
            tables[ahead] = run_cell(cell, "mqar", "residual", "standard", torch.device("cpu"), ahead=ahead)
    assert calls == {False: [2, 2], True: [2 + 2 * (2 + 2)]}  # split seeds 3 and 4 trained ahead too
    for staged, at_once in zip(tables[False], tables[True]):
        pd.testing.assert_frame_equal(at_once, staged, check_exact=False, rtol=1e-4, atol=1e-6)
    assert sorted(tables[True][1]["seed"]) == [0, 0, 1, 2]


def test_the_lr_sweep_extends_past_the_end_its_best_lr_sits_at():
    """lr_edge and extension: a best lr at the low (high) end of the lrs tried gets one lr_step lower
    (higher), never above 1; inside, or the only lr tried (no direction), none."""
    tried = [0.001, 0.003, 0.01]
    assert [lr_edge(lr, tried) for lr in tried] == ["low", "", "high"] and lr_edge(0.01, [0.01]) == "both"
    assert extension(0.001, tried, 10.0) == pytest.approx(1e-4) and extension(0.01, tried, 10.0) == pytest.approx(0.1)
    assert extension(0.003, tried, 10.0) is None and extension(0.01, [0.01], 10.0) is None
    assert extension(0.5, [0.1, 0.5], 3.0) is None  # 1.5 is no learning rate


def test_a_training_job_reads_every_key_but_the_lists_its_wildcards_pick():
    # each job is one of them (rules/attention.smk; tasks: its one task); device: its own param (job_device)
    listed = {"models", "attentions", "device"}
    assert set(AttentionStudyConfig.__dataclass_fields__) == set(schema_defaults("attention")) - listed


@pytest.mark.parametrize(
    "change, message",
    [
        ({"items": 12, "distractors": 4}, "config key 'attention.items': loud_copy needs items + distractors = 16"),
        ({"pairs": [2, 9]}, "config key 'attention.pairs': mqar with 9 pairs needs attention.train_len >= 27"),
        ({"sweep_seeds": 6}, "config key 'attention.sweep_seeds': 6 is more than the 5 attention.seeds"),
        ({"seeds_if_split": 4}, "config key 'attention.seeds_if_split': 4 is fewer than the 5 attention.seeds"),
        ({"seeds_if_split": None}, "config key 'attention.split_kinds' lists kinds to train attention.seeds_if_split"),
        ({"d_model": 12, "n_head": 4}, "config key 'attention.d_model': 12 must split"),
        (
            {"d_model": 24, "n_head": 4, "attentions": ["standard", "diff"]},
            "config key 'attention.d_model': 24 must split into attention.n_head=4 heads of a width that is a "
            "multiple of 4 (diff",
        ),
        ({"ms": []}, "config key 'attention.ms'"),
        ({"solved_accuracy": 1.5}, "config key 'attention.solved_accuracy': 1.5 is greater than the maximum of 1"),
        ({"solved_accuracy": 0}, "config key 'attention.solved_accuracy': 0 is less than or equal to the minimum of 0"),
        ({"solved_accuracy": "all"}, "config key 'attention.solved_accuracy': 'all' is not of type 'number', 'null'"),
        ({"solved_evaluations": 0}, "config key 'attention.solved_evaluations': 0 is less than the minimum of 1"),
        ({"solved_evaluations": 2.5}, "config key 'attention.solved_evaluations': 2.5 is not a whole number"),
    ],
)
def test_bad_attention_settings_stop_with_one_line_naming_the_key(change, message):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["attention"].update(change)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
        validate(config)


def test_tiny_study_tables_hold_every_configured_run_at_one_chosen_lr_per_cell(tiny_study):
    cfg = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["attention"]
    tables = tiny_study.workdir / "results" / "tables"
    table = pd.read_csv(tables / "attention.csv")
    sweep = pd.read_csv(tables / "attention_sweep.csv")
    levels = {"offset_copy": 1, "loud_copy": len(cfg["ms"]), "mqar": len(cfg["pairs"])}
    # a kind of split_kinds reports seeds_if_split seeds, the others their seeds (none split in 6 steps)
    seeds = {
        kind: cfg["seeds_if_split"] if kind in cfg["split_kinds"] else len(cfg["seeds"]) for kind in cfg["attentions"]
    }
    per_cell = sum(seeds.values()) * (1 + len(cfg["eval_factors"]))
    assert cfg["split_kinds"] and len(table) == sum(levels[task] for task in cfg["tasks"]) * per_cell
    assert table.groupby(["task", "model", "attention"])["lr"].nunique().eq(1).all()
    assert set(table["lr"]) <= set(cfg["lrs"]) and set(sweep["lr"]) == set(cfg["lrs"])
    curves = pd.read_csv(tables / "attention_curves.csv")
    assert curves[["score_abs", "attention_grad_norm"]].notna().all().all()
    # each run stopped as its curve says: solved after solved_evaluations rows at solved_accuracy, else not
    assert set(sweep["stopped"]) <= set(STOPS) and (sweep["stopped"] == "step_limit").eq(sweep["at_step_limit"]).all()
    for run in sweep.itertuples():
        curve = curves[
            (curves["task"] == run.task) & (curves["attention"] == run.attention) & (curves["seed"] == run.seed)
        ]
        last = curve.sort_values("step")["val_token_acc"].tail(cfg["solved_evaluations"])
        assert curve["step"].max() == run.steps_run
        assert (run.stopped == "solved") == (
            len(last) == cfg["solved_evaluations"] and (last >= cfg["solved_accuracy"]).all()
        )


def planned_after(tiny_study, tmp_path, **attention) -> dict[str, int]:
    """rule -> job count of a dry run on a copy of the tiny study with `attention` changed in its config."""
    workdir = tmp_path / "study"
    shutil.copytree(tiny_study.workdir, workdir, symlinks=True)
    config = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    config["attention"].update(attention)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(workdir, "-n", config=tmp_path / "config.yaml")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = run.stdout.split("Job stats:", 1)[1].split("total", 1)[0].splitlines()[3:]
    return dict((name, int(count)) for name, count in map(str.split, filter(str.strip, rows)))


def test_an_attention_setting_reruns_every_attention_job_and_no_other_branch(tiny_study, tmp_path):
    jobs = planned_after(tiny_study, tmp_path, ms=[1, 2])
    cfg = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["attention"]
    cells = len(cfg["models"]) * len(cfg["attentions"]) * len(cfg["tasks"])  # one job per (model, attention, task)
    assert jobs["attention_train"] == cells and jobs["attention_table"] == 1
    # and one per lr of a split kind's cell
    assert jobs["attention_lr"] == len(cfg["models"]) * len(cfg["split_kinds"]) * len(cfg["tasks"]) * len(cfg["lrs"])
    # the branches beside it (the LM branch's jobs rerun too whenever its code changed after the fixture ran)
    assert not {"copy_task_train", "copy_task_table", "gram_resilience", "feedback_train", "corpus_roles"} & set(jobs)


def test_dropping_a_task_reruns_no_training_job_only_the_table(tiny_study, tmp_path):
    """A job's params leave out the lists its wildcards pick (rules/attention.smk): the other tasks' jobs
    stay done."""
    tasks = validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))["attention"]["tasks"]
    jobs = planned_after(tiny_study, tmp_path, tasks=tasks[:-1])
    assert not {"attention_lr", "attention_train"} & set(jobs) and jobs["attention_table"] == 1


def test_a_run_stops_after_patience_evaluations_without_improvement_and_keeps_its_best_weights():
    """min_delta larger than any fall of the loss: nothing after the first evaluation improves, so the run
    stops `patience` evaluations later and hands back the first evaluation's weights and metrics."""
    cfg = dataclasses.replace(CELL, max_steps=40, log_every=5, patience=2, min_delta=100.0)
    device = torch.device("cpu")
    (run,) = train_runs(cfg, "mqar", "residual", "standard", [(0.01, 0)], device)
    rows, final, progress = run.rows, run.final, run.progress
    assert [row["step"] for row in rows] == [5, 10, 15] and not run.diverged
    assert progress == {
        "steps_run": 15,
        "best_step": 5,
        "steps_to_90": first_step(rows, 0.9),
        "steps_to_99": first_step(rows, 0.99),
        "at_step_limit": False,
        "stopped": "patience",
    }
    assert final["val_loss"] == rows[0]["val_loss"] != rows[-1]["val_loss"]
    val = stacked([make_batch("mqar", cfg, cfg.eval_size, cfg.train_len, generator(0 * 1_000_003 + 1))], device)
    model = load_runs(build_model("residual", "standard", cfg, [0]), [run.state])
    assert evaluate(model, val, cfg.batch_size)[0]["loss"] == pytest.approx(final["val_loss"], rel=1e-6)
    (run,) = train_runs(dataclasses.replace(cfg, patience=100), "mqar", "residual", "standard", [(0.01, 0)], device)
    rows, progress = run.rows, run.progress
    assert progress["steps_run"] == 40 and progress["at_step_limit"] and len(rows) == 8
    assert progress["stopped"] == "step_limit" and list(progress) == PROGRESS


def scripted_evaluations(patch, scripts: list[list[tuple[float, float]]]) -> None:
    """uph.attention.training.evaluate answering, for run r of those train_runs was given, its k-th
    evaluation's (validation token accuracy, loss) from scripts[r][k]: the stops are decided by these
    numbers, the training itself is real. A run leaving the batch leaves the runs after it (in order)."""
    calls = [0] * len(scripts)
    alive = list(range(len(scripts)))

    def evaluate(model, batch, chunk):
        del alive[: len(alive) - batch.inputs.shape[0]]  # the runs that stopped were the first ones
        out = []
        for r in alive:
            accuracy, loss = scripts[r][calls[r]]
            calls[r] += 1
            out.append({"loss": loss, "token_acc": accuracy, "seq_acc": float(accuracy == 1.0)})
        return out

    patch.setattr(uph.attention.training, "evaluate", evaluate)


def falling(accuracies: list[float]) -> list[tuple[float, float]]:
    """Each accuracy with a validation loss 0.1 lower than the last: patience never runs out."""
    return [(accuracy, 5.0 - 0.1 * k) for k, accuracy in enumerate(accuracies)]


SOLVED_CELL = dataclasses.replace(CELL, max_steps=40, log_every=2, patience=100)  # 20 evaluations at most


@pytest.mark.parametrize(
    "solved_accuracy, solved_evaluations, accuracies, stops_at, stopped",
    [
        # 1.0 twice in a row does not stop it, nor does 0.99 (it breaks the row): 1.0 at evaluations 5-7 does
        (1.0, 3, [0.5, 1.0, 1.0, 0.99, 1.0, 1.0, 1.0], 14, "solved"),
        (1.0, 3, [0.5, 1.0, 1.0] + [0.99] * 17, 40, "step_limit"),  # 0.99 forever: never solved at 1.0
        (0.99, 3, [0.5, 1.0, 1.0, 0.99, 1.0, 1.0, 1.0], 8, "solved"),  # at 0.99 three in a row by evaluation 4
        (1.0, 2, [0.5, 1.0, 1.0, 0.99, 1.0, 1.0, 1.0], 6, "solved"),
        (None, 3, [1.0] * 20, 40, "step_limit"),  # no solved stop
    ],
)
def test_a_run_stops_as_solved_after_solved_evaluations_in_a_row_at_solved_accuracy(
    solved_accuracy, solved_evaluations, accuracies, stops_at, stopped
):
    cfg = dataclasses.replace(SOLVED_CELL, solved_accuracy=solved_accuracy, solved_evaluations=solved_evaluations)
    accuracies = accuracies + [1.0] * (20 - len(accuracies))
    with pytest.MonkeyPatch.context() as patch:
        scripted_evaluations(patch, [falling(accuracies)])
        (run,) = train_runs(cfg, "mqar", "residual", "standard", [(0.01, 0)], torch.device("cpu"))
    assert [row["step"] for row in run.rows] == list(range(2, stops_at + 1, 2))
    assert run.progress["steps_run"] == stops_at and run.progress["stopped"] == stopped
    assert run.progress["at_step_limit"] == (stopped == "step_limit") and not run.diverged
    assert run.progress["best_step"] == stops_at  # the loss fell at every evaluation
    assert run.final["val_token_acc"] == accuracies[stops_at // 2 - 1]


def test_a_run_stopped_as_solved_keeps_its_best_evaluations_weights_and_leaves_the_batch():
    """Solved at evaluation 7 (1.0 at 5, 6, 7), its lowest validation loss at evaluation 5: it hands back
    evaluation 5's weights and metrics, as the same run alone, stopped there by patience, does. A run beside
    it that is never solved trains on to the step limit, and is the run it is alone. Runs at once agree with
    runs alone up to the float32 rounding their batch's shapes give (tests/test_attention_runs.py)."""
    cfg = dataclasses.replace(SOLVED_CELL, patience=2)
    accuracies = [0.5, 0.8, 0.9, 0.99, 1.0, 1.0, 1.0]
    losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 1.6]  # evaluations 6 and 7 do not improve: patience 2 runs out at 7
    solved = list(zip(accuracies, losses))
    never = falling([0.5] * 20)
    with pytest.MonkeyPatch.context() as patch:
        scripted_evaluations(patch, [solved, never])
        first, beside = train_runs(cfg, "mqar", "residual", "standard", [(0.01, 0), (0.003, 1)], torch.device("cpu"))
        scripted_evaluations(patch, [solved])
        (patient,) = train_runs(
            dataclasses.replace(cfg, solved_accuracy=None),
            "mqar",
            "residual",
            "standard",
            [(0.01, 0)],
            torch.device("cpu"),
        )
        scripted_evaluations(patch, [never])
        (alone,) = train_runs(cfg, "mqar", "residual", "standard", [(0.003, 1)], torch.device("cpu"))
    assert first.progress["stopped"] == "solved" and patient.progress["stopped"] == "patience"
    assert first.progress["steps_run"] == patient.progress["steps_run"] == 14
    assert first.progress["best_step"] == 10 and first.final == {"val_loss": 1.0, "val_token_acc": 1.0}
    assert first.final == patient.final and first.progress == {**patient.progress, "stopped": "solved"}
    for name, weight in patient.state.items():  # evaluation 5's weights, not evaluation 7's
        torch.testing.assert_close(first.state[name], weight, rtol=0, atol=5e-5)
    assert beside.progress["stopped"] == "step_limit" and beside.progress == alone.progress
    for name, weight in alone.state.items():
        torch.testing.assert_close(beside.state[name], weight, rtol=0, atol=5e-5)


def test_a_run_still_improving_at_max_steps_trains_on_to_max_steps_extended_at_the_last_lr():
    """patience never met: the run goes past max_steps (20) to max_steps_extended (35, a logged step at the
    limit too), at the schedule's last lr; the same run without extension stops at 20, and both runs'
    first 20 steps are the same run (the schedule up to max_steps does not change)."""
    cfg = dataclasses.replace(CELL, max_steps=20, log_every=10, patience=100, schedule="cosine", warmup=0.1)
    device = torch.device("cpu")
    (plain,) = train_runs(cfg, "mqar", "residual", "standard", [(0.01, 0)], device)
    assert plain.progress["steps_run"] == 20 and plain.progress["at_step_limit"]
    extended = dataclasses.replace(cfg, max_steps_extended=35)
    (run,) = train_runs(extended, "mqar", "residual", "standard", [(0.01, 0)], device)
    rows, progress, plain = run.rows, run.progress, plain.rows
    assert [row["step"] for row in rows] == [10, 20, 30, 35] and progress["steps_run"] == 35
    assert progress["at_step_limit"] and rows[:2] == plain
    factor = schedule(extended)
    assert factor(19) > 0 and factor(20) == 0.0 == factor(34)  # cosine ends at 0 at max_steps and stays there
    patient = dataclasses.replace(extended, patience=1, min_delta=100.0)  # patience met at max_steps: no extension
    (run,) = train_runs(patient, "mqar", "residual", "standard", [(0.01, 0)], device)
    assert run.progress["steps_run"] == 20 and not run.progress["at_step_limit"]


def test_sample_efficiency_is_the_first_logged_step_at_the_accuracy():
    rows = [
        {"step": 50, "val_token_acc": 0.5},
        {"step": 100, "val_token_acc": 0.95},
        {"step": 150, "val_token_acc": 0.991},
    ]
    assert (first_step(rows, 0.9), first_step(rows, 0.99)) == (100, 150) and math.isnan(first_step(rows[:2], 0.99))
