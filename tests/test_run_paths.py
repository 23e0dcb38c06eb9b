"""A newcomer's paths through the workflow: reruns decided by content alone (the records, profiles/default's
rerun triggers), one run per results folder, settings and targets as a shell gives them."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SNAKEMAKE, snakemake
from test_reliability import config_file, copy_study, job_stats

ROLES = "results/corpus/roles.parquet"


def nothing_to_do(run) -> bool:
    return run.returncode == 0 and "Nothing to be done" in run.stdout


def test_every_command_runs_through_the_default_profile():
    """profiles/default holds what every local run needs, and no key a cluster profile sets otherwise (where
    both set one, the default profile wins): GPU slots, keep-going, rerun-incomplete, and no date trigger."""
    profile = yaml.safe_load((REPO / "profiles/default/config.v8+.yaml").read_text())
    assert profile["resources"]["gpu"] >= 1 and profile["keep-going"] and profile["rerun-incomplete"]
    assert not {"mtime", "code"} & set(profile["rerun-triggers"])
    assert not {"cores", "retries", "executor", "jobs"} & set(profile)
    assert "--profile" not in (REPO / "Makefile").read_text().split("reproduce: setup")[1].split("\n\n")[0]


@pytest.fixture(scope="module")
def study_copy(tiny_study, tmp_path_factory):
    """A copy of the tiny study's working directory as `cp -r` makes it: every file dated anew, in the order
    the copy reached it (so an input may be newer than what was built from it), then the jobs' first inputs
    (the model's identity, the corpus, a cache shard) touched once more."""
    workdir = tmp_path_factory.mktemp("copied") / "study"
    subprocess.run(["cp", "-r", str(tiny_study.workdir), str(workdir)], check=True)
    for path in ("results/model/identity.json", "results/corpus/users.parquet", "results/cache/shard-0.parquet"):
        os.utime(workdir / path)
    return workdir


def test_a_copy_whose_inputs_are_newer_than_their_outputs_plans_no_job(study_copy):
    """Snakemake alone reran 20 jobs of a `cp -r` copy (Updated input files: results/model/identity.json) and
    16 for a touched cache shard: its date trigger runs whatever --rerun-triggers says (uph.records,
    judge_by_content). The records find the same bytes."""
    run = snakemake(study_copy, "-n")
    assert nothing_to_do(run), run.stdout[-3000:]


def test_a_table_edited_to_the_same_size_and_dated_back_is_rebuilt(tiny_study, tmp_path):
    workdir = copy_study(tiny_study, tmp_path)
    table = workdir / "results/tables/feedback.csv"
    stat, text = table.stat(), table.read_text()
    digit = next(i for i, c in enumerate(text) if c in "123456789" and i > text.index("\n"))
    table.write_text(text[:digit] + str(int(text[digit]) % 9 + 1) + text[digit + 1 :])
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert table.stat().st_size == stat.st_size
    run = snakemake(workdir, "-n")
    assert run.returncode == 0 and job_stats(run).get("feedback_table") == 1, run.stdout[-3000:]
    assert "copy_task_table" not in job_stats(run)


@pytest.fixture(scope="module")
def corpus_file_run(tmp_path_factory):
    """corpus_roles run once on a corpus file `users.jsonl` of a fresh working directory (its one job)."""
    workdir = tmp_path_factory.mktemp("corpus-file")
    corpus = workdir / "users.jsonl"
    corpus.write_text(
        "".join(json.dumps({"user_id": f"u{i}", "text": "to be or not to be " * 40}) + "\n" for i in range(4))
    )
    config = config_file(workdir, lambda c: c["corpus"].update(source="users.jsonl"))
    run = snakemake(workdir, ROLES, config=config)
    assert run.returncode == 0, run.stderr[-3000:]
    return workdir, config


@pytest.mark.parametrize("change", ["touched", "./ spelling", "absolute path", "symlink to the same bytes"])
def test_a_corpus_file_of_the_same_bytes_plans_no_job(corpus_file_run, tmp_path, change):
    """corpus.source is validated to one spelling (uph.config.path_as_written) and corpus_roles' settings
    hold the file's content digest (rules/common.smk, corpus_settings): spelled `./users.jsonl` or absolute,
    it once reran 20 jobs in place; touched, or replaced by a symlink to the same bytes, it reran them on a
    copy."""
    made, _ = corpus_file_run
    workdir = tmp_path / "work"
    shutil.copytree(made, workdir, symlinks=True)
    corpus, source = workdir / "users.jsonl", "users.jsonl"
    if change == "touched":
        os.utime(corpus)
    elif change == "./ spelling":
        source = "./users.jsonl"
    elif change == "absolute path":
        source = str(corpus)
    else:
        shutil.move(corpus, workdir / "kept.jsonl")
        corpus.symlink_to(workdir / "kept.jsonl")
        os.utime(corpus)
    config = config_file(tmp_path, lambda c: c["corpus"].update(source=source))
    run = snakemake(workdir, "-n", ROLES, config=config)
    assert nothing_to_do(run), run.stdout[-3000:]


def test_a_changed_byte_of_the_corpus_file_reruns_its_job(corpus_file_run, tmp_path):
    made, config = corpus_file_run
    workdir = tmp_path / "work"
    shutil.copytree(made, workdir, symlinks=True)
    stat = (workdir / "users.jsonl").stat()
    (workdir / "users.jsonl").write_text((workdir / "users.jsonl").read_text().replace("u0", "u9"))
    os.utime(workdir / "users.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))  # dated back too
    run = snakemake(workdir, "-n", ROLES, config=config)
    assert run.returncode == 0 and job_stats(run) == {"corpus_roles": 1}, run.stdout[-3000:]


def test_a_record_replaced_by_a_folder_stops_the_dag_build_in_one_line(study_copy, tmp_path):
    workdir = tmp_path / "study"
    shutil.copytree(study_copy, workdir, symlinks=True)
    record = workdir / "results/records/aggregate/job.json"
    record.unlink()
    record.mkdir()
    run = snakemake(workdir, "-n")
    output = run.stdout + run.stderr  # a dry run prints to stdout
    assert run.returncode != 0
    assert (
        "'results/records/aggregate/job.json' is a folder, where a job writes its record; delete it and run "
        "snakemake again" in output.splitlines()
    ), output[-2000:]
    assert "Traceback" not in output


def test_a_second_run_on_a_folder_in_use_is_refused_before_any_job(study_copy, tmp_path):
    """Two runs on one results folder, from two working directories: Snakemake's lock is per working
    directory, ours per results folder (uph.config.hold_results_folder). The second run stops in one line
    naming the folder, the first run's host and process, before any job, and leaves no lock behind."""
    workdir = tmp_path / "study"
    shutil.copytree(study_copy, workdir, symlinks=True)
    (workdir / "results/summary.md").unlink()  # something to do
    script = "import sys, time; from uph.config import hold_results_folder; hold_results_folder(sys.argv[1])"
    first = subprocess.Popen(
        [sys.executable, "-c", f"{script}; print('held', flush=True); time.sleep(120)", str(workdir / "results")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline().strip() == "held"
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        config = config_file(tmp_path, lambda c: c.update(results=str(workdir / "results")))
        run = snakemake(elsewhere, config=config)
    finally:
        first.kill()
        first.wait()
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.splitlines()[-1].startswith(f"results folder '{workdir}/results' is in use by another run (host ")
    assert f", process {first.pid}); wait for it to end" in run.stderr.splitlines()[-1]
    assert "Traceback" not in run.stderr and not (workdir / "results/summary.md").exists()
    assert not list((elsewhere / ".snakemake/locks").glob("*"))
    again = snakemake(workdir, "results/summary.md")  # the folder is free once the first run ended
    assert again.returncode == 0 and (workdir / "results/summary.md").is_file(), again.stderr[-2000:]


def test_a_nested_command_line_setting_runs_as_a_config_file_would(study_copy):
    """`--config 'fit={radii: [0.5, 5.0]}'`: Snakemake passes the nested values as text ('5.0'), once refused
    with advice the command line could not follow; read as YAML it plans the fit stage for those radii."""
    run = snakemake(study_copy, "-n", "--config", "fit={radii: [0.5, 7.0]}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert job_stats(run).get("fit_global") and job_stats(run).get("extract") is None


def test_a_relative_target_from_another_working_directory_names_the_rules_files(study_copy, tmp_path):
    """From another working directory, with `results=../study/results` and the target spelled the same
    way: the results folder keeps its relative spelling (uph.config.path_as_written), so the target names
    the rules' files (it once gave MissingRuleException)."""
    elsewhere = study_copy.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    command = [
        SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", "-n", "../study/results/tables/personalization.csv",
        "--configfile", str(REPO / "config/test.yaml"), "--config", "results=../study/results",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert nothing_to_do(run), run.stdout[-2000:] + run.stderr[-2000:]
