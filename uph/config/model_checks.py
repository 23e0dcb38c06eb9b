"""The config against the model: its source is one the workflow can materialize (`check_model_source`,
at validation), and the settings fit the materialized model's sizes (`check_against_model`,
`check_context`: they read its folder, so the rules call them once the model job has run)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

from uph.config.sweep import sweep_points
from uph.errors import ConfigError
from uph.model_identity import EMBEDDED_GGUF, EMBEDDED_SOURCE, MODEL_CONFIG, check_model_folder

TINY_ARCHITECTURES = ("llama", "gpt2")  # model.source tiny:<arch> (uph.lm.data.models.tiny_model)


log = logging.getLogger(__name__)


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


def check_model_source(model: dict, gguf_dropped_for: str | None = None) -> None:
    """model.source names a model this machine can materialize: a local folder with its weights, a known
    tiny architecture, an installed package, or a hub id (org/name)."""
    _drop_embedded_gguf(model, gguf_dropped_for)
    source = model["source"]
    if (folder := local_model_folder(source)) is not None:
        check_model_folder(folder, model["gguf_file"])
    elif source.startswith(("/", ".", "~")):
        raise ConfigError(f"config key 'model.source': model folder '{source}' does not exist")
    elif source.startswith("tiny:") and source.removeprefix("tiny:") not in TINY_ARCHITECTURES:
        known = ", ".join(f"tiny:{arch}" for arch in TINY_ARCHITECTURES)
        raise ConfigError(f"config key 'model.source': unknown tiny architecture '{source}' (known: {known})")
    elif source.startswith("package:") and importlib.util.find_spec(source.removeprefix("package:")) is None:
        raise ConfigError(f"config key 'model.source': package '{source.removeprefix('package:')}' is not installed")
    elif not source.startswith(("tiny:", "package:")) and source.count("/") != 1:
        raise ConfigError(
            f"config key 'model.source': '{source}' is none of tiny:<arch>, package:<module>, a local folder "
            "(starting with /, . or ~) or a hub id (org/name)"
        )
