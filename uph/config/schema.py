"""The schemas (schemas/*.schema.yaml: one a stage, and defs.schema.yaml, the lists several stages share,
each written once) and the validator extension that rewrites a config as it validates: a missing key takes
its schema default, an integral float of an integer key becomes that integer, a number key's integers
become floats, and an `x-set` array is sorted (`rewriting`)."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
ROOT_SCHEMA = "config.schema.yaml"


def load_schemas(schema_dir: Path) -> Registry:
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


def integer_only(schema: dict) -> bool:
    """A schema whose type is integer (or integer or null), not number."""
    return "integer" in _types(schema) and "number" not in _types(schema)


def _number_only(schema: dict) -> bool:
    """A schema whose type is number (or number or null), not integer."""
    return "number" in _types(schema) and "integer" not in _types(schema)


def as_integer(value, schema: dict):
    """An integral float where the schema asks for an integer, as that integer (YAML reads 2.0 as a float,
    and JSON Schema counts it as an integer: it would reach the code as a float, e.g. range(2.0)); a
    non-integral one stays, for the type check to refuse."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and integer_only(schema):
        return int(value)
    return value


def as_number(value, schema: dict):
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


def rewriting(validator_class, rewrite, *, defaults: bool = False, sets: bool = False):
    """Extend a validator so that, as it validates, each value of an object's property and each item of an
    array becomes rewrite(value, its schema); with `defaults`, a missing property takes its `default` (and
    an object its {}); with `sets`, an array marked `x-set` is sorted (_as_set). A `$ref` resolves through
    the resolver jsonschema descends with (the validator's private `_resolver`: it knows the schema file the
    hook is in, so `#/$defs/head` is fit.schema.yaml's and `defs.schema.yaml#/$defs/device` the shared
    file's), the keywords beside it (a default) over what it names; every validation exercises it."""
    validate_properties = validator_class.VALIDATORS["properties"]
    validate_items = validator_class.VALIDATORS["items"]

    def resolved(validator, sub: dict) -> dict:
        if "$ref" not in sub:
            return sub
        beside = {key: value for key, value in sub.items() if key != "$ref"}
        return {**validator._resolver.lookup(sub["$ref"]).contents, **beside}

    def properties_hook(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                sub = resolved(validator, sub)
                if defaults and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])  # the schema's own stays as it is
                if defaults and sub.get("type") == "object" and name not in instance and "required" not in sub:
                    instance[name] = {}
                if name in instance:
                    instance[name] = rewrite(instance[name], sub)
        yield from validate_properties(validator, properties, instance, schema)

    def items_hook(validator, items, instance, schema):
        if isinstance(instance, list) and isinstance(items, dict):
            instance[:] = [rewrite(item, resolved(validator, items)) for item in instance]
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
    name = f"{section}.schema.yaml"
    values = load_schemas(Path(schema_dir)).contents(name)["properties"][key]
    values = values.get("items", values)
    if "$ref" in values:  # an enum written once under $defs (the file's own or defs.schema.yaml's)
        values = load_schemas(Path(schema_dir)).resolver(base_uri=name).lookup(values["$ref"]).contents
    return tuple(values["enum"])
