"""`make compare` (uph.compare): a regeneration against a reference, on copies of the tiny study's
results with planted differences. In the exact mode (the same numerics) any changed cell of any table is
caught and named; in the statistical mode a difference beyond tolerance is caught and named, one at
rounding level not, and a choice that differs is reported with its margin (a near tie named, a real change
a disagreement); a run that cannot be compared (another config, a provenance or table missing, damaged,
extra or with other columns) exits 2 in one line naming the file. The tolerance is typed here as the module
docstring states it, never imported from the code under test, so a looser one fails these tests."""

from __future__ import annotations

import csv
import json
import shutil

import pandas as pd
import pytest
import torch

from uph.compare import Report, compare_folders, find_reference, lr_choices, main, make_reference
from uph.io import read_table
from uph.tables import TABLES

NLL_RTOL = 1e-5  # of a table's NLL scale: uph/compare.py's docstring


@pytest.fixture
def pair(tiny_study, tmp_path):
    """(results, reference): two copies of the tiny study's tables and provenance (with the config that made
    them), to plant differences in."""
    source = tiny_study.workdir / "results"
    folders = []
    for name in ("results", "reference"):
        folder = tmp_path / name
        shutil.copytree(source / "tables", folder / "tables")
        shutil.copy(source / "provenance.json", folder)
        folders.append(folder)
    return tuple(folders)


def set_config(folder, section, key, value):
    """Change the config in `folder`'s provenance.json: `section`.`key`, or `section` where `key` is None."""
    provenance = json.loads((folder / "provenance.json").read_text())
    if key is None:
        provenance["config"][section] = value
    else:
        provenance["config"][section][key] = value
    (folder / "provenance.json").write_text(json.dumps(provenance))


def edit(folder, name, change) -> pd.DataFrame:
    table = read_table(folder / "tables" / f"{name}.csv")
    change(table)
    table.to_csv(folder / "tables" / f"{name}.csv", index=False)
    return table


def nll_scale(folder) -> float:
    table = read_table(folder / "tables" / "personalization.csv")
    return float(table[["base_nll", "nll"]].abs().max().max())


def test_a_run_agrees_with_itself_and_a_rounding_level_difference_is_not_flagged(pair, capsys):
    results, reference = pair
    assert main([str(results), "--reference", str(reference)]) == 0
    assert "verdict: AGREE (exact)" in capsys.readouterr().out
    tol = NLL_RTOL * nll_scale(reference)

    def nudge(table):  # every NLL moved by half the tolerance: float32 rounding across machines
        for column in ("base_nll", "nll", "delta_nll", "delta_nll_ci_low", "delta_nll_ci_high"):
            table[column] += 0.5 * tol

    edit(results, "personalization", nudge)
    edit(results, "attention", lambda t: t.__setitem__("token_acc", (t["token_acc"] - 0.004).clip(lower=0)))
    assert main([str(results), "--reference", str(reference), "--mode", "statistical"]) == 0
    assert "verdict: AGREE" in capsys.readouterr().out


def test_a_planted_difference_beyond_tolerance_is_caught_and_its_row_printed(pair, capsys):
    results, reference = pair
    tol = NLL_RTOL * nll_scale(reference)
    table = edit(
        results,
        "personalization",
        lambda t: t.__setitem__("delta_nll", t["delta_nll"].where(t.index != 1, t["delta_nll"] + 3 * tol)),
    )
    assert main([str(results), "--reference", str(reference), "--mode", "statistical"]) == 1
    out = capsys.readouterr().out
    row = table.loc[1]
    wrong = [line for line in out.splitlines() if line.startswith("personalization [")]
    assert len(wrong) == 1 and f"head={row['head']}" in wrong[0] and f"control={row['control']}" in wrong[0]
    assert f" delta_nll: {row['delta_nll']:.6g} against {row['delta_nll'] - 3 * tol:.6g} (within" in wrong[0]
    assert "verdict: DISAGREE" in out


def test_seeded_tables_agree_within_their_intervals_and_not_beyond(pair):
    """A cell's every seed moved by far more than its spread disagrees; one seed moved within the spread
    of the others does not."""
    results, reference = pair
    attention = read_table(reference / "tables" / "attention.csv")
    cell = attention.iloc[0][["task", "model", "attention"]]
    in_cell = (attention[["task", "model", "attention"]] == cell).all(axis=1)
    shift = 100 * (float(attention.loc[in_cell, "loss"].max() - attention.loc[in_cell, "loss"].min()) + 1)
    edit(results, "attention", lambda t: t.__setitem__("loss", t["loss"].where(~in_cell, t["loss"] + shift)))
    lines = compare_folders(results, reference, mode="statistical").disagreements
    assert lines and all(line.startswith(f"attention [task={cell['task']}") and " loss: " in line for line in lines)
    feedback = read_table(reference / "tables" / "feedback.csv")
    method = feedback["method"].iloc[0]
    shutil.copy(reference / "tables" / "attention.csv", results / "tables" / "attention.csv")
    first = feedback.index[feedback["method"] == method][0]
    edit(
        results,
        "feedback",
        lambda t: t.__setitem__("final_loss", t["final_loss"].where(t.index != first, t["final_loss"] + 1e-3)),
    )
    assert compare_folders(results, reference, mode="statistical").disagreements == []


def test_a_radius_chosen_otherwise_reads_as_a_near_tie_or_a_real_change_by_its_margin(pair):
    results, reference = pair
    capacity = read_table(reference / "tables" / "capacity.csv")
    chosen = capacity.index[capacity["chosen"]][0]
    group = ["model", "head", "alpha", "d", "solver", "arm", "train_tokens", "temperature"]
    same = (capacity[group].map(str) == capacity.loc[chosen, group].map(str)).all(axis=1)
    other = capacity.index[same & (capacity.index != chosen)][0]

    def move(table, margin):
        table.loc[chosen, "chosen"], table.loc[other, "chosen"] = False, True
        table.loc[other, "validation_nll"] = table.loc[chosen, "validation_nll"] - margin

    tol = NLL_RTOL * max(float(capacity["validation_nll"].abs().max()), 1.0)
    edit(results, "capacity", lambda t: move(t, 0.1 * tol))
    edit(
        reference,
        "capacity",
        lambda t: t.__setitem__(
            "validation_nll", t["validation_nll"].where(t.index != other, t.loc[chosen, "validation_nll"] + 0.1 * tol)
        ),
    )
    report = compare_folders(results, reference, mode="statistical")
    assert len(report.near_ties) == 1 and "a near tie" in report.near_ties[0]
    assert not [line for line in report.disagreements if line.startswith("capacity [")]
    edit(
        results,
        "capacity",
        lambda t: t.__setitem__(
            "validation_nll", t["validation_nll"].where(t.index != other, t.loc[chosen, "validation_nll"] - 100 * tol)
        ),
    )
    report = compare_folders(results, reference, mode="statistical")
    assert not report.near_ties and any("a real change" in line for line in report.disagreements)


def test_another_config_or_a_missing_table_cannot_be_compared(pair, capsys):
    results, reference = pair
    set_config(reference, "fit", "radii", [99.0])
    assert main([str(results), "--reference", str(reference), "--mode", "statistical"]) == 2
    assert "another config: fit.radii: [0.5, 5.0, 50.0] against [99.0]" in capsys.readouterr().out
    shutil.copy(results / "provenance.json", reference)
    (reference / "tables" / "feedback.csv").unlink()
    assert main([str(results), "--reference", str(reference), "--mode", "statistical"]) == 2
    assert f"{reference / 'tables' / 'feedback.csv'}: no such table" in capsys.readouterr().out


def test_the_default_reference_is_the_committed_one_made_with_the_results_settings(tiny_study, pair, tmp_path, capsys):
    """make_reference writes a finished run as a reference (kilobytes: no caches, no weights) that
    find_reference picks for results of the same settings and compare_folders holds them to."""
    results, _ = pair
    references = tmp_path / "committed"
    committed = references / "tiny"
    make_reference(tiny_study.workdir / "results", committed)
    assert sorted(path.name for path in committed.iterdir()) == [
        "answers.md",
        "provenance.json",
        "reference.json",
        "summary.md",
        "tables",
    ]
    assert sum(path.stat().st_size for path in committed.rglob("*")) < 2e6
    with_figures = references / "with-figures"
    make_reference(tiny_study.workdir / "results", with_figures, figures=True)
    figures = sorted(path.name for path in (with_figures / "figures").iterdir())
    assert figures == sorted(path.name for path in (tiny_study.workdir / "results/figures").glob("*.png")) != []
    shutil.rmtree(with_figures)  # find_reference below must find the one reference of these settings
    info = json.loads((committed / "reference.json").read_text())
    assert info["job_seconds"] > 0 and info["torch"].split("+")[0] == torch.__version__.split("+")[0]
    recorded = json.loads((committed / "provenance.json").read_text())
    assert info["machine"] == recorded["machine"] and info["machine"]["cpu"]  # the study's machine, not ours
    assert info["cpu_kernels"] == [torch.backends.cpu.get_cpu_capability()] and info["threads"]
    answers = (committed / "answers.md").read_text()
    assert "| question | answer | rests on | n | figure |" in answers and answers.count("\n| ") >= 3
    assert 0 < info["rules"]["extract"]["cpu_seconds"] and info["cpu_seconds"] > info["rules"]["extract"]["cpu_seconds"]
    assert {"validate", "fit_global", "fit", "fit_others"} <= set(info["rules"])  # the rules, each apart
    assert find_reference(results, references) == committed
    assert compare_folders(results, committed).exit_code == 0
    set_config(results, "fit", "jobs", 3)  # cuts the same computation: the same reference
    set_config(results, "device", None, "cuda")
    assert find_reference(results, references) == committed
    set_config(results, "fit", "alphas", [0.25])
    assert find_reference(results, references) is None
    assert main([str(results)]) == 2  # reference/ holds no reference of the tiny config's settings
    assert "cannot compare (exit 2): no committed reference" in capsys.readouterr().out


def test_a_reference_of_a_run_whose_provenance_predates_cpu_seconds_peak_rss_and_machine_leaves_them_none(
    tiny_study, tmp_path
):
    results = tmp_path / "results"
    shutil.copytree(tiny_study.workdir / "results", results, ignore=shutil.ignore_patterns("cache", "model", "fit"))
    provenance = json.loads((results / "provenance.json").read_text())
    provenance["wall_seconds_per_rule"] = {
        rule: {"jobs": entry["jobs"], "seconds": entry["seconds"]}
        for rule, entry in provenance["wall_seconds_per_rule"].items()
    }
    del provenance["machine"]
    (results / "provenance.json").write_text(json.dumps(provenance))
    make_reference(results, tmp_path / "old")
    info = json.loads((tmp_path / "old" / "reference.json").read_text())
    assert info["job_seconds"] > 0 and info["cpu_seconds"] is None and info["peak_rss_mb"] is None
    assert info["machine"].startswith("not recorded")
    assert (
        {entry["cpu_seconds"] for entry in info["rules"].values()}
        == {None}
        == {e["peak_rss_mb"] for e in info["rules"].values()}
    )


def test_an_lr_chosen_otherwise_is_a_disagreement_with_its_margin_shown():
    """lr_choices: an lr that differs decides every number of its cell, so it disagrees however close its
    margin (the two lrs' validation accuracies paired by sweep seed, shown for each run)."""

    def tables(chosen, acc_low, acc_high):
        cell = {"task": "mqar", "model": "residual", "attention": "triple_capped"}
        attention = pd.DataFrame([{**cell, "lr": chosen, "seed": 0}])
        sweep = pd.DataFrame(
            [
                {**cell, "lr": lr, "seed": s, "val_token_acc": acc[s]}
                for lr, acc in ((0.001, acc_low), (0.01, acc_high))
                for s in range(3)
            ]
        )
        return attention, sweep

    a, sweep_a = tables(0.001, [1.0, 0.44, 1.0], [0.44, 1.0, 1.0])  # 0.81 against 0.81: a coin's toss
    b, sweep_b = tables(0.01, [0.44, 1.0, 0.44], [1.0, 1.0, 0.44])
    report = Report()
    lr_choices(a, b, sweep_a, sweep_b, report)
    assert not report.near_ties and len(report.disagreements) == 1
    assert "lr 0.001 chosen against 0.01" in report.disagreements[0] and "+0.000 [" in report.disagreements[0]
    a, sweep_a = tables(0.001, [1.0, 1.0, 1.0], [0.44, 0.45, 0.43])  # every seed prefers 0.001 by 0.56
    b, sweep_b = tables(0.01, [0.44, 0.45, 0.46], [1.0, 1.0, 0.99])
    report = Report()
    lr_choices(a, b, sweep_a, sweep_b, report)
    assert not report.near_ties and len(report.disagreements) == 1 and "+0.560 [" in report.disagreements[0]


def change_one_cell(path, column: str) -> None:
    """The table at `path` with its first row's `column` changed as text: a number in its fifth or sixth
    printed digit, an empty cell to 1, other text by a letter."""
    with open(path, newline="") as file:
        rows = list(csv.reader(file))
    j = rows[0].index(column)
    try:
        rows[1][j] = f"{float(rows[1][j]) * (1 + 1e-5) + 1e-9:.6g}" if rows[1][j] else "1"
    except ValueError:
        rows[1][j] += "x"
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows(rows)


@pytest.mark.parametrize("name", list(TABLES))
def test_in_exact_mode_any_changed_cell_of_any_table_differs_naming_its_row_and_column(pair, name, capsys):
    """The tiny study against itself has the same numerics: exact mode, where the first row's cells of each
    table, changed one at a time (a number in its last printed digit), each exit 1 naming row and column."""
    results, reference = pair
    table = read_table(reference / "tables" / f"{name}.csv")
    timings = TABLES[name].compared.timings
    for column in [c for c in table.columns if c not in timings][-3:]:
        shutil.copy(reference / "tables" / f"{name}.csv", results / "tables")
        change_one_cell(results / "tables" / f"{name}.csv", column)
        assert main([str(results), "--reference", str(reference)]) == 1, column
        out = capsys.readouterr().out
        line = next(line for line in out.splitlines() if line.startswith(f"{name} row 2 ["))
        assert f"] {column}: " in line and "(exact: the same text)" in line
        assert "verdict: DISAGREE (exact): 1 cells differ" in out


def test_exact_mode_leaves_timings_aside_and_other_numerics_compare_statistically(pair, capsys):
    results, reference = pair
    change_one_cell(results / "tables" / "feedback.csv", "seconds_per_step")
    assert main([str(results), "--reference", str(reference)]) == 0
    assert "verdict: AGREE (exact)" in capsys.readouterr().out
    provenance = json.loads((results / "provenance.json").read_text())
    provenance["machine"]["cpu"] = "Intel(R) Xeon(R) Processor (avx2, avx512f)"
    provenance["machine"]["kernel_settings"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    (results / "provenance.json").write_text(json.dumps(provenance))
    assert main([str(results), "--reference", str(reference)]) == 0
    out = capsys.readouterr().out
    assert "mode: statistical, as numerics differ:" in out and '    CPU: "Intel(R) Xeon(R) Processor' in out
    assert '    kernel caps: {"ATEN_CPU_CAPABILITY": "avx2"} against {}' in out
    assert "verdict: AGREE (statistical)" in out


def rename_column(folder, name):
    table = read_table(folder / "tables" / f"{name}.csv")
    table.rename(columns={table.columns[-1]: "renamed"}).to_csv(folder / "tables" / f"{name}.csv", index=False)


def break_provenance(folder, how: str):
    path = folder / "provenance.json"
    if how == "missing":
        path.unlink()
    elif how == "not JSON":
        path.write_text('{"config": ')
    else:
        provenance = json.loads(path.read_text())
        del provenance["config"]
        path.write_text(json.dumps(provenance))


FAULTS = {  # what is wrong -> (how to plant it in a folder, what the one line says of the file)
    **{
        f"provenance {how}": (lambda f, how=how: break_provenance(f, how), ("provenance.json: ", said))
        for how, said in (
            ("missing", "no such file"),
            ("not JSON", "not JSON"),
            ("without config", "holds no 'config'"),
        )
    },
    **{
        f"a column renamed in {name}": (
            lambda f, name=name: rename_column(f, name),
            (f"tables/{name}.csv: ", "other columns"),
        )
        for name in ("attention", "capacity", "gram_resilience", "attention_curves")
    },
    "a table missing": (
        lambda f: (f / "tables" / "copy_task.csv").unlink(),
        ("tables/copy_task.csv: ", "no such table"),
    ),
    "an extra table": (
        lambda f: shutil.copy(f / "tables" / "feedback.csv", f / "tables" / "extra.csv"),
        ("tables/extra.csv: ", "a table the study does not make"),
    ),
    "a damaged table": (
        lambda f: (f / "tables" / "feedback.csv").write_bytes(b'a,b\n"1,2\n'),
        ("tables/feedback.csv: ", "not a readable table"),
    ),
}


@pytest.mark.parametrize("side", ["results", "reference"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_run_that_cannot_be_compared_exits_2_in_one_line_naming_its_file(pair, fault, side, capsys):
    results, reference = pair
    plant, (file, said) = FAULTS[fault]
    plant(results if side == "results" else reference)
    assert main([str(results), "--reference", str(reference)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 1 and captured.err == "", captured
    assert lines[0].startswith("compare: cannot compare (exit 2): ") and file in lines[0] and said in lines[0]
