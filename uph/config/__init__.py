"""Config validation: JSON schema (one file per stage) plus checks a schema cannot express.

`validate(config, schema_dir)` fills defaults in place, reads an integral float of an integer key as that
integer (YAML's 2.0: JSON Schema counts it an integer, and it would reach the code as a float), and raises
`ConfigError` with one line naming the offending key, writes `results` as the rules spell their paths
(`results_folder`: `./runs/x`, `runs/x/` and its absolute path are `runs/x`), e.g. ``config key 'extract.shards': 0 is less than
the minimum of 1`` or ``config key 'extract.shards': 2.5 is not a whole number; write an integer``
(`ModelError` for a local model folder without weights, or with a weights file cut short; config.yaml's
GGUF file name carried over to another model.source is dropped with a warning). `check_results_folder` and
`check_against_model` need the file system; `job_params` is what a rule passes to one job, and
`EXTRACT_KEYS`, `SOLVER_KEYS`, `HEAD_KEYS` say which keys a job reads. Torch-free: the DAG build
imports this module, so `snakemake -n` stays fast.
"""

from uph.config.batches import CPU_BATCH, GPU_BATCH_TOKENS, batch_windows
from uph.config.job_keys import (
    CAPACITY_KEYS,
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
from uph.config.results import CHECKOUT_FILE, check_results_folder, claim_results_folder, results_folder
from uph.config.schema import SCHEMA_DIR, schema_defaults, schema_enum
from uph.config.sweep import cross_user_solver, sweep_points
from uph.config.validation import key_path, validate

__all__ = [
    "CAPACITY_KEYS",
    "CHECKOUT_FILE",
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
