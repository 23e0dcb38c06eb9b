# Helpers shared by every stage: config validation, paths, targets.
import os
from pathlib import Path

from uph.config import check_against_model, validate
from uph.errors import ConfigError
from uph.models import IDENTITY, read_identity

try:
    validate(config)
    if (Path(config["results"]) / "model" / IDENTITY).is_file():  # a materialized model: check its sizes now
        check_against_model(config, read_identity(Path(config["results"]) / "model"))
except ConfigError as error:
    raise WorkflowError(str(error)) from None


RESULTS = config["results"]

# Jobs share the cores: OpenMP threads that spin while waiting slow each other down many times over.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def results(*parts):
    """Path under the configured results folder."""
    return "/".join([RESULTS, *map(str, parts)])


def shard_paths():
    return expand(results("cache", "shard-{shard}.parquet"), shard=range(config["extract"]["shards"]))


def lm_targets():
    return [results("tables", "personalization.csv"), results("tables", "cross_user.csv")]


def copy_task_targets():
    return [results("tables", "copy_task.csv"), results("tables", "gram_resilience.csv")]


def feedback_targets():
    return [results("tables", "feedback.csv")]


def all_targets():
    return lm_targets() + copy_task_targets() + feedback_targets()
