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

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import re
from pathlib import Path

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from uph.errors import ConfigError
from uph.model_identity import EMBEDDED_GGUF, EMBEDDED_SOURCE, MODEL_CONFIG, check_model_folder
from uph.splits import split_lengths, temporal_split

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
ROOT_SCHEMA = "config.schema.yaml"
TINY_ARCHITECTURES = ("llama", "gpt2")  # model.source tiny:<arch> (uph.lm.data.models.tiny_model)

log = logging.getLogger(__name__)


def _load_schemas(schema_dir: Path) -> Registry:
    """The schemas of `schema_dir`, read once per content (their files' sizes and mtimes): reading the YAML
    is most of what a validation costs."""
    files = sorted(Path(schema_dir).glob("*.schema.yaml"))
    return _read_schemas(tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files))


@functools.lru_cache(maxsize=8)
def _read_schemas(files: tuple) -> Registry:
    resources = [
        (Path(path).name, DRAFT202012.create_resource(yaml.safe_load(Path(path).read_text()))) for path, *_ in files
    ]
    return Registry().with_resources(resources)


def _types(schema: dict) -> list:
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else types


def _integer_only(schema: dict) -> bool:
    """A schema whose type is integer (or integer or null), not number."""
    return "integer" in _types(schema) and "number" not in _types(schema)


def _number_only(schema: dict) -> bool:
    """A schema whose type is number (or number or null), not integer."""
    return "number" in _types(schema) and "integer" not in _types(schema)


def _as_integer(value, schema: dict):
    """An integral float where the schema asks for an integer, as that integer (YAML reads 2.0 as a float,
    and JSON Schema counts it as an integer: it would reach the code as a float, e.g. range(2.0)); a
    non-integral one stays, for the type check to refuse."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and _integer_only(schema):
        return int(value)
    return value


def _as_number(value, schema: dict):
    """An integer of a number key as a float: radii [5, 50] are [5.0, 50.0], one setting, one spelling."""
    if isinstance(value, int) and not isinstance(value, bool) and _number_only(schema):
        return float(value)
    return value


def _as_set(values: list, schema: dict) -> list:
    """An array the code reads as a set (`x-set: true` in its schema: fit.radii, lambdas, temperatures), in
    sorted order: [50, 5] and [5, 50] are one setting."""
    if schema.get("x-set") and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values


def _rewriting(validator_class, registry: Registry, rewrite, *, defaults: bool = False, sets: bool = False):
    """Extend a validator so that, as it validates, each value of an object's property and each item of an
    array becomes rewrite(value, its schema); with `defaults`, a missing property takes its `default` (and
    an object its {}); with `sets`, an array marked `x-set` is sorted (_as_set)."""
    validate_properties = validator_class.VALIDATORS["properties"]
    validate_items = validator_class.VALIDATORS["items"]

    def resolved(sub: dict) -> dict:
        return registry.contents(sub["$ref"]) if "$ref" in sub else sub

    def properties_hook(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                sub = resolved(sub)
                if defaults and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])  # the schema's own stays as it is
                if defaults and sub.get("type") == "object" and name not in instance and "required" not in sub:
                    instance[name] = {}
                if name in instance:
                    instance[name] = rewrite(instance[name], sub)
        yield from validate_properties(validator, properties, instance, schema)

    def items_hook(validator, items, instance, schema):
        if isinstance(instance, list) and isinstance(items, dict):
            instance[:] = [rewrite(item, resolved(items)) for item in instance]
            if sets:
                instance[:] = _as_set(instance, schema)
        yield from validate_items(validator, items, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties_hook, "items": items_hook})


def schema_defaults(section: str, schema_dir: Path | str = SCHEMA_DIR) -> dict:
    """The defaults schemas/<section>.schema.yaml gives the section's keys, nested objects filled as
    `validate` fills them: the one place they are written."""

    def filled(properties: dict) -> dict:
        out = {key: spec["default"] for key, spec in properties.items() if "default" in spec}
        for key, spec in properties.items():
            if spec.get("type") == "object" and "properties" in spec and key in out:
                out[key] = {**filled(spec["properties"]), **out[key]}
        return out

    return filled(yaml.safe_load((Path(schema_dir) / f"{section}.schema.yaml").read_text())["properties"])


def schema_enum(section: str, key: str, schema_dir: Path | str = SCHEMA_DIR) -> tuple[str, ...]:
    """The names schemas/<section>.schema.yaml allows for `key` (its enum, or its items' enum), in their
    order: the registries of heads, attention kinds and methods, without importing the code behind them
    (tests/test_registries.py checks each equals its registry)."""
    spec = yaml.safe_load((Path(schema_dir) / f"{section}.schema.yaml").read_text())["properties"][key]
    return tuple(spec.get("items", spec)["enum"])


def dataclass_fields(cls, section: dict) -> dict:
    """The entries of a validated config `section` that are fields of the frozen dataclass `cls`, lists
    as tuples: what a section's `from_config` builds it from (a job's params may hold more keys)."""
    values = {field.name: section[field.name] for field in dataclasses.fields(cls)}
    return {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}


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
    registry = _load_schemas(Path(schema_dir))
    root = registry.contents(ROOT_SCHEMA)
    # defaults filled and integral floats of integer keys read as integers, as it validates
    Validator = _rewriting(jsonschema.Draft202012Validator, registry, _as_integer, defaults=True)
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
    normalizing = _rewriting(jsonschema.Draft202012Validator, registry, _as_number, sets=True)
    for _ in normalizing(root, registry=registry).iter_errors(config):
        pass
    config["results"] = results_folder(config["results"])
    _check_across_keys(config, gguf_dropped_for)
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
    return error.validator == "type" and isinstance(error.instance, float) and _integer_only(error.schema)


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


def results_folder(results: str, cwd: str | Path | None = None) -> str:
    """Config key `results` as the rules spell their paths, so that every spelling of one folder names the
    same files and a target given either way matches them: normalized (os.path.normpath: `./runs/x` and
    `runs/x/` are `runs/x`), relative where it lies under the working directory `cwd` (default: the
    current one; its absolute path too), else absolute. A symlink stays as written: the folder it points to
    is read and written through it."""
    cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
    absolute = os.path.normpath(os.path.join(cwd, results))
    relative = os.path.relpath(absolute, cwd)
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def check_results_folder(results: str | Path) -> None:
    """The results folder, or else the nearest folder above it that exists, must be a folder this
    process can write to; otherwise every job would fail, and a long one only at its end."""
    path = Path(results).absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    problem = (
        "is not a folder"
        if not existing.is_dir()
        else "is not writable"
        if not os.access(existing, os.W_OK | os.X_OK)
        else None
    )
    if problem and existing == path:
        raise ConfigError(f"config key 'results': folder '{results}' {problem}")
    if problem:
        raise ConfigError(f"config key 'results': folder '{results}' cannot be created: '{existing}' {problem}")


CHECKOUT_FILE = ".uph-checkout"


def claim_results_folder(results: str | Path, checkout: str | Path) -> None:
    """One checkout writes a results folder: the first run names its checkout in `<results>/.uph-checkout`,
    and a run from another checkout is refused, so two versions of the code never interleave their
    outputs in one folder (Snakemake's own lock lives in each working directory, not in `results`)."""
    marker, checkout = Path(results) / CHECKOUT_FILE, str(Path(checkout).resolve())
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        claim = marker.with_name(f"{CHECKOUT_FILE}.{os.getpid()}")
        claim.write_text(checkout + "\n")
        with contextlib.suppress(FileExistsError):  # another run claimed it first: its claim stands
            os.link(claim, marker)
        claim.unlink()
    owner = marker.read_text().strip()
    if owner != checkout:
        raise ConfigError(
            f"config key 'results': folder '{results}' is written by the checkout '{owner}' ({marker}); give "
            f"this checkout ('{checkout}') its own results folder, or delete that file to hand the folder over"
        )


def job_params(section: dict, keys=None) -> dict:
    """The keys of a config section that one job reads (all if None), sorted at every level.

    Snakemake reruns a job when the repr of its params changes, so a job gets exactly the settings
    its outputs depend on: not the lists of sweep points or seeds (its wildcards pick one), so adding
    one reruns nothing old, and never the YAML's key order."""

    def canonical(value):
        return {key: canonical(value[key]) for key in sorted(value)} if isinstance(value, dict) else value

    return canonical({key: section[key] for key in (section if keys is None else keys)})


def computed_config(config: dict) -> dict:
    """The config as what the study computes from it (provenance's settings): not where the results go,
    nor any `device` key (a device moves rounding only, uph.device.job_device)."""
    return job_params(
        {
            key: {k: v for k, v in value.items() if k != "device"} if isinstance(value, dict) else value
            for key, value in config.items()
            if key not in ("results", "device")
        }
    )


CPU_BATCH = 16  # windows per extraction forward pass on a CPU where extract.batch_size is null
GPU_BATCH_TOKENS = 32_768  # tokens per forward pass on CUDA where it is null: 256 windows of 128, 128 of 256


def batch_windows(batch_size: int | None, context: int, device) -> int:
    """Windows per extraction forward pass (uph.lm.data.extract): `extract.batch_size`, or where it is null
    CPU_BATCH on a CPU and GPU_BATCH_TOKENS // context (at least 1) on CUDA (`device`: a name or a
    torch.device)."""
    if batch_size is not None:
        return batch_size
    if str(device).split(":")[0] == "cuda":
        return max(1, GPU_BATCH_TOKENS // context)
    return CPU_BATCH


# What each job reads, so that its params hold exactly those keys (`job_params`).
EXTRACT_KEYS = ("context", "dtype", "shards")  # the extract keys a cache reader checks (uph.lm.data.cache.read_users)
SOLVER_KEYS = ("beta", "lam", "clip_norm", "lr", "steps", "tol", "max_iter")  # uph.lm.engine.solvers.SolverSettings
HEAD_KEYS = ("basis_seed", "lm_head_update")  # what building the heads reads besides the point (uph.lm.engine.heads)
SWEEP_KEYS = (
    "heads",
    "alphas",
    "ds",
    "extra_points",
    "solvers",
    "baselines",
    *HEAD_KEYS,
    *SOLVER_KEYS,
)  # every method, every solver
CAPACITY_KEYS = (
    "radii",
    "lambdas",
    "temperatures",
    "validation_fraction",
)  # the grids and the split (uph.lm.engine.capacity)
FIT_GLOBAL_KEYS = (*SWEEP_KEYS, *CAPACITY_KEYS, "global_max_tokens")  # uph.lm.jobs.global_fit.fit_global
FIT_VALIDATE_KEYS = (*SWEEP_KEYS, *CAPACITY_KEYS, "dose_response", "on_cache")  # uph.lm.jobs.validate.validate_users
FIT_SHARD_KEYS = (*SWEEP_KEYS, "dose_response", "on_cache")  # uph.lm.jobs.refit.fit_users (the choices come as a file)
FIT_OTHERS_KEYS = (*SWEEP_KEYS, "on_cache")  # uph.lm.jobs.controls.others


FEEDBACK_COMMON_KEYS = ("test_fraction", "context", "hidden", "steps", "batch_size", "lr", "log_every", "eval_windows")
FEEDBACK_METHOD_KEYS = {  # the feedback keys beyond the common ones each method reads (uph.feedback.training)
    "backprop": (),
    "dfa": (),
    "feedback_frozen": ("rank",),
    "feedback_learned": ("rank", "update", "signal", "node_perturbation"),
    "feedback_learned_oracle": ("rank", "update"),
}


def cross_user_solver(fit: dict, head: str, alpha, d) -> str:
    """The solver whose thetas the cross-user matrix at sweep point (head, alpha, d) scores."""
    point = (head, float(alpha), int(d))
    return next(p["solver"] for p in fit["cross_user"] if (p["head"], float(p["alpha"]), int(p["d"])) == point)


def sweep_points(fit: dict) -> list[tuple[str, float, int]]:
    """The sweep's points (head, alpha, d): fit.heads x fit.alphas x fit.ds, then fit.extra_points not
    among them, in that order."""
    points = [(h, float(a), int(d)) for h in fit["heads"] for a in fit["alphas"] for d in fit["ds"]]
    extra = [(p["head"], float(p["alpha"]), int(p["d"])) for p in fit["extra_points"]]
    return points + [point for i, point in enumerate(extra) if point not in points and point not in extra[:i]]


def check_against_model(config: dict, model_identity: dict) -> None:
    """What needs the model's sizes: every d of the sweep fits in the SVD basis (rank <= H)."""
    hidden = model_identity["hidden_size"]
    too_big = [d for _, _, d in sweep_points(config["fit"]) if d > hidden]
    if too_big:
        key = "fit.ds" if too_big[0] in config["fit"]["ds"] else "fit.extra_points"
        raise ConfigError(
            f"config key '{key}': d={too_big[0]} is larger than the basis rank, the hidden size "
            f"{hidden} of model '{model_identity['name']}'"
        )


def check_context(context: int, model_dir: str | Path) -> None:
    """extract.context fits in the model's positions (config.json of its materialized folder): longer
    windows would index past a learned position table or run RoPE beyond what the model was trained on. A
    folder without its config.json (deleted: the model job rebuilds it) is checked once it has one again."""
    path = Path(model_dir) / MODEL_CONFIG
    if not path.is_file():
        return
    model_config = json.loads(path.read_text())
    positions = next((model_config[k] for k in ("max_position_embeddings", "n_positions") if k in model_config), None)
    if positions is not None and context > positions:
        raise ConfigError(
            f"config key 'extract.context': {context} is more than the model's {positions} positions ({path}); "
            f"lower it to at most {positions}"
        )


def local_model_folder(source: str) -> Path | None:
    """model.source as a folder on disk, whatever its spelling (`models/x` as well as `./models/x`): a
    source that exists locally is never taken for a hub id; None for a hub id, tiny: or package:."""
    if source.startswith(("tiny:", "package:")):
        return None
    folder = Path(source).expanduser()
    return folder if folder.exists() else None


def _drop_embedded_gguf(model: dict, warned_for: str | None = None) -> None:
    """Configs merge, so a config that names another model.source keeps config.yaml's GGUF file name,
    which that source would be asked for (offline, the hub retries for most of a minute before it fails):
    where the source does not hold it (a local folder without it; a hub id or another package, as that
    name belongs to the embedded package), model.gguf_file becomes None, with a warning, once: not where the
    source is `warned_for` (the results folder's model was made without it). tiny: sources build their model
    and ignore the key."""
    source = model["source"]
    if model["gguf_file"] != EMBEDDED_GGUF or source == EMBEDDED_SOURCE or source.startswith("tiny:"):
        return
    folder = local_model_folder(source)
    if folder is not None and (folder / EMBEDDED_GGUF).is_file():
        return
    model["gguf_file"] = None
    if source == warned_for:
        return
    log.warning(
        "config key 'model.gguf_file': '%s', config.yaml's file of %s, is not in model.source '%s'; ignoring it "
        "(set model.gguf_file: null to silence this warning)",
        EMBEDDED_GGUF,
        EMBEDDED_SOURCE,
        source,
    )


def _check_across_keys(config: dict, gguf_dropped_for: str | None = None) -> None:
    """What one key's schema cannot see: relations between keys, and named files that are missing."""
    source = config["corpus"]["source"]
    if source != "shakespeare":
        if Path(source).suffix not in (".parquet", ".jsonl"):
            raise ConfigError(
                f"config key 'corpus.source': '{source}' is neither 'shakespeare' nor a .parquet or .jsonl file"
            )
        if not Path(source).is_file():
            raise ConfigError(f"config key 'corpus.source': corpus file '{source}' does not exist")
    _drop_embedded_gguf(config["model"], gguf_dropped_for)
    model = config["model"]["source"]
    if (folder := local_model_folder(model)) is not None:
        check_model_folder(folder, config["model"]["gguf_file"])
    elif model.startswith(("/", ".", "~")):
        raise ConfigError(f"config key 'model.source': model folder '{model}' does not exist")
    elif model.startswith("tiny:") and model.removeprefix("tiny:") not in TINY_ARCHITECTURES:
        known = ", ".join(f"tiny:{arch}" for arch in TINY_ARCHITECTURES)
        raise ConfigError(f"config key 'model.source': unknown tiny architecture '{model}' (known: {known})")
    elif model.startswith("package:") and importlib.util.find_spec(model.removeprefix("package:")) is None:
        raise ConfigError(f"config key 'model.source': package '{model.removeprefix('package:')}' is not installed")
    elif not model.startswith(("tiny:", "package:")) and model.count("/") != 1:
        raise ConfigError(
            f"config key 'model.source': '{model}' is none of tiny:<arch>, package:<module>, a local folder "
            "(starting with /, . or ~) or a hub id (org/name)"
        )
    points = set(sweep_points(config["fit"]))
    listed = {
        "cross_user": config["fit"]["cross_user"],
        "dose_response.points": config["fit"]["dose_response"]["points"],
        "on_cache": config["fit"]["on_cache"],
    }
    for key, listed_points in listed.items():
        for i, point in enumerate(listed_points):
            if (point["head"], float(point["alpha"]), point["d"]) not in points:
                raise ConfigError(
                    f"config key 'fit.{key}[{i}]': {point['head']} alpha={point['alpha']} "
                    f"d={point['d']} is not a point of the sweep (fit.heads x fit.alphas x fit.ds, fit.extra_points)"
                )
            if point["solver"] not in config["fit"]["solvers"]:
                raise ConfigError(f"config key 'fit.{key}[{i}]': solver '{point['solver']}' is not in fit.solvers")
    for i, point in enumerate(config["fit"]["on_cache"]):
        if point["cache"] not in config["fit"]["baselines"]:
            raise ConfigError(
                f"config key 'fit.on_cache[{i}]': the head fits on the {point['cache']} cache; "
                f"add {point['cache']} to fit.baselines"
            )
    _check_head_width("copy_task", config["copy_task"])
    _check_attention(config["attention"])
    _check_split(config)


SPLIT_KEYS = {  # the keys besides a user's tokens that decide its split, and the section each lives in
    "corpus.train_fraction": "corpus",
    "fit.validation_fraction": "fit",
    "extract.context": "extract",
}


def _split_problem(n_tokens: int, train_fraction: float, validation_fraction: float, context: int):
    """Why a user of `n_tokens` tokens cannot be split (uph.splits): ('held_out', held-out tokens)
    without a test window after the gap, ('fit_part', train tokens, why) without a fit part before the
    validation gap; None where it can."""
    split = temporal_split(n_tokens, train_fraction, context)
    if n_tokens - split.train_end < context + 2:
        return "held_out", n_tokens - split.train_end
    try:
        split_lengths(split.train_end, validation_fraction, context)
    except ValueError as error:
        return "fit_part", split.train_end, str(error)
    return None


def _check_split(config: dict) -> None:
    """The user with the fewest tokens (each has corpus.min_tokens or more, cut to corpus.max_tokens) has a
    test window after the train/test gap and a fit part before the validation gap. The message names first
    the setting that breaks it: corpus.train_fraction, fit.validation_fraction or extract.context where it
    is not its default and its default would split the user, else the user's tokens."""
    corpus = config["corpus"]
    cut = corpus["max_tokens"] is not None and corpus["max_tokens"] < corpus["min_tokens"]
    tokens_key = "max_tokens" if cut else "min_tokens"
    n_tokens = corpus[tokens_key]
    values = {key: config[section][key.split(".")[1]] for key, section in SPLIT_KEYS.items()}
    problem = _split_problem(n_tokens, *values.values())
    if problem is None:
        return
    blamed = f"corpus.{tokens_key}"
    for key, section in SPLIT_KEYS.items():
        default = schema_defaults(section)[key.split(".")[1]]
        if values[key] != default and _split_problem(n_tokens, *{**values, key: default}.values()) is None:
            blamed = key
            break
    context, tokens = values["extract.context"], f"corpus.{tokens_key}"
    if problem[0] == "held_out":
        held_out = problem[1]
        if blamed == tokens:
            raise ConfigError(
                f"config key '{tokens}': {n_tokens} leaves {held_out} held-out tokens, fewer than the train/test "
                f"gap of extract.context={context} plus 2; raise it to at least "
                f"{int((context + 2) / (1 - values['corpus.train_fraction'])) + 1}"
            )
        raise ConfigError(
            f"config key '{blamed}': {values[blamed]} leaves a user of {n_tokens} tokens {held_out} held-out tokens, "
            f"fewer than the train/test gap of extract.context={context} plus 2; lower it or raise {tokens}"
        )
    _, train_tokens, why = problem
    if blamed == tokens:
        raise ConfigError(
            f"config key '{tokens}': a user of {n_tokens} tokens trains on {train_tokens}, and {why} "
            "(fit.validation_fraction, extract.context); raise it or corpus.train_fraction, or lower "
            "fit.validation_fraction or extract.context"
        )
    others = {
        "corpus.train_fraction": f"raise it or {tokens}, or lower fit.validation_fraction or extract.context",
        "fit.validation_fraction": f"lower it, or raise {tokens} or corpus.train_fraction, or lower extract.context",
        "extract.context": f"lower it, or raise {tokens} or corpus.train_fraction, or lower fit.validation_fraction",
    }
    raise ConfigError(
        f"config key '{blamed}': {values[blamed]} gives a user of {n_tokens} tokens {train_tokens} train tokens, "
        f"and {why} (fit.validation_fraction, extract.context); {others[blamed]}"
    )


def _check_head_width(branch: str, section: dict) -> None:
    """d_model splits into n_head heads that RoPE can turn: of even width (pairs), a multiple of 4 where
    `diff` runs (RoPE turns each half of its q and k)."""
    d_model, n_head = section["d_model"], section["n_head"]
    diff = "diff" in section["attentions"]
    if d_model % n_head or (d_model // n_head) % (4 if diff else 2):
        raise ConfigError(
            f"config key '{branch}.d_model': {d_model} must split into {branch}.n_head={n_head} heads of "
            + (
                "a width that is a multiple of 4 (diff: RoPE turns pairs in each half of q and k)"
                if diff
                else "even width (RoPE turns pairs)"
            )
        )


def _check_attention(study: dict) -> None:
    """The attention study's sizes fit together (uph.attention.tasks)."""
    _check_head_width("attention", study)
    if study["sweep_seeds"] > len(study["seeds"]):
        raise ConfigError(
            f"config key 'attention.sweep_seeds': {study['sweep_seeds']} is more than the "
            f"{len(study['seeds'])} attention.seeds"
        )
    if study["seeds_if_split"] is not None and study["seeds_if_split"] < len(study["seeds"]):
        raise ConfigError(
            f"config key 'attention.seeds_if_split': {study['seeds_if_split']} is fewer than the "
            f"{len(study['seeds'])} attention.seeds it adds to"
        )
    if study["split_kinds"] and study["seeds_if_split"] is None:
        raise ConfigError(
            "config key 'attention.split_kinds' lists kinds to train attention.seeds_if_split seeds, "
            "which is null: set it (the default study's 10) or empty split_kinds"
        )
    vocab, length = study["vocab"], study["train_len"]
    copies = {"offset_copy": 0, "loud_copy": study["distractors"]}
    for task, distractors in copies.items():
        if task in study["tasks"] and study["items"] + distractors > vocab - 1:
            raise ConfigError(
                f"config key 'attention.items': {task} needs items + distractors = {study['items'] + distractors} "
                f"distinct content tokens, more than attention.vocab - 1 = {vocab - 1}"
            )
        if task in study["tasks"] and 2 * study["items"] + distractors > length + 1:
            raise ConfigError(
                f"config key 'attention.items': {task} needs 2 x items + distractors <= train_len + 1 "
                f"= {length + 1}, got {2 * study['items'] + distractors}"
            )
    most = max(study["pairs"])
    if "mqar" in study["tasks"] and (3 * most > length or most > (vocab - 1) // 2):
        raise ConfigError(
            f"config key 'attention.pairs': mqar with {most} pairs needs attention.train_len >= {3 * most} "
            f"and attention.vocab >= {2 * most + 1}"
        )
