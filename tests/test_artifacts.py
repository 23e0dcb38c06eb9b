"""Every file a job writes for later jobs proves what it is (uph.artifacts): the SVD basis and the fit
stage's tables record the model and the config keys they were built from, and a reader refuses a
damaged or foreign one in one line naming the file and how to rebuild it."""

import os
import shutil

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake
from test_reliability import LM_TABLES, assert_tables_equal_the_reference, copy_study, truncate, vouch_for

from uph.artifacts import ATTENTION_RUN, COPY_TASK_RUN, FEEDBACK_RUN, FIT_FILE, ROLES_FILE, job_record, write_recorded
from uph.config import EXTRACT_KEYS, job_params, validate
from uph.errors import ArtifactError
from uph.lm.data.basis import load_basis, save_basis, top_singular_triplets
from uph.lm.data.cache import read_users
from uph.lm.data.models import read_output_layer
from uph.model_identity import IDENTITY, read_identity

FIX = "; delete it and run snakemake again"


def weights_sha256(model_dir) -> str:
    return read_identity(model_dir)["weights_sha256"]


def write_basis(model_dir, path):
    """The SVD basis (rank 8) of the tiny model in `model_dir`, as the svd_basis job writes it."""
    save_basis(path, *top_singular_triplets(read_output_layer(model_dir).W, 8), weights_sha256(model_dir))


def test_a_basis_of_another_model_or_a_truncated_one_is_refused(tiny_model_dir, tmp_path):
    llama, gpt2 = tiny_model_dir("llama"), tiny_model_dir("gpt2")  # same vocabulary and hidden size
    path = tmp_path / "svd.safetensors"
    write_basis(gpt2, path)
    U, S, Vh = load_basis(path, weights_sha256(gpt2))
    assert U.shape == (read_output_layer(gpt2).W.shape[0], 8) and S.shape == (8,) and Vh.shape == (8, 64)
    with pytest.raises(ArtifactError) as error:
        load_basis(path, weights_sha256(llama))
    assert str(error.value) == (
        f"SVD basis '{path}' was built for something else: weights_sha256={weights_sha256(gpt2)!r} (expected "
        f"{weights_sha256(llama)!r}){FIX} (the svd_basis job rebuilds it)"
    )
    truncate(path)
    with pytest.raises(ArtifactError, match=r"^SVD basis '.*' is damaged or truncated \(.*\); delete it and run"):
        load_basis(path, weights_sha256(gpt2))


def test_fit_files_are_refused_when_damaged_or_built_for_another_model_or_config(tiny_model_dir, tmp_path):
    llama, gpt2 = tiny_model_dir("llama"), tiny_model_dir("gpt2")
    fit = {"radii": [0.5, 5.0], "heads": ["cvh"]}
    record = job_record(llama / IDENTITY, fit=fit, extract={"context": 64})
    table = pd.DataFrame({"user": ["a", "b"], "capacity": [0.5, 5.0], "theta": [[1.0, 2.0], [3.0, 4.0]]})
    path = tmp_path / "capacity.parquet"
    write_recorded(table, path, record)
    pd.testing.assert_frame_equal(FIT_FILE.read_table(path, record), table)
    # a reader checks the keys both name: this one never reads fit.radii, and reads a key the file has not
    reader = job_record(llama / IDENTITY, fit={"heads": ["cvh"], "on_cache": []})
    pd.testing.assert_frame_equal(FIT_FILE.read_table(path, reader), table)

    def refusal(expect) -> str:
        with pytest.raises(ArtifactError) as error:
            FIT_FILE.read_table(path, expect)
        return str(error.value)

    assert refusal(job_record(llama / IDENTITY, fit={**fit, "radii": [5.0]})) == (
        f"fit file '{path}' was built for something else: fit.radii=[0.5, 5.0] (expected [5.0]){FIX}"
    )
    assert refusal(job_record(gpt2 / IDENTITY, fit=fit)).startswith(
        f"fit file '{path}' was built for something else: weights_sha256={weights_sha256(llama)!r}"
    )
    table.to_parquet(path)  # rewritten by hand: the values look fine, the record is gone
    assert refusal(record) == f"fit file '{path}' has no readable uph metadata: not a fit file of this suite{FIX}"
    write_recorded(table, path, record)
    truncate(path)
    assert refusal(record).startswith(f"fit file '{path}' is damaged or truncated (")
    path.unlink()
    assert refusal(record) == f"fit file '{path}' does not exist; run snakemake again"


def keep_mtime(path, damage):
    """Damage at rest: the file changes, its mtime does not, so snakemake takes it for up to date."""
    stat = path.stat()
    damage(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def error_lines(run, rule: str) -> list[str]:
    return [line.split(f" {rule} ERROR ")[1] for line in run.stderr.splitlines() if f" {rule} ERROR " in line]


def test_a_foreign_basis_or_a_truncated_fits_file_stops_the_job_that_reads_it(tiny_study, tiny_model_dir, tmp_path):
    """In a copy of the tiny study: the basis of another model (same shapes: used silently before), then
    a truncated fits.parquet (a traceback before), each stops its reader in one line; tables untouched."""
    workdir = copy_study(tiny_study, tmp_path)
    basis = workdir / "results/basis/svd.safetensors"
    keep_mtime(basis, lambda path: write_basis(tiny_model_dir("gpt2"), path))
    vouch_for(workdir, "results/basis/svd.safetensors")  # else the svd_basis job, its record's, reruns
    run = snakemake(workdir, "--forcerun", "fit_global", *LM_TABLES)
    assert run.returncode != 0
    assert set(error_lines(run, "fit_global")) == {  # each method's job that ran says it
        "SVD basis 'results/basis/svd.safetensors' was built for something else: weights_sha256="
        f"{weights_sha256(tiny_model_dir('gpt2'))!r} (expected {weights_sha256(workdir / 'results/model')!r})"
        f"{FIX} (the svd_basis job rebuilds it)"
    }
    assert_tables_equal_the_reference(workdir, tiny_study)

    workdir = copy_study(tiny_study, tmp_path / "truncated")
    keep_mtime(workdir / "results/fit/job~0/fits.parquet", truncate)
    vouch_for(workdir, "results/fit/job~0/fits.parquet")
    run = snakemake(workdir, "--forcerun", "fit_others", *LM_TABLES)
    assert run.returncode != 0
    [line] = set(error_lines(run, "fit_others"))  # each fit_others block that ran says it
    assert line.startswith("fit file 'results/fit/job~0/fits.parquet' is damaged or truncated (")
    assert line.endswith(FIX)
    assert_tables_equal_the_reference(workdir, tiny_study)


def test_a_truncated_corpus_or_training_file_is_one_line_naming_its_job(tiny_study, tmp_path):
    """The files with no record (the corpus's tables, the training jobs' runs) were read by pandas, so a
    truncated one was a pyarrow traceback; now each reader names the file and the job that rebuilds it."""
    results, config = tiny_study.workdir / "results", yaml.safe_load((REPO / "config/test.yaml").read_text())
    validate(config)
    users = tmp_path / "users.parquet"
    shutil.copy(results / "corpus/users.parquet", users)
    truncate(users)
    with pytest.raises(ArtifactError) as error:  # the fit jobs' reader, before any shard
        read_users(
            sorted((results / "cache").glob("shard-*.parquet")),
            results / "model",
            users,
            job_params(config["extract"], EXTRACT_KEYS),
        )
    assert str(error.value).startswith(f"users table '{users}' is damaged or truncated (")
    assert str(error.value).endswith(f"{FIX} (the corpus job rebuilds it)") and "\n" not in str(error.value)
    runs = {
        ROLES_FILE: (results / "corpus/roles.parquet", "corpus_roles"),
        ATTENTION_RUN: (next(results.glob("attention/**/eval.parquet")), "attention_train"),
        COPY_TASK_RUN: (next(results.glob("copy_task/**/curves.parquet")), "copy_task_train"),
        FEEDBACK_RUN: (next(results.glob("feedback/**/curves.parquet")), "feedback_train"),
    }
    for artifact, (source, job) in runs.items():
        path = tmp_path / source.name
        shutil.copy(source, path)
        assert len(artifact.read_parquet(path)) > 0
        truncate(path)
        with pytest.raises(ArtifactError, match=rf"is damaged or truncated \(.*\){FIX} \(the {job} job rebuilds it\)$"):
            artifact.read_parquet(path)
