"""Warm workers (uph.warm): jobs run one after another in a process that paid its start-up once, each with
its own status, folder, environment and output; a stopped job ends its worker; the language-model chain
run through them gives the bytes it gives job by job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, files_under, snakemake

from uph import warm
from uph.config import validate

JOB_SCRIPT = """
import os, sys
from pathlib import Path
Path(snakemake.output).write_text(f"{os.getpid()} {os.getcwd()} {os.environ.get('UPH_TEST_WORD')}")
print("said by", snakemake.name)
if snakemake.name == "exits":
    sys.exit(3)
if snakemake.name == "raises":
    raise RuntimeError("raised on purpose")
if snakemake.name == "sleeps":
    import time
    time.sleep(60)
if snakemake.name == "dies":
    os._exit(9)  # as a worker killed by the kernel's OOM killer, say
"""


@pytest.fixture
def job_script(tmp_path) -> tuple[Path, Path]:
    """JOB_SCRIPT written to a file, and the slots folder its workers listen in."""
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    return script, tmp_path / "slots"


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_worker_runs_jobs_one_after_another_each_with_its_status_folder_environment_and_output(
    tmp_path, job_script, monkeypatch, capfd
):
    script, folder = job_script
    monkeypatch.chdir(tmp_path)
    statuses, seen = {}, {}
    for name in ("first", "exits", "raises", "last"):
        monkeypatch.setenv("UPH_TEST_WORD", f"word-{name}")
        job = SimpleNamespace(name=name, output=str(tmp_path / f"{name}.txt"))
        statuses[name] = warm.run_in_worker(str(script), job, folder)
        seen[name] = (tmp_path / f"{name}.txt").read_text().split()
    pids = {int(pid) for pid, _, _ in seen.values()}
    try:
        assert statuses == {"first": 0, "exits": 3, "raises": 1, "last": 0}
        assert len(pids) == 1 and os.getpid() not in pids  # one worker took the four jobs
        assert all(cwd == str(tmp_path) and word == f"word-{name}" for name, (_, cwd, word) in seen.items())
        out, err = capfd.readouterr()  # the jobs wrote to this process's stdout and stderr
        assert [line for line in out.splitlines() if line.startswith("said by")] == [
            f"said by {name}" for name in statuses
        ]
        assert "RuntimeError: raised on purpose" in err
        assert os.environ.get("UPH_TEST_WORD") == "word-last"  # the test's own, as monkeypatch set it
    finally:
        for pid in pids:
            stop(pid)


def test_a_worker_that_dies_fails_its_job_and_the_next_job_starts_a_fresh_one(tmp_path, job_script, capfd):
    script, folder = job_script
    jobs = {name: SimpleNamespace(name=name, output=str(tmp_path / f"{name}.txt")) for name in ("dies", "after")}
    assert warm.run_in_worker(str(script), jobs["dies"], folder) == 1
    assert "died during the job" in capfd.readouterr().err
    assert warm.run_in_worker(str(script), jobs["after"], folder) == 0
    died, after = (int((tmp_path / f"{name}.txt").read_text().split()[0]) for name in jobs)
    stop(after)
    assert died != after and not alive(died)


def test_two_jobs_at_once_take_two_slots_and_a_stopped_job_ends_its_worker(tmp_path, job_script):
    script, folder = job_script
    client = (
        "import sys; from pathlib import Path; from types import SimpleNamespace; from uph import warm; "
        "sys.exit(warm.run_in_worker(sys.argv[1], SimpleNamespace(name='sleeps', output=sys.argv[2]), Path(sys.argv[3])))"
    )
    outputs = [tmp_path / f"sleeps-{k}.txt" for k in range(2)]
    jobs = [subprocess.Popen([sys.executable, "-c", client, str(script), str(out), str(folder)]) for out in outputs]
    try:
        deadline = time.monotonic() + 120
        while not all(out.exists() and out.read_text() for out in outputs) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(out.read_text().split()[0]) for out in outputs]
        assert len(set(pids)) == 2 and sorted(p.name for p in folder.glob("*.sock")) == ["slot-0.sock", "slot-1.sock"]
        jobs[0].kill()  # as a cancelled run stops a job's process
        jobs[0].wait()
        deadline = time.monotonic() + 10
        while alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pids[0]) and alive(pids[1])
    finally:
        for job in jobs:
            job.kill()
            job.wait()
        for out in outputs:
            if out.exists() and out.read_text():
                stop(int(out.read_text().split()[0]))


@pytest.mark.parametrize(
    ("setting", "gpu", "slurm", "rule", "expected"),
    [
        ("auto", 1, False, "fit", True),
        ("auto", 0, False, "fit", False),  # a CPU job: its start-up is a second, and its cores are its own
        ("auto", 1, True, "fit", False),  # a SLURM job's node is its own: a worker would outlive nothing
        (True, 0, False, "extract", True),
        (True, 0, False, "attention_train", True),
        ("auto", 1, False, "attention_train", True),
        (False, 1, False, "fit", False),
    ],
)
def test_which_jobs_want_a_worker(monkeypatch, setting, gpu, slurm, rule, expected):
    if slurm:
        monkeypatch.setenv("SLURM_JOB_ID", "1")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    job = SimpleNamespace(
        config={**validate(config), "warm_workers": setting}, rule=rule, resources=SimpleNamespace(gpu=gpu)
    )
    assert warm.wants_worker(job) is expected
    assert not warm.wants_worker(SimpleNamespace(**{**vars(job), "rule": "capacity"}))  # no device: no worker


def test_the_study_in_warm_workers_gives_the_same_bytes(tiny_study, tmp_path):
    """The tiny study again from its extracted cache on, every job that sets up a device in a warm worker
    (warm_workers: true on this CPU): the tables, figures and summary are the job-by-job run's bytes (but
    feedback's seconds per step, as between any two runs), each such job's log names its worker, and the
    workers took several jobs each."""
    workdir = tmp_path / "study"
    shutil.copytree(tiny_study.workdir, workdir, symlinks=True)
    for name in ("fit", "attention", "copy_task", "feedback", "tables", "figures", "summary.md"):
        path = workdir / "results" / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**config, "warm_workers": True}, sort_keys=False))
    start = time.time()
    run = snakemake(workdir, config=tmp_path / "config.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    first, again = files_under(tiny_study.workdir), files_under(workdir)
    assert sorted(first) == sorted(again)
    timed = {f"results/tables/feedback{suffix}" for suffix in (".csv", ".md", ".tex")}
    assert [path for path in first if first[path] != again[path] and path not in timed] == []
    workers, device_jobs = {}, 0
    rerun = [log for log in sorted((workdir / "results/logs").rglob("*.log")) if log.stat().st_mtime > start]
    for log in rerun:
        text = log.read_text()
        device_jobs += "device set up" in text
        if "in warm worker" in text:
            workers.setdefault(int(text.split("in warm worker ")[1].split(",")[0]), []).append(log)
    try:
        assert sum(map(len, workers.values())) == device_jobs > 2 * len(workers) > 0
        rules = {
            log.parent.name if log.parent.name != "logs" else log.name.split("-")[0]
            for log in sum(workers.values(), [])
        }
        assert {"fit", "attention_train", "copy_task_train", "feedback_train"} <= rules, rules
    finally:
        for pid in workers:
            stop(pid)
