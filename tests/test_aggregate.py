"""The aggregate stage: figures, summary, provenance and report of the tiny study, reruns from the
tables alone, determinism of two clean runs, and the summary's findings on hand-made tables."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import fields

import matplotlib.image
import numpy as np
import pandas as pd
from conftest import REPO, snakemake

from uph.report.catalog import FIGURES, TABLES
from uph.report.figures import pixel_size
from uph.report.provenance import config_seeds, git_state
from uph.report.study import Study
from uph.report.summary import (
    cross_user_finding,
    dose_response_finding,
    feedback_finding,
    personalization_finding,
    solver_gap_finding,
)

OUTPUTS = ["results/tables", "results/figures", "results/summary.md"]


def files_under(root, parts=OUTPUTS) -> dict:
    """relative path -> bytes of every file under `parts` of `root`."""
    paths = [p for part in parts for p in ([root / part] if (root / part).is_file() else (root / part).rglob("*"))]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths if p.is_file()}


def test_two_clean_runs_give_identical_tables_figures_and_summary(tiny_study, tmp_path):
    assert tiny_study.rest.returncode == 0, tiny_study.rest.stderr[-3000:]
    again = snakemake(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    first, second = files_under(tiny_study.workdir), files_under(tmp_path)
    assert sorted(first) == sorted(second)
    assert sum(path.endswith(".csv") for path in first) == len(TABLES)
    # feedback.csv measures each method's seconds per step in the run (issue 17): all else is identical
    timed = {f"results/tables/feedback{suffix}" for suffix in (".csv", ".md", ".tex")}
    assert [path for path in first if first[path] != second[path] and path not in timed] == []
    tables = [
        pd.read_csv(root / "results/tables/feedback.csv").drop(columns="seconds_per_step")
        for root in (tiny_study.workdir, tmp_path)
    ]
    pd.testing.assert_frame_equal(*tables)


def test_every_figure_is_a_nonempty_image_of_its_paper_size(tiny_study):
    figures = tiny_study.workdir / "results/figures"
    for name, spec in FIGURES.items():
        image = matplotlib.image.imread(figures / f"{name}.png")
        width, height = pixel_size(name)
        assert image.shape[:2] == (height, width), name
        ink = (image[..., :3] < 0.9).any(axis=-1).mean()  # share of pixels that are not near-white
        assert 0.01 < ink < 0.6, (name, ink)
        pdf = (figures / f"{name}.pdf").read_bytes()
        assert pdf.startswith(b"%PDF") and len(pdf) > 5000, name
        box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", pdf)
        assert np.allclose([float(box[1]), float(box[2])], np.array(spec.size) * 72), name


def test_summary_links_every_figure_and_table_with_a_finding(tiny_study):
    results = tiny_study.workdir / "results"
    summary = (results / "summary.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", summary)
    for name in FIGURES:
        assert f"figures/{name}.png" in links and f"figures/{name}.pdf" in links
    assert all((results / link).is_file() for link in links if link != "report.html")
    table = pd.read_csv(results / "tables/personalization.csv")
    beyond = table[(table["control"] == "global+personal") & (table["solver"] == "exact")]
    best = beyond.nsmallest(1, "delta_nll").iloc[0]
    assert f"({best['head']} at α = {best['alpha']:g}, d = {best['d']:g}, exact solver)" in summary
    assert f"NLL by {best['delta_nll'] * 1e3:+.2f} (95 % CI {best['delta_nll_ci_low'] * 1e3:+.2f}" in summary


def test_provenance_records_the_run(tiny_study):
    results = tiny_study.workdir / "results"
    record = json.loads((results / "provenance.json").read_text())
    identity = json.loads((results / "model/identity.json").read_text())
    assert record["model"]["weights_sha256"] == identity["weights_sha256"]
    assert record["config"]["model"]["source"] == "tiny:llama" and record["config"]["fit"]["bootstrap"] == 1000
    assert record["seeds"] == {
        "attention.seeds": [0, 1],
        "copy_task.seeds": [0],
        "feedback.seeds": [0],
        "fit.basis_seed": 42,
    }
    assert re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"])
    assert record["packages"]["torch"].startswith("2.13") and record["packages"]["snakemake"] == "9.27.1"
    assert record["device"] and record["host"]
    wall = record["wall_seconds_per_rule"]
    # each benchmark file counts for the rule that wrote it, also where names share a prefix (fit-global, fit-shard~*)
    assert wall["fit"]["jobs"] == 2 and wall["fit_global"]["jobs"] == 1 and wall["cross_user"]["jobs"] == 1
    assert wall["extract"]["jobs"] == 2 and wall["copy_task_train"]["jobs"] == 2 and wall["feedback_train"]["jobs"] == 4
    assert "aggregate" in wall and "provenance" not in wall  # its own benchmark is written after it
    assert all(entry["seconds"] > 0 for entry in wall.values())


def test_figures_are_redrawn_from_the_tables_alone_and_reported(tiny_study, tmp_path):
    """`--forcerun aggregate` with the model weights and the hidden-state cache gone, then the report."""
    workdir = tmp_path / "copy"
    shutil.copytree(tiny_study.workdir, workdir, symlinks=True)
    (workdir / "results/model/model.safetensors").unlink()
    shutil.rmtree(workdir / "results/cache")
    shutil.rmtree(workdir / "results/figures")
    (workdir / "results/summary.md").unlink()
    run = snakemake(
        workdir,
        "--forcerun",
        "aggregate",
        "--allowed-rules",
        "aggregate",
        "provenance",
        "--",
        "results/summary.md",
        "results/provenance.json",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert files_under(workdir, ["results/figures", "results/summary.md"]) == files_under(
        tiny_study.workdir, ["results/figures", "results/summary.md"]
    )
    report = snakemake(workdir, "--report", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "ERROR" not in report.stderr  # captions are valid reStructuredText
    html = (tmp_path / "report.html").read_text()
    assert all(f"{name}.png" in html for name in FIGURES) and "provenance.json" in html


# --- findings on hand-made tables -----------------------------------------------------------------


def study(**frames) -> Study:
    empty = {field.name: None for field in fields(Study) if field.name != "copy_task_vocab"}
    return Study(**{**empty, **frames}, copy_task_vocab=8)


def lm_row(head, control, delta, solver="exact", alpha=1.0, d=8, half_width=0.002, objective=3.0) -> dict:
    """A personalization.csv row of 24 users, 18 improved, its interval delta ± half_width."""
    return {
        "model": "m",
        "head": head,
        "alpha": alpha,
        "d": d,
        "solver": solver,
        "control": control,
        "reference": "global" if control == "global+personal" else "base",
        "n_users": 24,
        "delta_nll": delta,
        "delta_nll_ci_low": delta - half_width,
        "delta_nll_ci_high": delta + half_width,
        "n_users_improved": 18,
        "frac_users_improved": 0.75,
        "sign_test_p": 0.023,
        "fit_objective": objective,
        "fit_certificate_max": 1e-7 if solver == "exact" else 1e-3,
    }


def personalization_table(beyond_cvh, beyond_uncond, solvers=("exact",)) -> pd.DataFrame:
    """Heads cvh and uncond at alpha 1, d 8 with their personal gain beyond global as given; global
    -10e-3 and personal -8e-3 (cvh) or -6e-3 (uncond) against base; the unigram (exact only) and
    full_bias (each solver) baselines at -3e-3 and -5e-3."""
    rows = [lm_row("unigram", "personal", -0.003, alpha=np.nan, d=np.nan)]
    for solver in solvers:
        rows.append(lm_row("full_bias", "personal", -0.005, solver=solver, alpha=np.nan, d=np.nan))
        for head, personal, beyond in (("cvh", -0.008, beyond_cvh), ("uncond", -0.006, beyond_uncond)):
            rows += [
                lm_row(head, "global", -0.010, solver),
                lm_row(head, "personal", personal, solver, objective=3.0 + (solver == "adam") * 0.002),
                lm_row(head, "global+personal", beyond, solver),
            ]
    return pd.DataFrame(rows)


def cross_matrix(head, own, other, solver="exact", users=("a", "b", "c")) -> pd.DataFrame:
    """cross_user.csv of one point: delta_nll `own` on the diagonal, `other` elsewhere."""
    return pd.DataFrame(
        [
            {
                "model": "m",
                "head": head,
                "alpha": 1.0,
                "d": 8,
                "solver": solver,
                "theta_user": u,
                "text_user": v,
                "delta_nll": own if u == v else other,
            }
            for u in users
            for v in users
        ]
    )


def test_personalization_finding_states_the_answer_from_the_numbers():
    line = personalization_finding(
        study(
            personalization=personalization_table(-0.004, -0.001), cross_user=cross_matrix("cvh", -0.01, 0.0).iloc[:0]
        )
    )
    assert "help beyond domain adaptation? yes: at the best of 2 points (cvh at α = 1, d = 8, exact solver)" in line
    assert (
        "NLL by -4.00 (95 % CI -6.00 to -2.00) × 10⁻³ nats/token, 18 of 24 users improved, sign test p = 0.023" in line
    )
    assert "1 of 2 points have an interval excluding 0 (1 below, 0 above)" in line
    assert "global θ -10.00 (95 % CI -12.00 to -8.00), personal θ -8.00" in line
    assert "the best head (cvh at α = 1, d = 8) -8.00 (95 % CI -10.00 to -6.00) vs the baselines unigram -3.00" in line
    assert "full_bias -5.00" in line and "No cross-user point at the exact solver" in line
    swapped = personalization_finding(
        study(personalization=personalization_table(-0.001, -0.004), cross_user=cross_matrix("cvh", 0, 0).iloc[:0])
    )
    assert "? yes: at the best of 2 points (uncond at α = 1" in swapped
    null = personalization_finding(
        study(personalization=personalization_table(0.0005, -0.001), cross_user=cross_matrix("cvh", 0, 0).iloc[:0])
    )
    assert "? no, not distinguishable from 0: at the best of 2 points (uncond" in null
    assert "0 of 2 points have an interval excluding 0" in null
    table = personalization_table(-0.004, -0.001)
    table.loc[table["control"] == "global+personal", "sign_test_p"] = 0.04  # 0.08 after Bonferroni over 2 points
    picked = personalization_finding(study(personalization=table, cross_user=cross_matrix("cvh", 0, 0).iloc[:0]))
    assert "? not shown: the best point's interval excludes 0, but picked from 2 points its sign test gives " in picked
    assert "p = 0.08 after Bonferroni: at the best of 2 points (cvh" in picked
    worse = personalization_finding(
        study(personalization=personalization_table(0.004, 0.005), cross_user=cross_matrix("cvh", 0, 0).iloc[:0])
    )
    assert "? no, it is worse: at the best of 2 points (cvh" in worse and "(0 below, 2 above)" in worse


def test_personalization_finding_quotes_the_headline_solver_and_the_diagonal_dominance():
    table = personalization_table(-0.004, -0.001, solvers=("adam",))  # the unigram baseline is always exact
    line = personalization_finding(study(personalization=table, cross_user=cross_matrix("cvh", -0.01, 0.0, "adam")))
    assert "(cvh at α = 1, d = 8, adam solver)" in line and "unigram -3.00" in line and "full_bias -5.00" in line
    # own theta best on all 3 texts: 1 of the 3! = 6 matchings is as good, p = 1/6 up to permutation noise
    assert (
        "Cross-user residual θs at cvh at α = 1, d = 8: own θ mean rank 1.00 of 3 (chance 2, permutation p = 0.17)"
        in line
    )
    assert "the best on 3 of 3 users' texts (1 by chance)" in line
    elsewhere = personalization_finding(
        study(personalization=table, cross_user=cross_matrix("uncond", 0.01, 0.0, "adam"))
    )
    assert "Cross-user residual θs at uncond at α = 1, d = 8: own θ mean rank 3.00 of 3" in elsewhere
    assert "the best on 0 of 3 users' texts" in elsewhere


def test_cross_user_finding_quotes_the_diagonal_dominance():
    assert "the best on 3 of 3 users' texts" in cross_user_finding(
        study(cross_user=cross_matrix("svd_cvh", -0.02, -0.01))
    )
    line = cross_user_finding(study(cross_user=cross_matrix("svd_cvh", -0.01, -0.02)))
    assert "own residual θ Δ NLL -10.00 vs other users' -20.00 × 10⁻³ nats/token against the global θ" in line
    assert "own θ mean rank 3.00 of 3 (chance 2, permutation p = 1)" in line and "the best on 0 of 3" in line
    assert cross_user_finding(study(cross_user=cross_matrix("svd_cvh", 0, 0).iloc[:0])).startswith(
        "no cross-user point"
    )


def dose_table(deltas, head="cvh", tokens=(256, 512, 1024, 1600.0), everything=3) -> pd.DataFrame:
    """Rows at each train size; row `everything` fits all train tokens (its size the mean count)."""
    return pd.DataFrame(
        [
            {**lm_row(head, "global+personal", delta), "train_tokens": t, "all_train_tokens": i == everything}
            for i, (t, delta) in enumerate(zip(tokens, deltas))
        ]
    )


def test_dose_response_finding_follows_the_numbers():
    table = personalization_table(-0.004, -0.001)
    line = dose_response_finding(
        study(personalization=table, dose_response=dose_table([0.001, -0.001, -0.003, -0.004]))
    )
    assert "beyond the global θ at cvh at α = 1, d = 8 (exact solver): +1.00 (95 % CI -1.00 to +3.00)" in line
    assert (
        "from the first 256 train tokens per user, -4.00 (95 % CI -6.00 to -2.00) from all of them (1600 on average)"
        in line
    )
    assert "the interval lies below 0 at 2 of 4 train sizes, the smallest 1024 tokens" in line
    # a fixed k above the mean count of all train tokens (the full study's 4,096, held by a few users)
    above = dose_table([0.001, -0.001, -0.003, -0.004, -0.007], tokens=(256, 512, 1024, 1600.0, 2048))
    line = dose_response_finding(study(personalization=table, dose_response=above))
    assert "-4.00 (95 % CI -6.00 to -2.00) from all of them (1600 on average)" in line
    flat = dose_response_finding(study(personalization=table, dose_response=dose_table([0.001, 0.0, 0.0, -0.001])))
    assert "the interval lies below 0 at none of the 4 train sizes" in flat
    # no dose-response curve at the headline point: the one with the best gain on all train tokens
    other = pd.concat(
        [dose_table([0.0, 0.0, 0.0, -0.001], "svd_cvh"), dose_table([0.0, 0.0, 0.0, -0.002], "uncond")],
        ignore_index=True,
    )
    assert "at uncond at α = 1" in dose_response_finding(study(personalization=table, dose_response=other))
    assert dose_response_finding(study(personalization=table, dose_response=dose_table([0.0]).iloc[:0])).startswith(
        "no dose"
    )


def test_solver_gap_finding_compares_adam_to_exact():
    line = solver_gap_finding(study(personalization=personalization_table(-0.004, -0.001, solvers=("adam", "exact"))))
    assert (
        "Adam schedule (adam) stops on average 2.00 × 10⁻³ nats above" in line
        and "norm 1.0e-03 (adam) vs 1.0e-07" in line
    )
    assert solver_gap_finding(study(personalization=personalization_table(-0.004, -0.001))).startswith("needs both")


def test_feedback_finding_answers_from_paired_seeds():
    def table(learned):  # per-seed final losses of feedback_learned; the others fixed
        losses = {"backprop": [2.0, 2.1, 2.0], "dfa": [2.5, 2.4, 2.6], "feedback_learned_oracle": [2.2] * 3}
        losses["feedback_learned"] = learned
        rows = [
            {
                "method": method,
                "seed": seed,
                "signal": "node_perturbation" if method == "feedback_learned" else "x",
                "final_loss": loss,
                "mean_alignment": {"backprop": 1.0, "dfa": 0.3}.get(method, 0.6),
            }
            for method, values in losses.items()
            for seed, loss in enumerate(values)
        ]
        return pd.DataFrame(rows)

    curves = pd.DataFrame({"step": [100, 300]})
    line = feedback_finding(study(feedback=table([2.3, 2.3, 2.4]), feedback_curves=curves))
    assert "after 300 steps, mean over 3 seeds: backprop 2.033 < feedback_learned_oracle 2.200" in line
    assert "beat dfa? yes: -0.167 nats/character" in line and "lower on 3 of 3 seeds" in line
    assert "feedback_frozen" not in line  # not run: no claim
    assert "its distance to the oracle feedback_learned_oracle (U trained on the true gradient): +0.133" in line
    worse = feedback_finding(study(feedback=table([2.6, 2.5, 2.7]), feedback_curves=curves))
    assert "beat dfa? no, it is worse: +0.100" in worse
    mixed = feedback_finding(study(feedback=table([2.4, 2.5, 2.7]), feedback_curves=curves))
    assert "beat dfa? no, the interval includes 0" in mixed


def test_provenance_helpers_tolerate_no_git_and_find_every_seed(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert git_state(REPO)["commit"] is not None
    config = {"fit": {"basis_seed": 1, "solvers": ["adam"]}, "copy_task": {"seeds": [0, 1]}, "seed": 3}
    assert config_seeds(config) == {"fit.basis_seed": 1, "copy_task.seeds": [0, 1], "seed": 3}
