"""The record of what a results folder was made with (uph.results_record), without Snakemake: what the DAG
build refuses where Snakemake has no history, and what a run writes before and after its jobs. The
workflow's own use of it (a results folder copied to a new path) is in tests/test_reliability.py."""

import json
import os
import types

import pytest
from snakemake.persistence.file import FilePersistence

from uph import results_record
from uph.errors import ConfigError
from uph.results_record import RECORD, Stage, check, finished, has_history, read, section_settings, started

FIX = "; delete '{results}/{folder}' and run snakemake again to rebuild it and what depends on it, or use a fresh results folder"


def study(tmp_path, source="tiny:llama", context=64):
    """Three stages of a results folder under tmp_path, every output there, the config's settings."""
    results = tmp_path / "results"
    for path in ("model/identity.json", "corpus/users.parquet", "fit/fits.parquet"):
        (results / path).parent.mkdir(parents=True, exist_ok=True)
        (results / path).write_text("x")
    return results, [
        Stage("model", {"model"}, {"model.source": source}, ("model",), (str(results / "model/identity.json"),)),
        Stage(
            "users",
            {"corpus"},
            {"corpus.min_tokens": 3000, "extract.context": context},
            ("corpus/users.parquet",),
            (str(results / "corpus/users.parquet"),),
            ("model",),
        ),
        Stage("fit", {"fit"}, {"fit.radii": [0.5]}, ("fit",), (str(results / "fit/fits.parquet"),), ("users",)),
    ]


def no_history(output):
    return False


def made_with(results, stages, **pending):
    results_record.write(
        results, {stage.name: {"settings": stage.settings, "pending": stage.name in pending} for stage in stages}
    )


def test_the_same_settings_pass_and_a_changed_one_is_named_with_the_folders_value_and_the_fix(tmp_path):
    results, stages = study(tmp_path)
    made_with(results, stages)
    check(results, stages, history=no_history)
    _, changed = study(tmp_path, context=128)
    with pytest.raises(ConfigError) as error:
        check(results, changed, history=no_history)
    assert str(error.value) == (
        f"config key 'extract.context': results folder '{results}' was made with 64, not 128 ({results / RECORD}), "
        "and this working directory has no Snakemake history of it to rerun from"
        + FIX.format(results=results, folder="corpus/users.parquet")
    )


def test_the_first_stage_that_differs_is_named_and_the_stages_after_it_rebuild_with_it(tmp_path):
    results, stages = study(tmp_path)
    made_with(results, stages)
    _, changed = study(tmp_path, source="tiny:gpt2", context=128)
    with pytest.raises(ConfigError, match=r"^config key 'model.source': .* 'tiny:llama', not 'tiny:gpt2' .*") as error:
        check(results, changed, history=no_history)
    assert str(error.value).endswith(FIX.format(results=results, folder="model"))
    (results / "model/identity.json").unlink()  # the fix: the model is rebuilt, and everything after it
    (results / "model").rmdir()
    check(results, changed, history=no_history)


def test_history_or_no_record_leaves_the_decision_to_snakemake(tmp_path):
    results, stages = study(tmp_path)
    _, changed = study(tmp_path, source="tiny:gpt2")
    check(results, changed, history=no_history)  # a folder made before the record: not checked
    made_with(results, stages)
    check(results, changed, history=lambda output: True)  # Snakemake reruns on the changed params itself


def test_a_stage_a_run_was_rebuilding_is_refused_whatever_the_config(tmp_path):
    results, stages = study(tmp_path)
    made_with(results, stages, users=True)
    with pytest.raises(ConfigError) as error:
        check(results, stages, history=no_history)
    assert str(error.value) == (
        f"config key 'results': folder '{results}' was copied, or its Snakemake history removed, while a run was "
        f"rebuilding its users stage ({results / RECORD}): it may hold outputs of two configs"
        + FIX.format(results=results, folder="corpus/users.parquet")
    )


def test_a_damaged_record_is_one_line_and_deleting_it_stops_the_checks(tmp_path):
    results, stages = study(tmp_path)
    (results / RECORD).write_text('{"version": 1, "stag')
    with pytest.raises(ConfigError) as error:
        check(results, stages, history=no_history)
    assert str(error.value).startswith(f"config key 'results': the record of what folder '{results}' was made with")
    assert str(error.value).endswith(
        "; delete it and run snakemake again (its stages are then not checked until a run records them)"
    )
    (results / RECORD).unlink()
    check(results, stages, history=no_history)


def jobs_of(stages, needs_run=(), on_history=()):
    """(rule, outputs, needs to run, rests on history) of one job per stage."""
    return [
        (next(iter(stage.rules)), list(stage.final), stage.name in needs_run, stage.name in on_history)
        for stage in stages
    ]


def test_a_run_records_rebuilt_stages_pending_on_history_and_settles_them_when_current(tmp_path):
    results, stages = study(tmp_path)
    made_with(results, stages)
    _, changed = study(tmp_path, context=128)
    started(results, changed, jobs_of(changed, needs_run={"users", "fit"}, on_history={"users"}), history=no_history)
    record = read(results)
    assert record["users"]["pending"] and record["users"]["settings"]["extract.context"] == 128
    assert not record["fit"]["pending"] and record["fit"]["settings"] == changed[2].settings
    (results / "corpus/users.parquet").write_text("rebuilt")
    finished(results, changed, [(rule, outputs, True) for rule, outputs, *_ in jobs_of(changed)])
    assert read(results) == {stage.name: {"settings": stage.settings, "pending": False} for stage in changed}


def test_a_run_that_stops_before_touching_a_pending_stage_leaves_its_record_as_it_was(tmp_path):
    """A refused model candidate: the installed model, and its record, stay as they were."""
    results, stages = study(tmp_path)
    made_with(results, stages)
    before = read(results)
    _, changed = study(tmp_path, source="bert")
    started(results, changed, jobs_of(changed, needs_run={"model"}, on_history={"model"}), history=no_history)
    assert read(results)["model"]["pending"]
    finished(results, changed, [(rule, outputs, rule != "model") for rule, outputs, *_ in jobs_of(changed)])
    assert read(results) == before


def test_a_stage_is_settled_only_by_a_run_whose_dag_holds_all_its_final_outputs(tmp_path):
    results, stages = study(tmp_path)
    made_with(results, stages)
    _, changed = study(tmp_path, context=128)
    started(results, changed, jobs_of(changed, needs_run={"fit"}, on_history={"fit"}), history=no_history)
    (results / "fit/fits.parquet").write_text("rewritten")  # then the run stops
    finished(results, changed, [("model", changed[0].final, True)])  # a later run of the model alone
    assert read(results)["fit"]["pending"]
    finished(results, changed, [(rule, outputs, True) for rule, outputs, *_ in jobs_of(changed)])
    assert not read(results)["fit"]["pending"]


def test_history_is_looked_up_where_snakemake_keeps_it(tmp_path):
    """The record's path of an output: Snakemake's own (FilePersistence._record_path), a long name cut into
    parts of the file system's longest name."""
    persistence = types.SimpleNamespace(_fetch_max_len=lambda subject: os.pathconf(subject, "PC_NAME_MAX"))
    metadata = tmp_path / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    for output in ("results/model/identity.json", "results/fit/" + "head~svd_cvh/alpha~1.0/" * 12 + "x.parquet"):
        assert not has_history(output, tmp_path)
        path = FilePersistence._record_path(persistence, str(metadata), output)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({}, f)
        assert has_history(output, tmp_path)


def test_settings_keep_their_order_and_json_types():
    assert section_settings("fit", {"ds": (8, 16), "alphas": [1.0]}) == {"fit.ds": [8, 16], "fit.alphas": [1.0]}
    assert list(section_settings("model", {"source": "s", "name": "n"}, ("name", "source"))) == [
        "model.name",
        "model.source",
    ]


def test_a_folder_made_before_the_record_is_checked_against_its_model_identity(tmp_path):
    """No 'model' stage in the record (or no record): identity.json names the model the folder was made with."""
    results, _ = study(tmp_path)
    output = str(results / "model/identity.json")
    identity = {"name": "tiny-llama", "source": "tiny:llama", "revision": None, "trust_remote_code": False}
    model = {**identity, "gguf_file": None}
    results_record.check_identity(results, identity, model, output, history=no_history)
    with pytest.raises(ConfigError) as error:
        results_record.check_identity(results, identity, {**model, "source": "tiny:gpt2"}, output, history=no_history)
    assert str(error.value) == (
        f"config key 'model.source': results folder '{results}' was made with 'tiny:llama', not 'tiny:gpt2' "
        f"({output}), and this working directory has no Snakemake history of it to rerun from"
        + FIX.format(results=results, folder="model")
    )
    results_record.check_identity(results, identity, {**model, "source": "tiny:gpt2"}, output, history=lambda o: True)
