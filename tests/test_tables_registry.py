"""uph.tables, the one registry of the study's tables, against what reads and writes them: the rules'
declared outputs, scripts and report captions (the workflow parsed by Snakemake's API on the tiny config),
and the columns `make compare` names (the committed references' tables)."""

import csv
import json
import pickle
import subprocess
import sys
from dataclasses import fields

import pandas as pd
import pytest
from conftest import REPO

from uph.io import table_files
from uph.report.study import Study
from uph.tables import TABLES, Comparison

# Parsed in its own process: reading the Snakefile sets this process's Ctrl-C handler (uph.interrupts).
# WorkflowApi._workflow is Snakemake's parsed workflow (requirements.txt pins Snakemake).
PARSE = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

repo, workdir = Path(sys.argv[1]), Path(sys.argv[2])
with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(cores=1),
        config_settings=ConfigSettings(configfiles=[repo / "config/test.yaml"], config={"results": "results"}),
        snakefile=repo / "Snakefile",
        workdir=workdir,
    )._workflow
    rules = {}
    for rule in workflow.rules:
        names = {index: name for name, (index, _) in rule.output._names.items()}
        outputs = {}
        for index, path in enumerate(rule.output):
            shown = path.flags.get("report")
            caption = shown and str(Path(shown.caption.get_path_or_uri(secret_free=True)).resolve().relative_to(repo))
            outputs[names.get(index, str(index))] = [str(path), caption, shown and shown.category]
        inputs = {name: [str(path) for path in rule.input[start:end]] for name, (start, end) in rule.input._names.items()}
        rules[rule.name] = {"script": rule.script, "outputs": outputs, "inputs": inputs}
print(json.dumps(rules))
"""
CSV = "results/tables/{}.csv"


@pytest.fixture(scope="session")
def rules(tmp_path_factory):
    """rule name -> its script, outputs (name -> [path, report caption, report category]) and named inputs."""
    workdir = tmp_path_factory.mktemp("parsed")
    run = subprocess.run(
        [sys.executable, "-c", PARSE, str(REPO), str(workdir)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_every_table_a_rule_writes_is_in_the_registry_and_every_spec_is_written_by_its_rule(rules):
    written = {
        path: (rule, name)
        for rule, parsed in rules.items()
        for name, (path, _, _) in parsed["outputs"].items()
        if path.startswith("results/tables/") and path.endswith(".csv")
    }
    assert set(written) == {CSV.format(name) for name in TABLES}
    for name, spec in TABLES.items():
        assert written[CSV.format(name)] == (spec.rule, spec.output)
        prefix = "" if spec.output == "csv" else f"{spec.output}_"
        outputs = rules[spec.rule]["outputs"]
        for companion, path in table_files(CSV.format(name)).items():  # every file write_table writes, declared
            assert outputs[spec.output if companion == "csv" else prefix + companion][0] == path


def test_each_spec_names_its_rules_script(rules):
    for spec in TABLES.values():
        assert rules[spec.rule]["script"] == f"../workflow_scripts/{spec.script}"
        assert (REPO / "workflow_scripts" / spec.script).is_file()


def test_each_table_in_the_report_has_its_caption_under_its_branch_and_the_others_are_not_in_it(rules):
    for spec in TABLES.values():
        _, caption, category = rules[spec.rule]["outputs"][spec.output]
        if spec.report:
            assert (caption, category) == (spec.caption, spec.branch)
            assert (REPO / spec.caption).is_file()
        else:
            assert (caption, category, spec.caption) == (None, None, None)


def test_the_aggregate_stage_reads_every_table_in_the_registrys_order(rules):
    assert rules["aggregate"]["inputs"]["tables"] == [CSV.format(name) for name in TABLES]


def test_a_study_holds_every_table_by_its_name_in_the_registrys_order():
    """uph.report.study.Study, what the figures, summary and answers read: a field per spec, then what no table
    holds; pickled by name for the figures' worker processes."""
    names = [field.name for field in fields(Study)]
    assert names[: len(TABLES)] == list(TABLES) and not set(names[len(TABLES) :]) & set(TABLES)
    tables = {name: pd.DataFrame({"table": [name]}) for name in TABLES}
    study = Study(**tables, copy_task_curves=pd.DataFrame(), feedback_curves=pd.DataFrame(), copy_task_vocab=8)
    copied = pickle.loads(pickle.dumps(study))
    assert type(copied) is Study and all(getattr(copied, name).equals(table) for name, table in tables.items())
    with pytest.raises(TypeError, match="capacity"):
        Study(
            **{name: table for name, table in tables.items() if name != "capacity"},
            **{n: None for n in names[len(TABLES) :]},
        )


def columns(reference: str, name: str) -> list[str]:
    with open(REPO / "reference" / reference / "tables" / f"{name}.csv", newline="") as table:
        return next(csv.reader(table))


@pytest.mark.parametrize("reference", ["default", "full"])
def test_each_spec_has_its_compare_reading_naming_columns_its_table_has(reference):
    for name, spec in TABLES.items():
        reading = spec.compared
        assert isinstance(reading, Comparison) and reading.kind in ("lm", "seeded", "exact", "summarized")
        if reading.kind == "summarized":
            assert reading.why and not reading.keys
            continue
        named = [
            *reading.keys,
            *reading.choices,
            *reading.counts,
            *reading.exact,
            *reading.norms,
            *reading.certificates,
            *reading.metrics,
            *reading.cell,
            *reading.runs,
            *reading.timings,
            *reading.skipped,
        ]
        assert reading.keys and set(named) <= set(columns(reference, name)), name
        assert set(reading.cell) <= set(reading.keys) and set(reading.runs) <= set(reading.keys)
        if reading.kind == "seeded":
            assert reading.metrics and reading.cell and "seed" in columns(reference, name)
