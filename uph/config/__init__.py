"""The config: validated against the JSON schemas (one a stage), and what each job reads of it.

validation   `validate`: schemas, defaults filled, integers and sets in one spelling, one-line refusals
schema       reading the schemas, their defaults and enums; the validator extension that fills and rewrites
checks       relations between keys no schema can express
model_checks the model's source, and the settings against the materialized model's sizes
results      the results folder: its spelling, writable, one checkout, one run at a time
command_line settings given with --config, read as YAML
job_keys     the keys each job reads (`job_params`, the *_KEYS lists)
sweep        the fit stage's sweep points
batches      extraction's batch size by device

Torch-free: the DAG build imports this package, so `snakemake -n` stays fast.
"""

from uph.config.batches import CPU_BATCH, GPU_BATCH_TOKENS, batch_windows
from uph.config.command_line import read_command_line
from uph.config.job_keys import (
    EXTRACT_KEYS,
    FEEDBACK_COMMON_KEYS,
    FEEDBACK_METHOD_KEYS,
    FIT_GLOBAL_KEYS,
    FIT_OTHERS_KEYS,
    FIT_SHARD_KEYS,
    FIT_VALIDATE_KEYS,
    HEAD_KEYS,
    SOLVER_KEYS,
    SWEEP_KEYS,
    computed_config,
    dataclass_fields,
    job_params,
)
from uph.config.model_checks import TINY_ARCHITECTURES, check_against_model, check_context, local_model_folder
from uph.config.results import (
    check_results_folder,
    claim_results_folder,
    hold_results_folder,
    path_as_written,
    results_folder,
)
from uph.config.schema import SCHEMA_DIR, schema_defaults, schema_enum
from uph.config.sweep import cross_user_solver, sweep_points
from uph.config.validation import key_path, validate

__all__ = [
    "CPU_BATCH",
    "EXTRACT_KEYS",
    "FEEDBACK_COMMON_KEYS",
    "FEEDBACK_METHOD_KEYS",
    "FIT_GLOBAL_KEYS",
    "FIT_OTHERS_KEYS",
    "FIT_SHARD_KEYS",
    "FIT_VALIDATE_KEYS",
    "GPU_BATCH_TOKENS",
    "HEAD_KEYS",
    "SCHEMA_DIR",
    "SOLVER_KEYS",
    "SWEEP_KEYS",
    "TINY_ARCHITECTURES",
    "batch_windows",
    "check_against_model",
    "check_context",
    "check_results_folder",
    "claim_results_folder",
    "hold_results_folder",
    "path_as_written",
    "read_command_line",
    "computed_config",
    "cross_user_solver",
    "dataclass_fields",
    "job_params",
    "key_path",
    "local_model_folder",
    "results_folder",
    "schema_defaults",
    "schema_enum",
    "sweep_points",
    "validate",
]
