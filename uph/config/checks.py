"""The checks `validate` runs once the schemas pass: the sweep's listed points, the attention study's
sizes, a user's split, the corpus file, and the model's source (model_checks)."""

from __future__ import annotations

from pathlib import Path

from uph.config.model_checks import check_model_source
from uph.config.schema import schema_defaults
from uph.config.sweep import sweep_points
from uph.errors import ConfigError
from uph.splits import split_lengths, temporal_split


def check_across_keys(config: dict, gguf_dropped_for: str | None = None) -> None:
    """What one key's schema cannot see: relations between keys, and named files that are missing."""
    source = config["corpus"]["source"]
    if source != "shakespeare":
        if Path(source).suffix not in (".parquet", ".jsonl"):
            raise ConfigError(
                f"config key 'corpus.source': '{source}' is neither 'shakespeare' nor a .parquet or .jsonl file"
            )
        if not Path(source).is_file():
            raise ConfigError(f"config key 'corpus.source': corpus file '{source}' does not exist")
    check_model_source(config["model"], gguf_dropped_for)
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
