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


TOKENIZER_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens", "spiece")


def check_model_folder(folder: Path, gguf_file: str | None) -> str | None:
    """The GGUF file of a local model folder that loading uses, or None to load its *.safetensors / *.bin.

    `model.gguf_file` applies only where the folder holds GGUF files, so a safetensors folder ignores a
    value inherited from config.yaml; a folder whose only weights are one GGUF file needs no name. The
    folder must hold weights, and a tokenizer beside non-GGUF weights (a GGUF file carries its own).
    Cheap: it only lists the folder, so the config check at DAG build runs it too."""
    if not folder.is_dir():
        raise ModelError(f"config key 'model.source': '{folder}' is a file, expected a model folder")
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if ggufs and gguf_file:
        if gguf_file not in ggufs:
            raise ModelError(f"config key 'model.gguf_file': '{gguf_file}' is not in '{folder}', which holds {ggufs}")
        return gguf_file
    if ggufs and not has_weights:
        if len(ggufs) > 1:
            raise ModelError(f"config key 'model.gguf_file': model folder '{folder}' holds {ggufs}; name one")
        return ggufs[0]
    if not has_weights:
        raise ModelError(
            f"config key 'model.source': model folder '{folder}' holds no weights (*.safetensors or *.bin)"
        )
    if not any(p.name.startswith(TOKENIZER_PREFIXES) for p in folder.iterdir()):
        raise ModelError(
            f"config key 'model.source': model folder '{folder}' holds no tokenizer (tokenizer.json, "
            "tokenizer.model or vocab files); save the model's tokenizer into it (tokenizer.save_pretrained)"
        )
    return None


def file_sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in sorted(map(Path, paths)):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def read_identity(model_dir: str | Path) -> dict:
    """The materialized model's identity.json; a missing, truncated or hand-broken one is one ModelError
    line naming it and the fix (every stage, and the DAG build, reads it)."""
    path = Path(model_dir) / IDENTITY
    if not path.is_file():
        raise ModelError(f"model folder '{model_dir}' has no {IDENTITY}; run the model stage first")

    def damaged(why: str) -> ModelError:
        return ModelError(
            f"model identity '{path}' is damaged ({why}); delete it and run snakemake again (the model job rebuilds it)"
        )

    try:
        identity = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        raise damaged(str(error).splitlines()[0]) from None
    if not isinstance(identity, dict) or not {"weights_sha256", "hidden_size"} <= identity.keys():
        raise damaged("not a model identity")
    return identity
