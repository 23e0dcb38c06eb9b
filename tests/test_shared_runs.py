"""tests/shared_runs.py: a run that several test processes ask for starts once, and each reads its result."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO
from shared_runs import SharedRun

START = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from shared_runs import SharedRun

    def launch(folder):
        with open(Path({root!r}) / "launches", "a") as launches:
            launches.write("launched\\n")
        time.sleep(0.5)  # the other process asks while the run is under way
        return (lambda: {{"answer": 42}}), (lambda: None)

    run = SharedRun(Path({root!r}), "study")
    run.start(launch)
    print(run.result(timeout=30)["answer"])
    run.end(stop=False)
    """
)


def test_a_run_that_two_processes_ask_for_starts_once_and_both_read_its_result(tmp_path):
    script = START.format(tests=str(REPO / "tests"), root=str(tmp_path))
    processes = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert [process.communicate(timeout=60)[0].strip() for process in processes] == ["42", "42"]
    assert (tmp_path / "launches").read_text() == "launched\n"
    assert json.loads((tmp_path / "study/result.json").read_text()) == {"answer": 42}


def test_a_run_that_fails_to_start_or_to_finish_raises_its_error_in_every_reader(tmp_path):
    def no_cluster(folder):
        raise OSError("slurmctld did not start")

    def broken(folder):
        def finish():
            raise ValueError("the run's folder vanished")

        return finish, lambda: None

    for name, launch, error in [("cluster", no_cluster, "OSError: slurmctld"), ("study", broken, "ValueError: the")]:
        run = SharedRun(tmp_path, name)
        run.start(launch)
        run.end(stop=False)
        with pytest.raises(RuntimeError, match=f"^{name}: {error}"):
            SharedRun(tmp_path, name).result(timeout=5)
