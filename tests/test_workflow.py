"""The Snakemake DAG on the tiny config, through the snakemake command line."""
import subprocess
import time

import pandas as pd
import pytest

from conftest import REPO, SNAKEMAKE

LM_TARGETS = ["results/corpus/users.parquet", "results/cache/shard-0.parquet",
              "results/cache/shard-1.parquet", "results/basis/svd.safetensors"]


def snakemake(workdir, *args, config="config/test.yaml"):
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(REPO / config), "--cores", "2", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    start = time.perf_counter()
    run = snakemake(workdir, *LM_TARGETS)
    return workdir, run, time.perf_counter() - start


def test_lm_stages_run_end_to_end_on_the_tiny_config(lm_run):
    workdir, run, seconds = lm_run
    assert run.returncode == 0, run.stderr[-3000:]
    assert seconds < 120
    users = pd.read_parquet(workdir / "results/corpus/users.parquet")
    assert len(users) == 4 and (users["n_tokens"] <= 4000).all()
    assert not list((workdir / "results").rglob(".tmp-*"))


def test_second_run_does_nothing(lm_run):
    workdir, _, _ = lm_run
    start = time.perf_counter()
    again = snakemake(workdir, *LM_TARGETS)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    assert time.perf_counter() - start < 30


def test_dry_run_of_the_default_config_lists_the_stages(tmp_path):
    run = snakemake(tmp_path, "-n", config="config.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    for rule in ("corpus_roles", "model", "corpus", "extract", "svd_basis"):
        assert f"rule {rule}:" in run.stdout or f"\n{rule} " in run.stdout, rule


def test_bad_config_fails_at_dag_build_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "config/test.yaml").read_text().replace("shards: 2", "shards: -1"))
    run = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                          "--configfile", str(bad), "-n"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "config key 'extract.shards': -1 is less than the minimum of 1" in run.stdout + run.stderr
    assert not (tmp_path / "results").exists()
