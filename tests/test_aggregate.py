"""The aggregate stage: figures, summary, provenance and report of the tiny study, reruns from the
tables alone, determinism of two clean runs, and the summary's findings on hand-made tables."""

from __future__ import annotations

import json
import re
import shutil

import matplotlib.image
import numpy as np
import pandas as pd
from conftest import REPO, snakemake

from uph.report.catalog import FIGURES
from uph.report.figures import pixel_size
from uph.report.provenance import config_seeds, git_state
from uph.report.study import Study
from uph.report.summary import cross_user_finding, feedback_finding, personalization_finding

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
    assert sum(path.endswith(".csv") for path in first) == 5
    assert [path for path in first if first[path] != second[path]] == []


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
    best = table[(table["control"] == "personal") & (table["solver"] == "exact")].nsmallest(1, "delta_nll").iloc[0]
    assert f"best personal head {best['head']} at α = {best['alpha']:g}, d = {best['d']}" in summary
    assert f"{best['delta_nll'] * 1e3:+.2f}" in summary


def test_provenance_records_the_run(tiny_study):
    results = tiny_study.workdir / "results"
    record = json.loads((results / "provenance.json").read_text())
    identity = json.loads((results / "model/identity.json").read_text())
    assert record["model"]["weights_sha256"] == identity["weights_sha256"]
    assert record["config"]["model"]["source"] == "tiny:llama" and record["config"]["fit"]["bootstrap"] == 1000
    assert record["seeds"] == {"copy_task.seeds": [0], "feedback.seeds": [0], "fit.basis_seed": 42}
    assert re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"])
    assert record["packages"]["torch"].startswith("2.13") and record["packages"]["snakemake"] == "9.27.1"
    assert record["device"] and record["host"]
    wall = record["wall_seconds_per_rule"]
    # each benchmark file counts for the rule that wrote it, also where names share a prefix (fit-*-global)
    assert wall["fit"]["jobs"] == 5 * 2 and wall["fit_global"]["jobs"] == 5 and wall["cross_user"]["jobs"] == 1
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
    empty = dict.fromkeys(
        [
            "personalization",
            "cross_user",
            "copy_task",
            "gram_resilience",
            "feedback",
            "copy_task_curves",
            "feedback_curves",
        ]
    )
    return Study(**{**empty, **frames}, copy_task_vocab=8)


def personalization_table(delta_a, delta_b, global_a):
    rows = []
    for head, control, delta in (
        ("cvh", "personal", delta_a),
        ("uncond", "personal", delta_b),
        ("cvh", "global", global_a),
        ("uncond", "global", 0.0),
    ):
        rows.append(
            {
                "model": "m",
                "head": head,
                "alpha": 1.0,
                "d": 8,
                "solver": "exact",
                "control": control,
                "n_users": 4,
                "delta_nll": delta,
                "delta_nll_ci_low": delta - 0.002,
                "delta_nll_ci_high": delta + 0.002,
                "frac_users_improved": 0.75,
            }
        )
    return pd.DataFrame(rows)


def test_personalization_finding_follows_the_numbers():
    line = personalization_finding(study(personalization=personalization_table(-0.010, -0.005, -0.002)))
    assert "best personal head cvh" in line and "-10.00 × 10⁻³" in line and "3 of 4 users" in line
    assert "beats the pooled global θ by 8.00" in line and "2 of 2 sweep points" in line
    swapped = personalization_finding(study(personalization=personalization_table(-0.005, -0.010, -0.002)))
    assert "best personal head uncond" in swapped and "beats the pooled global θ by 10.00" in swapped
    pooled_wins = personalization_finding(study(personalization=personalization_table(-0.010, -0.005, -0.012)))
    assert "domain adaptation" in pooled_wins and "beats" not in pooled_wins


def test_cross_user_finding_counts_texts_where_the_own_theta_is_best():
    def matrix(own, other):
        return pd.DataFrame(
            [
                {
                    "head": "svd_cvh",
                    "alpha": 1.0,
                    "d": 8,
                    "solver": "exact",
                    "theta_user": u,
                    "text_user": v,
                    "delta_nll": own if u == v else other,
                }
                for u in ("a", "b", "c")
                for v in ("a", "b", "c")
            ]
        )

    assert "the own θ is the best on 3 of 3" in cross_user_finding(study(cross_user=matrix(-0.02, -0.01)))
    line = cross_user_finding(study(cross_user=matrix(-0.01, -0.02)))
    assert "the own θ is the best on 0 of 3" in line and "own θ Δ NLL -10.00 vs other users' θ -20.00" in line


def test_feedback_finding_orders_methods_by_loss():
    table = pd.DataFrame(
        {
            "method": ["backprop", "dfa", "feedback_learned"] * 2,
            "seed": [0] * 3 + [1] * 3,
            "final_loss": [2.0, 2.5, 2.2, 2.0, 2.5, 2.3],
            "mean_alignment": [1.0, 0.3, 0.7] * 2,
        }
    )
    line = feedback_finding(study(feedback=table, feedback_curves=pd.DataFrame({"step": [100, 300]})))
    assert "after 300 steps: backprop 2.000 < feedback_learned 2.250 < dfa 2.500" in line
    assert "feedback_learned 0.70, dfa 0.30" in line


def test_provenance_helpers_tolerate_no_git_and_find_every_seed(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert git_state(REPO)["commit"] is not None
    config = {"fit": {"basis_seed": 1, "solvers": ["seed"]}, "copy_task": {"seeds": [0, 1]}, "seed": 3}
    assert config_seeds(config) == {"fit.basis_seed": 1, "copy_task.seeds": [0, 1], "seed": 3}
