"""A materialized model folder's identity and the file checks on model folders.

Torch-free: the DAG build reads it (rules/common.smk), so `snakemake -n` never imports torch.
`identity.json` is written last by `uph.lm.models.materialize`; its weight and tokenizer hashes name
the model in every cache and table.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from uph.errors import ModelError

WEIGHTS = "model.safetensors"
IDENTITY = "identity.json"


def check_model_folder(folder: Path, gguf_file: str | None) -> None:
    """A local model folder must hold weights: the named GGUF file, or *.safetensors / *.bin files
    (cheap: it only lists the folder, so the config check at DAG build runs it too)."""
    if not folder.is_dir():
        raise ModelError(f"config key 'model.source': '{folder}' is a file, expected a model folder")
    if gguf_file and not (folder / gguf_file).is_file():
        raise ModelError(f"config key 'model.gguf_file': '{folder / gguf_file}' does not exist")
    if not gguf_file and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ModelError(
            f"config key 'model.source': model folder '{folder}' holds no weights (*.safetensors or *.bin)"
        )


def file_sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in sorted(map(Path, paths)):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def read_identity(model_dir: str | Path) -> dict:
    path = Path(model_dir) / IDENTITY
    if not path.is_file():
        raise ModelError(f"model folder '{model_dir}' has no {IDENTITY}; run the model stage first")
    return json.loads(path.read_text())
