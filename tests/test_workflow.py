"""The Snakemake DAG on the tiny config, through the snakemake command line."""

import ast
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from conftest import REPO, SNAKEMAKE, files_under, snakemake, without_modules

from uph.config import schema_defaults, validate
from uph.report.answers import point_label
from uph.report.catalog import TABLES
from uph.report.study import best_beyond_global

RADII = yaml.safe_load((REPO / "config/test.yaml").read_text())["fit"]["radii"]
LAMBDAS = schema_defaults("fit")["lambdas"]
TEMPERATURES = schema_defaults("fit")["temperatures"]
CACHES = ("unigram", "neural_cache")  # the cache baselines: a mixture weight, no theta


def test_the_tiny_study_runs_end_to_end(tiny_study):
    assert tiny_study.run.returncode == 0, tiny_study.run.stderr[-3000:]
    for stage in ("cache/shard-0.parquet", "cache/shard-1.parquet", "basis/svd.safetensors", "provenance.json"):
        assert (tiny_study.workdir / "results" / stage).is_file(), stage
    users = pd.read_parquet(tiny_study.workdir / "results/corpus/users.parquet")
    assert len(users) == 4 and (users["n_tokens"] <= 4000).all()
    assert not list((tiny_study.workdir / "results").rglob(".tmp-*"))


def test_fit_tables_cover_the_sweep(tiny_study):
    workdir, run = tiny_study.workdir, tiny_study.run
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_csv(workdir / "results/tables/personalization.csv")
    heads, baselines = table[table["alpha"].notna()], table[table["alpha"].isna()]
    on_cache = heads[heads["control"] == "cache+head"]  # fit.on_cache: svd_uncond, exact
    assert list(zip(on_cache["head"], on_cache["solver"], on_cache["reference"])) == [("svd_uncond", "exact", "cache")]
    assert on_cache["capacity"].isin(RADII).all() and on_cache["fit_certificate_max"].notna().all()
    unigram = baselines[(baselines["head"] == "unigram") & (baselines["control"] == "global+personal")]
    assert on_cache["base_nll"].iloc[0] == pytest.approx(unigram["nll"].iloc[0], rel=1e-5)  # the cache's own NLL
    cache = heads[heads["control"].str.startswith("cache")]
    assert set(cache["control"]) == {"cache+head", "cache others", "cache own vs others"}  # with its others
    assert set(cache["reference"]) == {"cache", "cache_others"} and (cache["head"] == "svd_uncond").all()
    neural = heads[heads["control"].str.startswith("neural cache")]  # fit.on_cache: svd_cvh on the neural cache
    assert set(neural["control"]) == {"neural cache+head", "neural cache others", "neural cache own vs others"}
    assert (neural["head"] == "svd_cvh").all() and (neural["solver"] == "exact").all()
    heads = heads[~heads["control"].str.contains("cache")]
    assert len(heads) == 5 * 1 * 1 * 2 * 5  # heads x alphas x ds x solvers x controls of config/test.yaml
    assert set(heads["control"]) == {"global", "personal", "global+personal", "others", "own vs others"}
    assert set(heads.groupby("control")["reference"].unique().map(tuple)) == {("base",), ("global",), ("others",)}
    arms = ["global", "global+personal", "personal"]
    assert sorted(baselines.groupby(["head", "solver"])["control"].apply(sorted).items()) == [
        (("full_bias", "adam"), sorted([*arms, "others", "own vs others"])),
        (("full_bias", "exact"), sorted([*arms, "others", "own vs others"])),
        (("neural_cache", "exact"), sorted([*arms, "others", "own vs others"])),  # others: a same-size store
        (("unigram", "exact"), arms),  # the unigram's capacity is a mixture weight: no theta to hand to others
    ]
    assert (table["n_users"] == 4).all() and (heads["params_per_user"] == 8).all()
    # every arm's capacity was chosen on the grid, at its end only if flagged so
    fitted = table[table["capacity"].notna()]
    grid = {**dict.fromkeys(["full_bias", *heads["head"]], set(RADII)), **dict.fromkeys(CACHES, set(LAMBDAS))}
    assert all(capacity in grid[head] for head, capacity in zip(fitted["head"], fitted["capacity"]))
    neural = fitted[fitted["head"] == "neural_cache"]
    assert len(neural) == 3 and neural["temperature"].isin(TEMPERATURES).all()
    assert fitted[fitted["head"] != "neural_cache"]["temperature"].isna().all()
    edges = {edge for flags in fitted["at_edge"].fillna("") for edge in flags.split(", ")}
    assert edges <= {"", "low", "high", "low temperature", "high temperature"}
    beyond = heads[heads["control"] == "global+personal"]
    assert (beyond["sum_theta_norm"] > 0).all()
    numbers = heads.drop(columns=["sum_theta_norm", "temperature"]).select_dtypes("number")  # T: the neural cache's
    controls = heads["control"].isin(["others", "own vs others"])  # comparisons of scores: no fit of their own
    own_fit = ["kl", "fit_objective", "fit_certificate_max", "frac_on_ball", "capacity"]
    finite = numbers[~controls].abs().lt(float("inf")), numbers[controls].drop(columns=own_fit).abs().lt(float("inf"))
    assert all(frame.all().all() for frame in finite) and numbers[controls][own_fit].isna().all().all()
    assert (table["delta_nll_ci_low"] <= table["delta_nll"]).all()
    assert (table["delta_nll"] <= table["delta_nll_ci_high"]).all()
    assert table["sign_test_p"].between(0, 1).all()
    personal = heads[heads["control"] == "personal"]
    exact = personal[personal["solver"] == "exact"].set_index("head")
    adam = personal[personal["solver"] == "adam"].set_index("head")
    assert (exact["fit_objective"] <= adam["fit_objective"] + 1e-9).all()
    dose = pd.read_csv(workdir / "results/tables/dose_response.csv")
    assert list(dose["train_tokens"].iloc[:2]) == [512, 1024] and dose["all_train_tokens"].tolist() == [
        False,
        False,
        True,
    ]
    cross = pd.read_csv(workdir / "results/tables/cross_user.csv")
    assert {"theta_user", "text_user", "global_nll", "delta_nll"} <= set(cross.columns)
    matrices = cross.groupby(["head", "alpha", "d", "solver"]).size()
    headline, _ = best_beyond_global(table)  # the point the summary reports gets its matrix too
    assert (matrices == 16).all() and ("svd_cvh", 1.0, 8, "exact") in matrices.index
    assert (headline["head"], headline["alpha"], headline["d"], headline["solver"]) in matrices.index
    assert f"at {point_label(headline)}" in (workdir / "results/summary.md").read_text()
    own = cross[(cross["head"] == "svd_cvh") & (cross["theta_user"] == cross["text_user"])].set_index("text_user")
    beyond = heads[
        (heads["control"] == "global+personal") & (heads["head"] == "svd_cvh") & (heads["solver"] == "exact")
    ]
    # the diagonal is the headline, to the tables' rounding (%.6g of each user's value)
    assert own["delta_nll"].mean() == pytest.approx(beyond["delta_nll"].iloc[0], rel=1e-5)
    for suffix in (".md", ".tex"):
        assert (workdir / "results/tables" / f"personalization{suffix}").stat().st_size > 0


def test_second_run_does_nothing(tiny_study):
    start = time.perf_counter()
    again = snakemake(tiny_study.workdir)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    assert time.perf_counter() - start < 30


def test_the_dag_build_imports_neither_torch_nor_matplotlib(tiny_study, tmp_path):
    """Every snakemake call and every job parses the Snakefile: it reads only light modules. Here a
    torch or matplotlib import anywhere in the DAG build fails it."""
    env = without_modules(tmp_path, "torch", "matplotlib", where="the DAG build")
    start = time.perf_counter()
    run = snakemake(tiny_study.workdir, "-n", env=env)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Nothing to be done" in run.stdout + run.stderr
    assert seconds < 10  # about 1.5 s on an idle 2-core machine (docs/performance.md); loaded CI machines vary


# the jobs that read tables only, with capacity and headline_point on the language-model chain's path
TORCH_FREE_SCRIPTS = (
    "model",
    "corpus_roles",
    "fit_capacity",
    "fit_headline",
    "fit_tables",
    "copy_task_table",
    "attention_table",
    "feedback_table",
    "aggregate",
    "provenance",
)


def test_the_jobs_that_read_tables_start_without_torch(tmp_path):
    """A job pays its script's module-level imports before its work, torch 0.8 s of them (docs/performance.md):
    those of the scripts that only read tables run here, one after another in one interpreter, with torch
    unimportable (a failed import is not cached: each script that reaches torch fails); a script that
    computes with torch (fit) is refused, so the block holds."""
    env = without_modules(tmp_path, "torch", where="the imports of a table job")
    program = ["failed = []"]
    for name in (*TORCH_FREE_SCRIPTS, "fit"):
        tree = ast.parse((REPO / "workflow_scripts" / f"{name}.py").read_text())
        lines = [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        program += [
            "try:",
            *(f"    {line}" for line in lines),
            f"except ImportError as error:\n    failed.append(({name!r}, str(error)))",
        ]
    program.append("print(failed)")
    run = subprocess.run([sys.executable, "-c", "\n".join(program)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-800:]
    assert run.stdout.strip() == str([("fit", "the imports of a table job imported torch")])


def test_dry_run_of_the_default_config_lists_the_stages(tmp_path):
    run = snakemake(tmp_path, "-n", config="config.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    for rule in ("corpus_roles", "model", "corpus", "extract", "svd_basis"):
        assert f"rule {rule}:" in run.stdout or f"\n{rule} " in run.stdout, rule


def test_the_default_starts_the_attention_cells_of_its_split_kinds_first(tmp_path):
    """Their cells train about three times the runs of another: on 2 cores, one left to start last ran alone
    for eight minutes of a cold default. Their lr jobs (attention_lr, theirs alone) start first too. Every
    other attention job keeps priority 0 (no priority line)."""
    run = snakemake(tmp_path, "-n", "--forceall", config="config.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    attention = validate(yaml.safe_load((REPO / "config.yaml").read_text()))["attention"]
    priorities = {}
    for rule in ("attention_lr", "attention_train"):
        for block in run.stdout.split(f"\nrule {rule}:\n")[1:]:
            lines = block.split("\n[")[0]  # up to the next job's timestamp
            kind = re.search(r"attention~(\w+)/task~", lines).group(1)
            found = re.search(r"^    priority: (\d+)$", lines, re.M)
            priorities.setdefault((rule, kind), []).append(int(found.group(1)) if found else 0)
    split_kinds = attention["split_kinds"]
    assert split_kinds and {kind for rule, kind in priorities if rule == "attention_lr"} == set(split_kinds)
    assert priorities == {
        (rule, kind): [5 if kind in split_kinds else 0]
        * len(attention["tasks"])
        * (len(attention["lrs"]) if rule == "attention_lr" else 1)
        for rule, kind in priorities
    }


def test_bad_config_fails_at_dag_build_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["extract"]["shards"] = -1
    bad.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(bad), "-n"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "config key 'extract.shards': -1 is less than the minimum of 1" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_two_clean_runs_give_identical_tables_figures_and_summary(tiny_study, second_run):
    """On CPU (config/test.yaml's device) two runs give the same bytes, the second through sbatch where SLURM
    is installed (conftest.second_run). On CUDA (uph.device) the LM tables would repeat bit for bit only with
    the same GPU model and software stack (deterministic kernels), and the training branches' tables, should
    their `<branch>.device` put them there, only to a tolerance."""
    assert tiny_study.run.returncode == 0, tiny_study.run.stderr[-3000:]
    assert second_run.run.returncode == 0, second_run.run.stderr[-3000:]
    first, second = files_under(tiny_study.workdir), files_under(second_run.workdir)
    assert sorted(first) == sorted(second)
    assert sum(path.endswith(".csv") for path in first) == len(TABLES)
    # feedback.csv measures each method's seconds per step in the run: all else is identical
    timed = {f"results/tables/feedback{suffix}" for suffix in (".csv", ".md", ".tex")}
    assert [path for path in first if first[path] != second[path] and path not in timed] == []
    tables = [
        pd.read_csv(root / "results/tables/feedback.csv").drop(columns="seconds_per_step")
        for root in (tiny_study.workdir, second_run.workdir)
    ]
    pd.testing.assert_frame_equal(*tables)
