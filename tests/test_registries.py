"""Every enum in the config schemas equals the registry the code dispatches on, so a name added in one
place and not the other fails here, not in a job an hour into a run."""

from pathlib import Path

import pytest
import yaml
from conftest import REPO

from uph.attention.copy_task import DTYPES as COPY_TASK_DTYPES
from uph.attention.model import MODELS
from uph.attention.self_attention import ATTENTIONS
from uph.attention.tasks import TASKS
from uph.attention.training import SCHEDULES
from uph.device import DEVICES, DTYPES
from uph.feedback.training import METHODS, SIGNALS
from uph.lm.baselines import BASELINES
from uph.lm.fit import SOLVERS
from uph.lm.heads import BASES, HEADS

REGISTRIES = {  # (schema, the property whose values the enum lists) -> the code's registry
    ("config", "device"): DEVICES,
    ("extract", "dtype"): DTYPES,
    ("fit", "heads"): HEADS,
    ("fit", "head"): HEADS,
    ("fit", "solvers"): SOLVERS,
    ("fit", "solver"): SOLVERS,
    ("fit", "basis"): BASES,
    ("fit", "baselines"): BASELINES,
    ("copy_task", "attentions"): ATTENTIONS,
    ("copy_task", "dtype"): COPY_TASK_DTYPES,
    ("attention", "tasks"): TASKS,
    ("attention", "models"): MODELS,
    ("attention", "attentions"): ATTENTIONS,
    ("attention", "schedule"): tuple(SCHEDULES),
    ("feedback", "methods"): METHODS,
    ("feedback", "signal"): SIGNALS,
}


def schema_enums():
    """(schema name, property, enum values) for every enum in schemas/*.schema.yaml."""
    found = []

    def walk(node, name, prop):
        if isinstance(node, dict):
            if "enum" in node:
                found.append((name, prop, node["enum"]))
            for key, value in node.items():
                walk(value, name, key if key not in ("items", "properties") and not isinstance(value, list) else prop)
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
