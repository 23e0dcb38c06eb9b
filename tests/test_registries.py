"""One source for every list: every enum in the config schemas is written once (a list several properties
share lives under a `$defs`, most in schemas/defs.schema.yaml, named by `$ref`) and equals the registry the
code dispatches on, and every list of the keys a job reads (uph.config's *_KEYS) equals the keys its
dataclass reads, so a name added in one place and not the other fails here, not in a job an hour into a run."""

import copy
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from uph.attention.copy_task import DTYPES as COPY_TASK_DTYPES
from uph.attention.model import MODELS
from uph.attention.self_attention import ATTENTIONS
from uph.attention.study_config import SCHEDULES
from uph.attention.tasks import TASKS
from uph.config import (
    FEEDBACK_COMMON_KEYS,
    FEEDBACK_METHOD_KEYS,
    FIT_GLOBAL_KEYS,
    FIT_OTHERS_KEYS,
    FIT_SHARD_KEYS,
    FIT_VALIDATE_KEYS,
    HEAD_KEYS,
    SOLVER_KEYS,
    SWEEP_KEYS,
    job_params,
    validate,
)
from uph.device import BRANCH_DEFAULTS, BRANCH_DEVICES, CPU_KERNEL_CAPS, DEVICES, DTYPES
from uph.errors import ConfigError
from uph.feedback.training import METHODS, SIGNALS, TrainConfig
from uph.lm.engine.baselines import BASELINES
from uph.lm.engine.heads import BASES, HEADS, HeadSettings
from uph.lm.engine.solvers import SOLVERS, SolverSettings
from uph.lm.jobs.fit_job import CACHES, FitConfig

REGISTRIES = {  # (schema, the property whose values the enum lists, or its name under $defs) -> the code's registry
    ("defs", "device"): DEVICES,  # config.device; a branch's device is null or one of them (branch_device)
    ("defs", "attention_kind"): ATTENTIONS,  # copy_task.attentions, attention.attentions, attention.split_kinds
    ("config", "cpu_kernels"): tuple(CPU_KERNEL_CAPS),
    ("extract", "dtype"): DTYPES,
    ("fit", "head"): HEADS,  # fit's $defs: fit.heads and every sweep point's head
    ("fit", "solver"): SOLVERS,  # fit's $defs: fit.solvers and every sweep point's solver
    ("fit", "basis"): BASES,
    ("fit", "baselines"): BASELINES,
    ("fit", "cache"): tuple(CACHES),
    ("copy_task", "dtype"): COPY_TASK_DTYPES,
    ("attention", "tasks"): TASKS,
    ("attention", "models"): MODELS,
    ("attention", "schedule"): tuple(SCHEDULES),
    ("feedback", "methods"): METHODS,
    ("feedback", "signal"): SIGNALS,
}


def schema_enums():
    """(schema name, name, enum values) for every enum in schemas/*.schema.yaml, where it is written: at
    the property whose values it lists (its items' included), or at its name under `$defs`. A `$ref` is not
    followed: what it names is found where it is written."""
    found = []

    def walk(node, name, prop):
        if isinstance(node, dict):
            if "enum" in node:
                found.append((name, prop, node["enum"]))
            for key, value in node.items():
                if key in ("properties", "$defs"):
                    for named, schema in value.items():
                        walk(schema, name, named)
                else:
                    walk(value, name, prop)
        elif isinstance(node, list):
            for value in node:
                walk(value, name, prop)

    for path in sorted(Path(REPO / "schemas").glob("*.schema.yaml")):
        walk(yaml.safe_load(path.read_text()), path.name.removesuffix(".schema.yaml"), None)
    return found


@pytest.mark.parametrize("schema, prop, values", schema_enums(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_schema_enum_equals_its_registry(schema, prop, values):
    assert (schema, prop) in REGISTRIES, f"schemas/{schema}.schema.yaml: enum of '{prop}' has no registry in code"
    assert list(values) == list(REGISTRIES[schema, prop])


def test_every_registry_is_an_enum_of_the_schemas():
    assert set(REGISTRIES) == {(schema, prop) for schema, prop, _ in schema_enums()}


def test_every_list_is_written_once():
    """No enum repeats another's names (null aside): a list two properties share is written once under
    `$defs` and named by `$ref` where it is used."""
    written = Counter(frozenset(values) - {None} for _, _, values in schema_enums())
    again = [
        f"schemas/{schema}.schema.yaml: {prop}"
        for schema, prop, values in schema_enums()
        if written[frozenset(values) - {None}] > 1
    ]
    assert not again, f"one list written at {again}: write it once under $defs (schemas/defs.schema.yaml) and $ref it"


@pytest.mark.parametrize("branch", BRANCH_DEFAULTS)
def test_each_branch_device_takes_null_or_a_device_and_nothing_else(config, branch):
    for value in BRANCH_DEVICES:  # null: the branch's default
        edited = copy.deepcopy(config)
        edited[branch]["device"] = value
        assert validate(edited)[branch]["device"] == value
    edited = copy.deepcopy(config)
    edited[branch]["device"] = "gpu"
    with pytest.raises(ConfigError, match=f"^config key '{branch}.device': 'gpu' is not one of"):
        validate(edited)


# --- the keys a job reads: uph.config's *_KEYS against the dataclasses built from them -----------------


def keys_read(build, section: dict) -> set:
    """The keys of `section` that `build(section)` reads: those whose absence changes what it returns
    (or makes it fail)."""
    whole = build(section)
    read = set()
    for key in section:
        try:
            changed = build({k: v for k, v in section.items() if k != key}) != whole
        except (KeyError, TypeError):
            changed = True
        if changed:
            read.add(key)
    return read


@pytest.fixture(scope="session")
def config():
    return validate(yaml.safe_load((REPO / "config" / "test.yaml").read_text()))


def test_each_fit_key_list_is_what_its_dataclass_reads(config):
    fit = config["fit"]
    assert keys_read(SolverSettings.from_config, fit) == set(SOLVER_KEYS)
    assert keys_read(HeadSettings.from_config, fit) == set(HEAD_KEYS)
    # a fit-stage job's params hold exactly the keys FitConfig reads for it, and together they are every
    # key FitConfig reads (the rest of the section is read by the rules: bootstrap, cross_user)
    for keys in (FIT_GLOBAL_KEYS, FIT_VALIDATE_KEYS, FIT_SHARD_KEYS, FIT_OTHERS_KEYS, SWEEP_KEYS):
        assert keys_read(FitConfig.from_config, job_params(fit, keys)) == set(keys)
    assert keys_read(FitConfig.from_config, fit) == set(FIT_GLOBAL_KEYS) | set(FIT_VALIDATE_KEYS) | set(FIT_SHARD_KEYS)


@pytest.mark.parametrize("method", METHODS)
def test_each_feedback_method_gets_the_keys_its_train_config_reads(config, method):
    section = job_params(config["feedback"], FEEDBACK_COMMON_KEYS + FEEDBACK_METHOD_KEYS[method])
    # test_fraction splits the text (uph.feedback.char_lm.char_corpus) and the job trains each of the seeds
    # (uph.feedback.training.train_seeds): the two keys besides TrainConfig's
    assert keys_read(TrainConfig.from_config, section) == set(section) - {"test_fraction", "seeds"}
    assert keys_read(TrainConfig.from_config, config["feedback"]) - {"methods", "seeds"} <= set(section) | {
        key for keys in FEEDBACK_METHOD_KEYS.values() for key in keys
    }


# --- the dependencies: requirements.txt's pins against pyproject.toml's ranges --------------------------


def test_every_pin_of_requirements_txt_lies_in_its_range_in_pyproject():
    """requirements.txt pins what `make setup` installs; pyproject.toml declares the packages as ranges (its
    dependencies and extras). Every pinned package is declared there, its pin within its range."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, declared)}
    pins = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    for pin in map(Requirement, filter(None, pins)):
        (version,) = [spec.version for spec in pin.specifier if spec.operator == "=="]
        assert canonicalize_name(pin.name) in ranges, f"{pin.name} pinned in requirements.txt, not in pyproject.toml"
        assert ranges[canonicalize_name(pin.name)].contains(version), f"{pin}: outside pyproject.toml's range"
