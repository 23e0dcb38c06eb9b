"""uph.records: what made a job's outputs, written by the job and checked at DAG build."""

import contextlib
import hashlib
import json
import os
import re
import time
from types import SimpleNamespace

import pytest
from conftest import read_only
from snakemake.iocontainers import Namedlist, Wildcards

from uph.errors import ArtifactError, ConfigError
from uph.logs import rule_logging
from uph.records import (
    Records,
    canonical,
    check_records_folder,
    file_digest,
    gguf_dropped_for,
    note_touched_outputs,
    record_check,
    record_path,
    redate_future_files,
    write_record,
)

SETTINGS = {"fit": {"radii": [0.5, 5.0], "jobs": 2}, "cache": {"context": 64}}


def a_job(tmp_path):
    """A results folder with one job's input and output, and the job's record."""
    results = tmp_path / "results"
    (results / "corpus").mkdir(parents=True)
    source, made = results / "corpus/roles.txt", results / "corpus/users.txt"
    source.write_text("roles")
    made.write_text("users")
    write_record(results, "corpus", {}, SETTINGS, [str(source)], [str(made)])
    return results, source, made


def test_a_record_holds_the_settings_and_the_content_digests_relative_to_the_folder(tmp_path):
    results, source, made = a_job(tmp_path)
    record = json.loads(record_path(results, "corpus", {}).read_text())
    assert record["settings"] == SETTINGS and record["rule"] == "corpus"
    assert record["inputs"] == {"corpus/roles.txt": hashlib.sha256(b"roles").hexdigest()}
    size, mtime, digest = record["outputs"]["corpus/users.txt"]
    assert (size, mtime, digest) == (5, made.stat().st_mtime_ns, hashlib.sha256(b"users").hexdigest())
    assert record_path(results, "fit", {"job": 1, "head": "cvh"}).name == "head~cvh-job~1.json"


def test_the_same_settings_in_another_spelling_are_current_and_another_setting_is_not(tmp_path):
    results, _, made = a_job(tmp_path)
    records = Records(results)
    respelled = {"cache": {"context": 64.0}, "fit": {"jobs": 2.0, "radii": [0.5, 5]}}
    assert records.is_current("corpus", {}, respelled)
    assert not records.is_current("corpus", {}, {**SETTINGS, "fit": {"radii": [0.5], "jobs": 2}})
    assert not records.is_current("corpus", {"shard": 0}, SETTINGS)  # no record of that job
    assert canonical({"b": [1, True, None], "a": 2}) == {"a": 2.0, "b": [1.0, True, None]}


def test_a_record_rewritten_in_another_layout_is_the_same_record(tmp_path):
    """Re-indented, keys reordered, written by another tool: the record is read, not compared as text."""
    results, _, made = a_job(tmp_path)
    path = record_path(results, "corpus", {})
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(list(record.items()))), indent=8) + "\n\n")
    assert not Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
    path.write_text(json.dumps({**record, "settings": {**SETTINGS, "cache": {"context": 65}}}))
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])  # the check can fail


def test_changed_content_not_a_date_makes_a_job_stale(tmp_path):
    results, source, made = a_job(tmp_path)
    later = time.time_ns() + 3600 * 10**9
    os.utime(source, ns=(later, later))
    os.utime(made, ns=(1, 1))  # dates moved, bytes the same: read again, the same digests
    assert not Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
    source.write_text("other")  # an input replaced (at any date)
    os.utime(source, ns=(1, 1))
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
    source.write_text("roles")
    made.write_text("tampered")  # an output replaced
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
    made.unlink()  # a missing output: Snakemake runs the job anyway
    assert not Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])


def test_a_damaged_or_missing_record_makes_its_job_stale(tmp_path):
    results, _, made = a_job(tmp_path)
    path = record_path(results, "corpus", {})
    path.write_text("{not json")
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
    path.unlink()
    path.mkdir()  # a folder where the record belongs
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])


def test_a_record_is_read_without_hashing_an_unchanged_large_output(tmp_path, monkeypatch):
    results, source, made = a_job(tmp_path)
    monkeypatch.setattr("uph.records.SMALL_FILE_BYTES", 4)  # the 5-byte output counts as large
    hashed = []
    monkeypatch.setattr("uph.records.file_digest", lambda path: hashed.append(str(path)) or file_digest(path))
    assert Records(results).is_current("corpus", {}, SETTINGS)
    assert hashed == [str(source)]  # the input, which no record made; the output by its size and date


def test_files_dated_in_the_future_are_dated_now_and_their_records_follow(tmp_path):
    results, source, made = a_job(tmp_path)
    ahead = time.time_ns() + 3600 * 10**9
    for path in (source, made):
        os.utime(path, ns=(ahead, ahead))
    redated = redate_future_files(results)
    assert sorted(redated) == sorted([source, made])
    assert source.stat().st_mtime_ns == made.stat().st_mtime_ns <= time.time_ns()
    record = json.loads(record_path(results, "corpus", {}).read_text())
    assert record["outputs"]["corpus/users.txt"][1] == made.stat().st_mtime_ns
    assert redate_future_files(results) == []


def test_a_folder_or_a_dangling_link_where_a_record_is_written_is_one_line_naming_it(tmp_path):
    results, source, made = a_job(tmp_path)
    path = record_path(results, "corpus", {})
    path.unlink()
    path.mkdir()
    with pytest.raises(
        ArtifactError, match=rf"^cannot write '{re.escape(str(path))}' \(.*\): a folder is at that path; "
    ):
        write_record(results, "corpus", {}, SETTINGS, [str(source)], [str(made)])
    path.rmdir()
    path.parent.rmdir()
    path.parent.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match="something is in the way of that path; move it aside or delete it"):
        write_record(results, "corpus", {}, SETTINGS, [str(source)], [str(made)])


def test_a_small_output_edited_to_the_same_size_and_dated_back_is_not_current(tmp_path, monkeypatch):
    """A table edited by hand, its size kept and its date put back: a small output is hashed at every
    check (SMALL_FILE_BYTES), so its record no longer vouches for it; a large one is judged by size and date."""
    results, source, made = a_job(tmp_path)
    stat = made.stat()
    made.write_text("USERS")
    os.utime(made, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not Records(results).is_current("corpus", {}, SETTINGS)
    monkeypatch.setattr("uph.records.SMALL_FILE_BYTES", 4)
    assert Records(results).is_current("corpus", {}, SETTINGS)


def test_records_that_cannot_be_written_stop_the_dag_build_in_one_line_naming_the_path(tmp_path):
    results, source, made = a_job(tmp_path)
    check_records_folder(results)  # writable, every record a file
    check_records_folder(tmp_path / "no-results-yet")
    path = record_path(results, "corpus", {})
    path.unlink()
    path.mkdir()
    with pytest.raises(ArtifactError, match=rf"^'{re.escape(str(path))}' is a folder, where a job writes its record; "):
        check_records_folder(results)
    path.rmdir()
    with (
        read_only(path.parent),
        pytest.raises(
            ConfigError, match=rf"^config key 'results': '{re.escape(str(path.parent))}' is not writable, and the jobs "
        ),
    ):
        check_records_folder(results)


def test_outputs_read_again_for_a_new_date_have_it_noted_and_are_read_once(tmp_path, monkeypatch):
    results, source, made = a_job(tmp_path)
    monkeypatch.setattr("uph.records.SMALL_FILE_BYTES", 4)  # the 5-byte output counts as large
    os.utime(made, ns=(10**18, 10**18))  # copied without its dates
    records = Records(results)
    assert records.is_current("corpus", {}, SETTINGS) and records.note_dates() == 1
    hashed = []
    monkeypatch.setattr("uph.records.file_digest", lambda path: hashed.append(str(path)) or file_digest(path))
    assert Records(results).is_current("corpus", {}, SETTINGS) and hashed == [str(source)]
    assert Records(results).note_dates() == 0


def test_the_dates_snakemake_gives_outputs_after_a_job_are_noted_at_the_runs_end(tmp_path):
    results, source, made = a_job(tmp_path)
    start = time.time_ns() - 10**9
    os.utime(made)  # Snakemake touches a job's outputs once it ends, after the job wrote its record
    assert note_touched_outputs(results, start) == 1
    record = json.loads(record_path(results, "corpus", {}).read_text())
    assert record["outputs"]["corpus/users.txt"][1] == made.stat().st_mtime_ns
    assert note_touched_outputs(results, start) == 0
    assert note_touched_outputs(results, time.time_ns() + 10**9) == 0  # an earlier run's records: left alone


def test_a_run_dates_now_what_lies_in_the_future_and_notes_dates_read_again_once_it_holds_the_lock(tmp_path):
    results, source, made = a_job(tmp_path)
    os.utime(made, ns=(10**18, 10**18))  # copied without its dates
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(source, ns=(ahead, ahead))  # from a clock running ahead
    records = Records(results)
    assert records.is_current("corpus", {}, SETTINGS)  # the DAG build reads the output again
    records.run_started()
    assert source.stat().st_mtime_ns <= time.time_ns()
    record = json.loads(record_path(results, "corpus", {}).read_text())
    assert record["outputs"]["corpus/users.txt"][:2] == [5, made.stat().st_mtime_ns]


def test_a_run_notes_at_its_end_the_dates_of_its_own_jobs_outputs_only(tmp_path):
    results, source, made = a_job(tmp_path)  # an earlier run's job
    records = Records(results)
    os.utime(made)
    assert records.run_ended() == 0  # an earlier run's record: left alone
    time.sleep(0.05)  # file dates come from a coarser clock than time.time_ns
    write_record(results, "corpus", {}, SETTINGS, [str(source)], [str(made)])  # this run's job
    os.utime(made, ns=(made.stat().st_mtime_ns + 10**9,) * 2)  # Snakemake touches its outputs after
    assert records.run_ended() == 1
    record = json.loads(record_path(results, "corpus", {}).read_text())
    assert record["outputs"]["corpus/users.txt"][1] == made.stat().st_mtime_ns


def a_workflow(results, params):
    """Enough of Snakemake's workflow for record_check: rule fit with `params`, one output per job."""
    rule = SimpleNamespace(params=params, output=[str(results / "fit" / "job~{job}" / "fits.txt")])
    return SimpleNamespace(get_rule={"fit": rule}.get, dag=SimpleNamespace(forcefiles=set()))


def test_the_record_check_forces_a_stale_jobs_outputs_and_adds_no_input(tmp_path):
    results = tmp_path / "results"
    fits = results / "fit" / "job~0" / "fits.txt"
    fits.parent.mkdir(parents=True)
    fits.write_text("fits")
    write_record(results, "fit", {"job": "0"}, SETTINGS, [], [str(fits)])
    job = Wildcards(fromdict={"job": "0"})
    current = a_workflow(results, {"fit": lambda wildcards: SETTINGS["fit"], "cache": SETTINGS["cache"]})
    assert record_check(Records(results), current, "fit")(job) == [] and current.dag.forcefiles == set()
    stale = a_workflow(results, {"fit": SETTINGS["fit"], "cache": {"context": 128}})
    assert record_check(None, stale, "fit")(job) == [] and stale.dag.forcefiles == set()  # a cluster job
    assert record_check(Records(results), stale, "fit")(job) == [] and stale.dag.forcefiles == {str(fits)}


def test_a_model_made_without_the_carried_over_gguf_file_names_its_source(tmp_path):
    results = tmp_path / "results"
    (results / "model").mkdir(parents=True)
    identity = results / "model" / "identity.json"
    identity.write_text("{}")
    assert gguf_dropped_for(str(results)) is None  # no model made yet
    write_record(results, "model", {}, {"model": {"source": "hub/model", "gguf_file": None}}, [], [str(identity)])
    assert gguf_dropped_for(str(results)) == "hub/model"
    write_record(results, "model", {}, {"model": {"source": "hub/model", "gguf_file": "m.gguf"}}, [], [str(identity)])
    assert gguf_dropped_for(str(results)) is None
    assert gguf_dropped_for(None) is None  # no folder name: validation says so


def a_finished_job(results, rule="corpus"):
    """What Snakemake hands a workflow script (the parts uph.logs.rule_logging reads), for a job of `rule`
    that reads the corpus roles and writes the users."""
    return SimpleNamespace(
        rule=rule,
        config={"results": str(results)},
        log=[str(results / "logs" / f"{rule}.log")],
        input=Namedlist([str(results / "corpus/roles.txt")]),
        output=Namedlist([str(results / "corpus/users.txt")]),
        params=Namedlist(fromdict=SETTINGS),
        wildcards=Wildcards(fromdict={}),
    )


@pytest.mark.parametrize("damage", ["a folder", "read-only"])
def test_a_record_that_cannot_be_written_is_one_line_and_the_outputs_are_kept(tmp_path, damage, capfd):
    """The job's work is done when its record is written: a record that cannot be written (a folder in its
    place, a read-only records folder, a full disk) is one line in the log, the job ends well, so Snakemake
    keeps its outputs, and without a record the next run does it again."""
    results, _, made = a_job(tmp_path)
    (results / "logs").mkdir()
    path = record_path(results, "corpus", {})
    path.unlink()
    context = read_only(path.parent) if damage == "read-only" else contextlib.nullcontext(path.mkdir())
    with context, rule_logging(a_finished_job(results)):
        made.write_text("users again")
    assert made.read_text() == "users again"
    log = (results / "logs/corpus.log").read_text().splitlines()
    errors = [line for line in log if " corpus ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith("(the next run does corpus again)"), log
    assert "the outputs are written and kept, the bookkeeping is not: " in errors[0]
    assert "Traceback" not in capfd.readouterr().err
    assert Records(results).needs_rerun("corpus", {}, SETTINGS, [str(made)])
