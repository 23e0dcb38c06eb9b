"""Property tests: configs and corpora drawn at random (Hypothesis), or every setting in turn, within what
a user may write end either in something every later stage can use or in one error line naming the key,
file or user, never in a traceback. Each property checks what the stage after it relies on, at the library
level (a DAG run per example would cost a minute); bounded to about a minute in all."""

from __future__ import annotations

import copy
import functools
import json
import shutil

import pandas as pd
import pytest
import yaml
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from uph.config import SCHEMA_DIR, check_against_model, key_path, sweep_points, validate
from uph.errors import ConfigError, CorpusError
from uph.io import write_table
from uph.lm.data.corpus import read_corpus_file, tokenize_users
from uph.lm.data.models import byte_tokenizer
from uph.splits import split_lengths, temporal_split

TEST_CONFIG = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
HIDDEN = 64  # the tiny test model's
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _one_line(error: Exception, *names: str) -> None:
    message = str(error)
    assert "\n" not in message and any(name in message for name in names), message


numbers = st.one_of(st.integers(-5, 10_000), st.floats(-1.0, 2.0), st.sampled_from([float("nan"), float("inf")]))
EDITS = {  # (section, key): the values a user might write there, within and beyond the schema
    ("corpus", "min_tokens"): st.one_of(st.integers(-1, 6000), st.just("many")),
    ("corpus", "max_tokens"): st.one_of(st.none(), st.integers(1, 6000)),
    ("corpus", "train_fraction"): numbers,
    ("extract", "context"): st.integers(-1, 700),
    ("extract", "shards"): st.integers(-1, 70),
    ("fit", "validation_fraction"): numbers,
    ("fit", "radii"): st.lists(numbers, max_size=4),
    ("fit", "ds"): st.lists(st.integers(-1, 100), max_size=3),
    ("fit", "alphas"): st.lists(numbers, max_size=3),
    ("fit", "tol"): st.one_of(numbers, st.just("1e-5")),
}


@PROPERTY
@given(
    st.sets(st.sampled_from(sorted(EDITS)), max_size=5).flatmap(
        lambda keys: st.fixed_dictionaries({key: EDITS[key] for key in keys})
    )
)
def test_a_config_is_either_usable_or_refused_in_one_line_naming_the_key(edits):
    """validate + check_against_model pass, and then every user the corpus stage keeps has a test window
    after the gap and a fit part before the validation gap, and every d fits the basis; or one
    ConfigError line names the key."""
    config = copy.deepcopy(TEST_CONFIG)
    for (section, key), value in edits.items():
        config[section][key] = value
    try:
        validate(config)
        check_against_model(config, {"name": "tiny", "hidden_size": HIDDEN})
    except ConfigError as error:
        _one_line(error, "config key '")
        return
    corpus, gap = config["corpus"], config["extract"]["context"]
    shortest = min(corpus["min_tokens"], corpus["max_tokens"] or corpus["min_tokens"])
    split = temporal_split(shortest, corpus["train_fraction"], gap)
    assert shortest - split.test_start >= 2
    split_lengths(split.train_end, config["fit"]["validation_fraction"], gap)  # raises if no fit part
    assert all(1 <= d <= HIDDEN for _, _, d in sweep_points(config["fit"]))


def _inlined(node, document: dict):
    """`node` of a schema file `document` with each `$ref` to a definition (`#/$defs/...` within the file,
    `defs.schema.yaml#/$defs/...` in another) replaced by what it names, the keywords beside the `$ref` (a
    default) kept, so that a node validates on its own."""
    if isinstance(node, dict) and "#/" in node.get("$ref", ""):
        file, pointer = node["$ref"].split("#/")
        named = yaml.safe_load((SCHEMA_DIR / file).read_text()) if file else document
        beside = {key: value for key, value in node.items() if key != "$ref"}
        return {**_inlined(functools.reduce(dict.__getitem__, pointer.split("/"), named), named), **beside}
    if isinstance(node, dict):
        return {key: _inlined(value, document) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(value, document) for value in node]
    return node


def _schema_nodes(schema: dict, value, path=()):
    """(path, its schema) of every setting of `value` (a validated config) below `schema`: each object and
    each list whole, and each key of an object and each item of a list; a section's schema is its file's."""
    if isinstance(schema, dict) and "$ref" in schema:
        document = yaml.safe_load((SCHEMA_DIR / schema["$ref"]).read_text())
        schema = _inlined(document, document)
    if path:
        yield path, schema
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _schema_nodes(schema.get("properties", {}).get(key, {}), item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _schema_nodes(schema.get("items", {}), item, (*path, index))


def _integer_only(schema: dict) -> bool:
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    return "integer" in types and "number" not in types


VALIDATED = validate(copy.deepcopy(TEST_CONFIG))
ROOT_SCHEMA = yaml.safe_load((SCHEMA_DIR / "config.schema.yaml").read_text())
ROOT_SCHEMA = _inlined(ROOT_SCHEMA, ROOT_SCHEMA)  # its device, a $ref to schemas/defs.schema.yaml
SETTINGS = dict(_schema_nodes(ROOT_SCHEMA, VALIDATED))  # read from schemas/ here: the oracle, whatever validate reads
INTEGER_KEYS = sorted((path for path, schema in SETTINGS.items() if _integer_only(schema)), key=key_path)


def _at(config: dict, path: tuple):
    for part in path:
        config = config[part]
    return config


def _set(config: dict, path: tuple, value) -> None:
    _at(config, path[:-1])[path[-1]] = value


OTHER_TYPES = ["text", "1.0e-3", 2.5, -1, [1], [], {"k": 1}, True, None]


def _edits(path: tuple) -> list:
    """The values one setting is given: one of every other type, and an integer one's value as a float
    (2.0) and plus a half (2.5)."""
    value = _at(VALIDATED, path)
    if type(value) is int and path in INTEGER_KEYS:
        return [*OTHER_TYPES, float(value), value + 0.5]
    return OTHER_TYPES


def check_types(validate, paths=None) -> list[str]:
    """Give every setting (`paths`: all of SETTINGS) each value of `_edits`, one at a time, and hold
    `validate` to the schemas as schemas/ holds them: a value the setting's schema forbids is refused in
    one ConfigError line naming its key; a value it allows passes (or is refused in one line naming some
    key: a relation with another key), with every integer setting an int (never a float or a bool), and an
    integral float for an integer gives the very config of the integer, the same job params, so the same
    tables. Returns the settings drawn, by key."""
    drawn = []
    for path in SETTINGS if paths is None else paths:
        drawn.append(key_path(path))
        for value in _edits(path):
            config = copy.deepcopy(VALIDATED)
            _set(config, path, copy.deepcopy(value))
            allowed = Draft202012Validator(SETTINGS[path]).is_valid(value)
            where = f"{key_path(path)} = {value!r}"
            try:
                validated = validate(config)
            except ConfigError as error:
                _one_line(error, *(("config key '",) if allowed else (f"config key '{key_path(path)}",)))
                continue
            except Exception as error:  # a traceback, not a line
                raise AssertionError(f"validate raised {type(error).__name__} ({error}) for {where}") from error
            assert allowed, f"validate accepted {where}, which its schema forbids"
            for key in INTEGER_KEYS:
                held = _at(validated, key) if _has(validated, key) else None
                assert held is None or type(held) is int, f"{where}: {key_path(key)} came back as {held!r}"
            if isinstance(value, float) and value == _at(VALIDATED, path):
                assert repr(validated) == repr(VALIDATED), where
    return drawn


def _has(config, path) -> bool:
    try:
        _at(config, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def test_every_setting_of_another_type_is_refused_naming_its_key_or_read_as_the_same_setting(capsys):
    """Every setting of config/test.yaml, each object and list whole and each of its items, in every run:
    one pass, so a run draws them all and its report (below, and in the failure) lists them."""
    drawn = check_types(validate)
    assert sorted(drawn) == sorted(map(key_path, SETTINGS)) and len(drawn) > 200
    print(f"drew {len(drawn)} settings, each given {len(OTHER_TYPES)} values of other types: {', '.join(drawn)}")


def test_the_type_property_fails_on_a_planted_validator_bug(tmp_path):
    """validate reading a schema that lets text through for an integer key (extract.context): the property
    fails, naming the key and the value."""
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMA_DIR, schemas)
    extract = yaml.safe_load((schemas / "extract.schema.yaml").read_text())
    extract["properties"]["context"]["type"] = ["integer", "string"]
    (schemas / "extract.schema.yaml").write_text(yaml.safe_dump(extract))
    with pytest.raises(AssertionError, match=r"extract\.context = 'text'"):
        check_types(functools.partial(validate, schema_dir=schemas), [("extract", "context")])
    assert check_types(validate, [("extract", "context")]) == ["extract.context"]


texts = st.text(st.characters(exclude_categories=()), max_size=40)  # lone surrogates (Cs) too
user_ids = st.one_of(st.text(max_size=8), st.integers(-3, 3), st.none())
rows = st.lists(
    st.fixed_dictionaries({"user_id": user_ids, "text": st.one_of(texts, st.none(), st.integers(0, 3))}),
    min_size=1,
    max_size=6,
)


@PROPERTY
@given(rows, st.integers(1, 40))
def test_a_corpus_file_is_either_read_and_tokenized_or_refused_in_one_line(tmp_path, rows, min_tokens):
    """Any JSONL of rows (ids of mixed types, empty or missing text, lone surrogates, line breaks, pipes):
    read_corpus_file and tokenize_users give UTF-8 text and every kept user a train and test split, or
    one CorpusError line naming the file or a key."""
    path = tmp_path / "users.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    try:
        corpus = read_corpus_file(path)
        users = tokenize_users(corpus, byte_tokenizer(), min_tokens, 100, 0.5, gap=1)
    except CorpusError as error:
        _one_line(error, str(path), "config key '")
        return
    assert all(isinstance(text, str) and text.encode("utf-8") for text in corpus["text"])
    assert users["user_id"].is_unique and (users["train_end"] <= users["test_start"]).all()
    users.drop(columns="tokens").to_parquet(tmp_path / "users.parquet")  # what the corpus job writes


@PROPERTY
@given(st.lists(st.text(max_size=10), min_size=1, max_size=5))
def test_any_user_id_keeps_its_markdown_row_on_one_line(tmp_path, ids):
    write_table(pd.DataFrame({"user": ids, "delta_nll": range(len(ids))}), tmp_path / "t.csv")
    assert len((tmp_path / "t.md").read_text().splitlines()) == len(ids) + 2
