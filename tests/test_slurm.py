"""Cluster execution: each branch asks for a GPU where its device is cuda, the SLURM profile plans the
cluster example, `make slurm` adds the account and partition to the profile's resources, the second run of the
tiny study went through sbatch by `make slurm` on a one-node SLURM cluster on localhost (conftest.second_run,
tests/slurm_cluster.py), and the profiles retry a job that fails once (UPH_FAIL_ONCE, see uph.logs)."""

import os
import re
import subprocess

import pytest
import yaml
from conftest import REPO, SLURM_PROFILE, make_slurm_command, slurm_profile, snakemake

from uph.config import validate
from uph.device import gpu_visible

DEFAULT_PROFILE = REPO / "profiles/default"  # read by itself for every local run
FIT_STAGE = {
    "fit",
    "fit_global",
    "fit_global_unigram",
    "fit_global_neural_cache",
    "validate",
    "fit_others",
    "cross_user",
    "cross_user_headline",
}
# With `device: cuda` and no `<branch>.device`: extraction and the fit stage ask for a GPU, the training runs do not.
GPU_RULES = {"extract", *FIT_STAGE}
TRAINING_RULES = {"copy_task_train", "attention_lr", "attention_train", "feedback_train"}


def planned_jobs(dry_run: str) -> dict[str, int]:
    """rule -> job count, from the 'Job stats' table of a dry run."""
    table = dry_run.split("Job stats:")[1].split("total")[0]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def planned_resources(dry_run: str) -> dict[str, set[str]]:
    """rule -> the `resources:` lines of its planned jobs."""
    resources = {}
    for rule, line in re.findall(
        r"^rule (\w+):\n(?:    (?!resources).*\n)*    resources: (.*)$", dry_run, re.MULTILINE
    ):
        resources.setdefault(rule, set()).add(line)
    return resources


def planned_gpus(dry_run: str) -> dict[str, set[int]]:
    """rule -> the `gpu` resource of its planned jobs (0 where a job's resources do not name it)."""
    found = {}
    for rule, lines in planned_resources(dry_run).items():
        found[rule] = {int(match[1]) if (match := re.search(r"\bgpu=(\d+)", line)) else 0 for line in lines}
    return found


def test_each_branch_asks_for_a_gpu_where_its_device_is_cuda(tmp_path):
    """The tiny study's dry runs: with `device: cuda` (through the default profile) extraction and the fit
    stage ask for a GPU slot and the training runs do not; with `<branch>.device` keys each branch follows
    its own, auto asking only where this machine could run CUDA (gpu_visible)."""
    run = snakemake(tmp_path / "cuda", "-n", "--config", "device=cuda")
    assert run.returncode == 0, run.stderr[-3000:]
    gpus = planned_gpus(run.stdout)
    assert {rule for rule, counts in gpus.items() if counts == {1}} == GPU_RULES
    assert all(gpus[rule] == {0} for rule in TRAINING_RULES)
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["device"] = "cpu"
    config["extract"]["device"], config["copy_task"]["device"], config["feedback"]["device"] = "cuda", "cuda", "auto"
    (tmp_path / "branches.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(tmp_path / "branches", "-n", config=str(tmp_path / "branches.yaml"))
    assert run.returncode == 0, run.stderr[-3000:]
    gpus = planned_gpus(run.stdout)
    assert gpus["extract"] == gpus["copy_task_train"] == {1}
    assert gpus["feedback_train"] == {int(gpu_visible())} and gpus["attention_train"] == {0}
    assert all(gpus[rule] == {0} for rule in FIT_STAGE)  # fit.device null: the top-level cpu


def planned_threads(dry_run: str) -> dict[str, set[int]]:
    """rule -> the `threads` of its planned jobs (a dry run prints none for a job of one thread)."""
    found = {}
    for rule, threads in re.findall(
        r"^rule (\w+):\n(?:    (?!threads).*\n)*    threads: (\d+)$", dry_run, re.MULTILINE
    ):
        found.setdefault(rule, set()).add(int(threads))
    return found


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_default_on_one_gpu_machine_takes_a_few_rounds_of_its_gpu_slots(tmp_path, device):
    """The default's dry run through the local profile on 16 cores: with device cuda its GPU jobs ask for
    one slot each and need at most 12 rounds of the slots the profile grants (jobs x slots asked / slots;
    58 x 1 / 1 before fit.gpu_jobs), extraction asks for 1 core; with device cpu the layout is the CPU's
    (fit.jobs per-user jobs, extraction on one core, beside the training branches)."""
    slots = yaml.safe_load((DEFAULT_PROFILE / "config.v8+.yaml").read_text())["resources"]["gpu"]
    run = snakemake(
        tmp_path, "-n", "--cores", "16", "--config", f"device={device}",
        config="config.yaml",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    study = validate(yaml.safe_load((REPO / "config.yaml").read_text()))
    jobs, gpus, threads = planned_jobs(run.stdout), planned_gpus(run.stdout), planned_threads(run.stdout)
    per_user = study["fit"]["gpu_jobs" if device == "cuda" else "jobs"]
    assert jobs["validate"] == jobs["fit"] == jobs["fit_others"] == jobs["cross_user_headline"] == per_user
    asked = sum(jobs[rule] * max(counts) for rule, counts in gpus.items())
    if device == "cpu":
        assert asked == 0 and threads.get("extract", {1}) == {1}  # the training branches share the cores
        return
    assert {rule for rule, counts in gpus.items() if counts == {1}} == GPU_RULES - {"cross_user"}  # none listed
    assert asked / slots <= 12 and threads.get("extract", {1}) == {1}, (asked, slots)  # a dry run omits threads: 1


def test_the_slurm_profile_plans_the_whole_cluster_example(tmp_path):
    run = snakemake(tmp_path, "-n", "--profile", str(SLURM_PROFILE), config="config/cluster-example.yaml", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    study = validate(yaml.safe_load((REPO / "config/cluster-example.yaml").read_text()))  # with the defaults
    fit, shards = study["fit"], study["extract"]["shards"]
    points = len(fit["heads"]) * len(fit["alphas"]) * len(fit["ds"])
    jobs, per_user = planned_jobs(run.stdout), fit["gpu_jobs"]  # device: cuda
    assert jobs["extract"] == shards and jobs["fit"] == jobs["validate"] == jobs["fit_others"] == per_user
    assert jobs["fit_global"] == len(set(fit["heads"])) + ("full_bias" in fit["baselines"])
    assert jobs["cross_user_headline"] == per_user and jobs["cross_user"] == len(fit["cross_user"]) * per_user
    assert points > 1 and jobs["personalization_table"] == 1
    assert jobs["copy_task_train"] == len(study["copy_task"]["attentions"]) * len(study["copy_task"]["seeds"])
    assert jobs["feedback_train"] == len(study["feedback"]["methods"])  # one job trains every seed of its method
    resources = planned_resources(run.stdout)
    for rule, lines in resources.items():
        assert all(("gpu=1" in line) == (rule in GPU_RULES) for line in lines), (rule, lines)
    assert GPU_RULES <= set(resources) and set(TRAINING_RULES) <= set(resources)  # the training runs: CPU nodes
    policy = slurm_profile()["set-resources"]
    assert all(f"mem_mb={policy['extract']['mem_mb']}," in line for line in resources["extract"])
    assert all(f"runtime={policy['fit_global']['runtime']}" in line for line in resources["fit_global"])


def test_make_slurm_adds_the_account_and_partition_to_the_profiles_resources(tmp_path):
    """The documented command's dry run: with SLURM_ACCOUNT and SLURM_PARTITION in the environment every job asks
    for them, beside the profile's default resources (which a --default-resources on the command line would
    replace); without them no job names an account or a partition."""
    defaults = slurm_profile()["default-resources"]
    plain = {name: value for name, value in os.environ.items() if name not in ("SLURM_ACCOUNT", "SLURM_PARTITION")}
    for env, named in [({**plain, "SLURM_ACCOUNT": "acct", "SLURM_PARTITION": "part"}, True), (plain, False)]:
        run = subprocess.run(
            make_slurm_command(tmp_path / str(named), "-n"), capture_output=True, text=True, timeout=300, env=env
        )
        assert run.returncode == 0, run.stderr[-3000:]
        resources = planned_resources(run.stdout)
        assert {"corpus_roles", "extract", "fit", "attention_train"} <= set(resources)
        for rule, lines in resources.items():
            for line in lines:
                assert ("slurm_account=acct" in line and "slurm_partition=part" in line) == named, (rule, line)
                assert ("slurm_account" in line or "slurm_partition" in line) == named, (rule, line)
        # corpus_roles declares no memory or wall time: it gets the profile's defaults
        assert all(
            f"mem_mb={defaults['mem_mb']}," in line and f"runtime={defaults['runtime']}" in line
            for line in resources["corpus_roles"]
        )


def test_a_job_that_fails_once_is_retried_where_the_run_asks_for_it(tmp_path, monkeypatch):
    """The default profile retries nothing (a bad input would fail twice, its line printed twice); profiles/slurm
    retries a job twice, and a local run that wants retries says --retries 1."""
    assert "retries" not in yaml.safe_load((DEFAULT_PROFILE / "config.v8+.yaml").read_text())
    monkeypatch.setenv("UPH_FAIL_ONCE", "gram_resilience")
    table = "results/tables/gram_resilience.csv"
    once = snakemake(tmp_path / "no-retry", table)
    assert once.returncode != 0
    assert "UPH_FAIL_ONCE=gram_resilience: failing this first attempt on purpose" in once.stderr
    assert not (tmp_path / "no-retry" / table).exists()
    retried = snakemake(tmp_path / "retry", "--retries", "1", table)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert "failing this first attempt on purpose" in retried.stderr and "Trying to restart job" in retried.stderr
    assert (tmp_path / "retry" / "results/logs/gram_resilience.log.failed-once").is_file()
    assert (tmp_path / "retry" / table).is_file()


@pytest.mark.slow
def test_the_tiny_study_runs_through_sbatch_with_a_retry(tiny_study, second_run):
    """The second run of the tiny study (conftest.second_run) went through sbatch, every job but the
    localrules, and retried the one that failed once. Its tables, figures and summary equal the local run's
    byte for byte (tests/test_workflow.py), both on CPU (config/test.yaml); GPU nodes of another model than
    the local GPU would match it only to rounding (uph.device)."""
    if not second_run.through_slurm:
        pytest.skip(
            "SLURM is not installed here (tests/slurm_cluster.missing_programs); .ci/run installs slurm-wlm and munge"
        )
    assert tiny_study.run.returncode == 0, tiny_study.run.stderr[-3000:]
    assert second_run.run.returncode == 0, second_run.run.stderr[-3000:]
    assert second_run.run.args[0] == "make" and "slurm" in second_run.run.args  # the command the docs give
    workdir, states = second_run.workdir, second_run.slurm_jobs

    # Every job but the Snakefile's localrules went through sbatch: SLURM lists one job per such job
    # of the local run (its benchmark files), all COMPLETED, plus the injected failure of
    # gram_resilience's first attempt.
    assert [comment for state, comment in states if state != "COMPLETED"] == ["rule_gram_resilience"]
    local_rules = {  # their benchmark files' names
        "fit-headline_point",
        "personalization_table",
        "copy_task_table",
        "attention_table",
        "feedback_table",
        "aggregate",
        "provenance",
    }
    cluster_jobs = [
        path for path in (tiny_study.workdir / "results/benchmarks").rglob("*.tsv") if path.stem not in local_rules
    ]
    assert sum(state == "COMPLETED" for state, _ in states) == len(cluster_jobs)
    assert (workdir / "results/logs/gram_resilience.log.failed-once").is_file()
