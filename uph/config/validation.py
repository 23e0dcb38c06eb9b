"""`validate(config)`: the config against the schemas, defaults filled in place, then the checks no
schema can express (checks.py). A refusal is one line naming the key, e.g. ``config key 'extract.shards':
0 is less than the minimum of 1`` or ``config key 'extract.shards': 2.5 is not a whole number; write an
integer``; `results` comes back as the rules spell their paths (results.results_folder)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import jsonschema

from uph.config.checks import check_across_keys
from uph.config.model_checks import local_model_folder
from uph.config.results import path_as_written, results_folder
from uph.config.schema import (
    ROOT_SCHEMA,
    SCHEMA_DIR,
    as_integer,
    as_number,
    integer_only,
    load_schemas,
    rewriting,
)
from uph.errors import ConfigError


def key_path(path) -> str:
    """('fit', 'alphas', 0) -> 'fit.alphas[0]'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def validate(config: dict, schema_dir: Path | str = SCHEMA_DIR, *, gguf_dropped_for: str | None = None) -> dict:
    """Validate `config` against the stage schemas, fill defaults, then run cross-key checks.
    `gguf_dropped_for`: the model.source whose carried-over GGUF file name an earlier run already dropped
    with a warning (the results folder's record): dropped again without one."""
    _check_finite(config)
    registry = load_schemas(Path(schema_dir))
    root = registry.contents(ROOT_SCHEMA)
    # defaults filled and integral floats of integer keys read as integers, as it validates
    Validator = rewriting(jsonschema.Draft202012Validator, as_integer, defaults=True)
    errors = sorted(
        Validator(root, registry=registry).iter_errors(config), key=lambda e: (len(e.path), key_path(e.path))
    )
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        where = key_path(error.absolute_path)
        if error.validator == "additionalProperties":
            unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            known = ", ".join(sorted(error.schema.get("properties", {})))
            prefix = f"{where}." if error.absolute_path else ""
            raise ConfigError(f"config key '{prefix}{unknown[0]}' is not known (known here: {known})")
        if _is_fraction_for_integer(error):
            raise ConfigError(f"config key '{where}': {error.instance!r} is not a whole number; write an integer")
        if _is_quoted_number(error):
            raise ConfigError(
                f"config key '{where}': {error.instance!r} is text, not a number; {_how_to_write(error.instance)}"
            )
        raise ConfigError(f"config key '{where}': {error.message}")
    # valid: one more pass writes every number of a number key as a float and sorts every set, one spelling a
    # setting, so the same computation has the same params (after validation: a refusal quotes the value as written)
    normalizing = rewriting(jsonschema.Draft202012Validator, as_number, sets=True)
    for _ in normalizing(root, registry=registry).iter_errors(config):
        pass
    config["results"] = results_folder(config["results"])
    # a file or folder named by the config in one spelling: `./users.jsonl`, `users.jsonl` and its absolute
    # path are one setting, and rerun nothing (the records hold the settings)
    if config["corpus"]["source"] != "shakespeare":
        config["corpus"]["source"] = path_as_written(config["corpus"]["source"])
    if local_model_folder(config["model"]["source"]) is not None:
        config["model"]["source"] = path_as_written(config["model"]["source"])
    check_across_keys(config, gguf_dropped_for)
    return config


NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _is_quoted_number(error: jsonschema.ValidationError) -> bool:
    """A number key holding text that reads as a number."""
    types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    return (
        error.validator == "type"
        and bool({"number", "integer"} & set(types))
        and isinstance(error.instance, str)
        and NUMBER.fullmatch(error.instance.strip()) is not None
    )


def _is_fraction_for_integer(error: jsonschema.ValidationError) -> bool:
    """An integer key holding a float with a fractional part (an integral one became its integer)."""
    return error.validator == "type" and isinstance(error.instance, float) and integer_only(error.schema)


def _how_to_write(text: str) -> str:
    """YAML 1.1 (PyYAML, Snakemake) reads a float in e-notation only with a dot and a signed exponent:
    1e-5, 1e3 and 1.0e3 are text; 1.0e-5 and 1.0e+3 numbers."""
    mantissa, _, exponent = text.strip().lower().partition("e")
    if exponent:
        sign, digits = (exponent[0], exponent[1:]) if exponent[0] in "+-" else ("+", exponent)
        written = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{sign}{digits}"
        return (
            f"write it as {written} (YAML reads a number in e-notation as text unless it has a dot and a signed "
            "exponent)"
        )
    return f"write it without quotes: {text.strip()}"


def _check_finite(value, path=()) -> None:
    """Every number of the config is finite: no key of the schemas accepts NaN or inf (YAML .nan, .inf),
    which would pass their bounds (every comparison with NaN is false) and surface later as a
    traceback or a silently dropped sweep point."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, (*path, i))
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{key_path(path)}': {value} is not a finite number")
