# Helpers shared by every stage: config validation, paths, targets.
import os
from pathlib import Path

from uph.config import check_against_model, validate
from uph.copy_task import check_config as check_copy_task_config
from uph.errors import ConfigError
from uph.models import IDENTITY, read_identity

try:
    validate(config)
    check_copy_task_config(config["copy_task"])
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


FIT = config["fit"]
SWEEP = results("fit", "head~{head}", "alpha~{alpha}", "d~{d}")


def sweep_paths(name):
    """`name` under every point (head, alpha, d) of the fit sweep."""
    return expand(f"{SWEEP}/{name}", head=FIT["heads"], alpha=FIT["alphas"], d=FIT["ds"])


def cross_user_paths():
    return [f"{SWEEP}/cross_user.parquet".format(**point) for point in FIT["cross_user"]]


COPY_TASK = config["copy_task"]
COPY_TASK_JOB = results("copy_task", "attention~{attention}", "seed~{seed}")


def copy_task_runs(name):
    """`name` (curves.parquet or eval.parquet) of every configured (attention, seed) job."""
    return expand(f"{COPY_TASK_JOB}/{name}", attention=COPY_TASK["attentions"], seed=COPY_TASK["seeds"])


def lm_targets():
    return [results("tables", "personalization.csv"), results("tables", "cross_user.csv")]


def copy_task_targets():
    return [results("tables", "copy_task.csv"), results("tables", "gram_resilience.csv")]


def feedback_targets():
    return [results("tables", "feedback.csv")]


def all_targets():
    return lm_targets() + copy_task_targets() + feedback_targets()
