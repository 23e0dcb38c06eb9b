"""Property tests (Hypothesis): configs and corpora drawn at random within what a user may write end
either in something every later stage can use or in one error line naming the key, file or user, never
in a traceback. Each property checks what the stage after it relies on, at the library level (a DAG run
per example would cost a minute); bounded to about a minute in all."""

from __future__ import annotations

import copy
import json

import pandas as pd
import yaml
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from uph.config import SCHEMA_DIR, check_against_model, key_path, sweep_points, validate
from uph.errors import ConfigError, CorpusError
from uph.io import write_table
from uph.lm.corpus import read_corpus_file, tokenize_users
from uph.lm.models import byte_tokenizer
from uph.lm.splits import split_lengths, temporal_split

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


def _schema_leaves(schema: dict, value, path=()):
    """(path, its schema) of every setting of `value` (a validated config) below `schema`: each key of an
    object, each first item of a list; a section's schema is its file's."""
    if isinstance(schema, dict) and "$ref" in schema:
        schema = yaml.safe_load((SCHEMA_DIR / schema["$ref"]).read_text())
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _schema_leaves(schema.get("properties", {}).get(key, {}), item, (*path, key))
    elif isinstance(value, list):
        if value:
            yield from _schema_leaves(schema.get("items", {}), value[0], (*path, 0))
    else:
        yield path, schema


def _integer_only(schema: dict) -> bool:
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    return "integer" in types and "number" not in types


VALIDATED = validate(copy.deepcopy(TEST_CONFIG))
ROOT_SCHEMA = yaml.safe_load((SCHEMA_DIR / "config.schema.yaml").read_text())
LEAVES = dict(_schema_leaves(ROOT_SCHEMA, VALIDATED))
INTEGER_KEYS = sorted(path for path, schema in LEAVES.items() if _integer_only(schema))


def _at(config: dict, path: tuple):
    for part in path:
        config = config[part]
    return config


def _set(config: dict, path: tuple, value) -> None:
    _at(config, path[:-1])[path[-1]] = value


OTHER_TYPES = ["text", 2.5, [1], {"k": 1}, True, None]
other_type_edits = st.one_of(
    st.tuples(st.sampled_from(sorted(LEAVES, key=key_path)), st.sampled_from(OTHER_TYPES)),
    st.tuples(
        st.sampled_from([path for path in INTEGER_KEYS if _at(VALIDATED, path) is not None]),
        st.sampled_from(["as float", "plus a half"]),
    ),
)


@PROPERTY
@given(st.lists(other_type_edits, min_size=1, max_size=3, unique_by=lambda edit: edit[0]))
def test_a_setting_of_another_type_is_refused_naming_its_key_or_read_as_the_same_setting(edits):
    """Every setting (each integer one also as a float, 2.0 and 2.5) given a value of another type: validate
    either refuses it in one ConfigError line naming its key (a value its key allows: one line naming the
    key of the relation it breaks), or passes with every integer setting an int (never a float or a bool),
    and integral floats alone give the very config of the integers, the same job params, so the same
    tables."""
    config = copy.deepcopy(VALIDATED)
    for path, value in edits:
        if value in ("as float", "plus a half"):
            value = float(_at(VALIDATED, path)) + (0.5 if value == "plus a half" else 0.0)
        _set(config, path, value)
    refused = [path for path, _ in edits if not Draft202012Validator(LEAVES[path]).is_valid(_at(config, path))]
    try:
        validated = validate(config)
    except ConfigError as error:  # a value its own key's schema allows may break a relation with another key
        _one_line(error, *(f"config key '{key_path(path)}" for path in refused) if refused else "config key '")
        return
    for path in INTEGER_KEYS:
        assert _at(validated, path) is None or type(_at(validated, path)) is int, key_path(path)
    if all(value == "as float" for _, value in edits):
        assert repr(validated) == repr(VALIDATED)


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
