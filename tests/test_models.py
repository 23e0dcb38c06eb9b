"""Bring your own model: tiny random models of real families, saved to a folder as a user would, go
through the suite's own path (materialize -> load_model -> final_hidden -> read_output_layer) and give
the model's own log-probs, or stop with one line naming model.source."""

import json
import logging
import os
import shutil

import pytest
import torch
import transformers as tf
import yaml
from conftest import REPO
from safetensors.torch import save_file

from uph.config import validate
from uph.errors import ModelError
from uph.lm.data import models
from uph.lm.data.models import (
    OutputLayer,
    byte_tokenizer,
    final_hidden,
    lm_head,
    load_model,
    materialize,
    read_output_layer,
    tiny_config,
)
from uph.lm.engine.tokens import prepare
from uph.model_identity import EMBEDDED_GGUF, EMBEDDED_SOURCE, IDENTITY

VOCAB = 257  # the byte tokenizer's
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)


def _gemma2_with_large_logits(model):
    """Gemma's final norm scales by (1 + w): w = 300 takes the raw logits to ~100, well past the cap of 30."""
    model.model.norm.weight.data.fill_(300.0)


# family: (tiny config, a change to the random weights or None, what the family does after its body)
FAMILIES = {
    "gpt2": (tiny_config("gpt2", VOCAB, hidden=32), None, None),  # tiny:gpt2 at half its width
    "gpt_neox": (tf.GPTNeoXConfig(**{**SMALL, "num_key_value_heads": 2}, tie_word_embeddings=False), None, None),
    "phi": (tf.PhiConfig(**SMALL), None, None),  # lm_head bias
    "opt": (
        tf.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            word_embed_proj_dim=16,
            ffn_dim=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=64,
        ),
        None,
        None,  # project_out (32 -> 16) runs inside the body: the lm_head input is 16 wide
    ),
    "minicpm3": (
        tf.MiniCPM3Config(
            **{**SMALL, "num_key_value_heads": 2},
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=16,
            dim_model_base=8,
        ),
        None,
        None,  # h / (hidden_size / dim_model_base) before the lm_head: part of the lm_head input
    ),
    "gemma2": (tf.Gemma2Config(**SMALL, head_dim=16, final_logit_softcapping=30.0), _gemma2_with_large_logits, "cap"),
    "cohere": (tf.CohereConfig(**SMALL, logit_scale=0.3), None, "scale"),
    "granite": (tf.GraniteConfig(**SMALL, logits_scaling=0.3), None, "scale"),
    "falcon_h1": (
        tf.FalconH1Config(
            **SMALL,
            head_dim=16,
            mamba_d_ssm=32,
            mamba_n_heads=4,
            mamba_d_head=8,
            mamba_n_groups=1,
            mamba_d_state=8,
            mamba_chunk_size=16,
            lm_head_multiplier=3.0,
        ),
        None,
        "scale",
    ),
}


def _save(folder, config, change=None, tokenizer=True):
    """A user's model folder: random weights of `config` (seeded), and the byte tokenizer."""
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config)
    if change is not None:
        change(model)
    model.save_pretrained(folder)
    if tokenizer:
        byte_tokenizer().save_pretrained(folder)
    return folder


def _max_logprob_gap(model, layer, ids):
    with torch.no_grad():
        own = torch.log_softmax(model(ids).logits, dim=-1)
        ours = torch.log_softmax(layer.logits(final_hidden(model, ids)), dim=-1)
    return (own - ours).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_suite_log_probs_are_the_models_own(family, tmp_path):
    config, change, transform = FAMILIES[family]
    source = _save(tmp_path / "mine", config, change)
    identity = materialize(family, str(source), tmp_path / "model")
    model, layer = load_model(tmp_path / "model"), read_output_layer(tmp_path / "model")
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    assert _max_logprob_gap(model, layer, ids) < 1e-5
    assert identity["parity"]["max_logprob_diff"] < 1e-5
    # the fit engine's base NLL (p0 from the cached path) is the model's own NLL on the same tokens
    with torch.no_grad():
        own_nll = torch.nn.functional.cross_entropy(
            model(ids).logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)
        )
        hidden = final_hidden(model, ids)[:, :-1].reshape(-1, identity["hidden_size"])
    assert prepare(hidden, ids[:, 1:].reshape(-1), layer).base_nll == pytest.approx(float(own_nll), rel=1e-5)
    assert layer.W.shape == (VOCAB, identity["hidden_size"])
    # the transform matters: the stored lm_head alone would be another distribution
    raw_gap = _max_logprob_gap(model, OutputLayer(*lm_head(model)), ids)
    assert (raw_gap > 0.1) if transform else (raw_gap < 1e-5)
    if transform == "cap":
        raw = final_hidden(model, ids) @ lm_head(model)[0].T
        assert raw.abs().max() > 3 * layer.softcap  # far past the cap, and spanning over 100 nats
        assert (raw.max(-1).values - raw.min(-1).values).min() > 100


def test_family_details_reach_the_output_layer(tmp_path):
    opt = materialize("opt", str(_save(tmp_path / "opt", FAMILIES["opt"][0])), tmp_path / "opt-model")
    assert opt["hidden_size"] == 16  # after project_out
    phi = materialize("phi", str(_save(tmp_path / "phi", FAMILIES["phi"][0])), tmp_path / "phi-model")
    assert read_output_layer(tmp_path / "phi-model").b is not None
    assert phi["lm_head_tensors"]["bias"] == "lm_head.bias"
    minicpm3 = _save(tmp_path / "minicpm3", FAMILIES["minicpm3"][0])
    materialize("minicpm3", str(minicpm3), tmp_path / "minicpm3-model")
    model, ids = load_model(tmp_path / "minicpm3-model"), torch.arange(20)[None]
    body = model.base_model(input_ids=ids).last_hidden_state
    assert torch.allclose(final_hidden(model, ids), body / (32 / 8))  # width scaling: hidden_size / dim_model_base
    granite = materialize("granite", str(_save(tmp_path / "g", FAMILIES["granite"][0])), tmp_path / "g-model")
    assert granite["logit_transform"] == {"scale": pytest.approx(1 / 0.3), "softcap": None}


def test_unknown_logit_transform_is_refused(tmp_path, monkeypatch):
    """A family whose logits the suite does not reproduce stops the model stage, and leaves no identity."""
    monkeypatch.delitem(models.LOGIT_SCALES, "CohereForCausalLM")
    source = _save(tmp_path / "cohere", FAMILIES["cohere"][0])
    with pytest.raises(
        ModelError, match=r"\(CohereForCausalLM\): the suite's log-probs differ from the model's own by"
    ):
        materialize("cohere", str(source), tmp_path / "model")
    assert not (tmp_path / "model" / IDENTITY).exists()


def test_non_finite_logits_fail_the_parity_check(tmp_path):
    def poison(model):
        model.lm_head.weight.data[7] = float("nan")

    source = _save(tmp_path / "nan", FAMILIES["gpt_neox"][0], poison)
    with pytest.raises(ModelError, match=r"\(GPTNeoXForCausalLM\): .* differ from the model's own by up to nan nats"):
        materialize("nan", str(source), tmp_path / "model")


def _config_only_folder(folder, config: dict):
    """A folder with a config.json, a weights file and a tokenizer, as downloaded."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


def test_refusals_at_load_are_one_line_naming_model_source(tmp_path):
    t5 = tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)
    t5_folder = tmp_path / "t5"
    torch.manual_seed(0)
    tf.T5ForConditionalGeneration(t5).save_pretrained(t5_folder)
    byte_tokenizer().save_pretrained(t5_folder)
    with pytest.raises(
        ModelError, match=r"^config key 'model.source': '.*t5' is a 't5' encoder-decoder model, not a causal LM"
    ):
        materialize("t5", str(t5_folder), tmp_path / "out")
    remote = {
        "model_type": "my_lm",
        "auto_map": {"AutoConfig": "configuration_my.MyConfig", "AutoModelForCausalLM": "modeling_my.MyLM"},
    }
    with pytest.raises(
        ModelError, match=r"runs its own modeling code \(modeling_my.MyLM\); set model.trust_remote_code"
    ):
        materialize("remote", _config_only_folder(tmp_path / "remote", remote), tmp_path / "out")
    with pytest.raises(ModelError, match=r"'future_lm' model, an architecture the installed transformers .* does not"):
        materialize("future", _config_only_folder(tmp_path / "future", {"model_type": "future_lm"}), tmp_path / "out")
    no_tokenizer = _save(tmp_path / "bare", FAMILIES["gpt2"][0], tokenizer=False)
    with pytest.raises(ModelError, match=r"model folder '.*bare' holds no tokenizer"):
        materialize("bare", str(no_tokenizer), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _config(**model):
    """config.yaml with `model` keys changed, as `--configfile` merges a user's config over it."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["model"].update(model)
    return config


def test_the_embedded_model_names_are_config_yamls():
    assert _config()["model"]["source"] == EMBEDDED_SOURCE and _config()["model"]["gguf_file"] == EMBEDDED_GGUF


def test_a_gguf_file_the_source_folder_does_not_hold_is_refused_naming_both_keys(tmp_path):
    """At config validation (DAG build) and at load; a safetensors folder once ignored the value."""
    folder = _save(tmp_path / "mine", FAMILIES["gpt2"][0])
    for ggufs in ("none", "mine.gguf"):
        message = (
            f"config key 'model.gguf_file': 'other.gguf' is not in model.source '{folder}' (its GGUF files: {ggufs}); "
            "name one of them, or set model.gguf_file: null to load its *.safetensors / *.bin"
        )
        with pytest.raises(ModelError) as at_validation:
            validate(_config(source=str(folder), gguf_file="other.gguf"))
        with pytest.raises(ModelError) as at_load:
            materialize("m", str(folder), tmp_path / "model", gguf_file="other.gguf")
        assert str(at_validation.value) == str(at_load.value) == message
        (folder / "mine.gguf").write_bytes(b"")


def test_config_yamls_gguf_file_carried_over_to_another_source_is_dropped_with_a_warning(tmp_path, caplog):
    """Configs merge: a config naming another model.source keeps config.yaml's GGUF file name. A source
    without it (a hub id is taken not to hold it: nothing is asked of the network) loads with
    model.gguf_file None and one warning line; a folder holding that file keeps it."""
    folder = _save(tmp_path / "mine", FAMILIES["gpt2"][0])
    for source in (str(folder), "HuggingFaceTB/SmolLM2-135M"):
        config = _config(source=source)
        with caplog.at_level(logging.WARNING, logger="uph.config"):
            validate(config)
        assert config["model"]["gguf_file"] is None
        assert caplog.messages == [
            f"config key 'model.gguf_file': '{EMBEDDED_GGUF}', config.yaml's file of {EMBEDDED_SOURCE}, is not in "
            f"model.source '{source}'; ignoring it (set model.gguf_file: null to silence this warning)"
        ]
        caplog.clear()
    (folder / EMBEDDED_GGUF).write_bytes(b"")
    assert validate(_config(source=str(folder)))["model"]["gguf_file"] == EMBEDDED_GGUF
    assert validate(_config(source="tiny:gpt2"))["model"]["gguf_file"] == EMBEDDED_GGUF  # tiny: ignores it
    assert not caplog.messages


def test_a_truncated_or_unreadable_weights_file_is_refused_in_one_line_naming_the_file(tmp_path):
    """A copy or download that stopped: refused at config validation (DAG build) and at load, from the
    safetensors header alone, before transformers' SafetensorError traceback; no candidate folder."""
    folder = _save(tmp_path / "mine", FAMILIES["gpt2"][0])
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    for cut, needed in ((size - 1000, size), (header - 10, header), (4, 8)):
        os.truncate(weights, cut)
        message = (
            f"config key 'model.source': weights file '{weights}' is truncated ({cut} bytes, its header needs "
            f"{needed}); copy or download it again"
        )
        with pytest.raises(ModelError) as at_validation:
            validate(_config(source=str(folder), gguf_file=None))
        with pytest.raises(ModelError) as at_load:
            materialize("m", str(folder), tmp_path / "model")
        assert str(at_validation.value) == str(at_load.value) == message
    assert not (tmp_path / "model").exists()
    weights.unlink()
    torch.save({"x": torch.zeros(1000)}, folder / "pytorch_model.bin")  # a torch zip checkpoint
    os.truncate(folder / "pytorch_model.bin", 1000)
    with pytest.raises(ModelError, match=r"^config key 'model.source': weights file '.*pytorch_model.bin' is trunc"):
        validate(_config(source=str(folder), gguf_file=None))
    (folder / "pytorch_model.bin").unlink()
    weights.write_text("<!DOCTYPE html><title>502 Bad Gateway</title>")  # a proxy's error page, downloaded
    with pytest.raises(ModelError, match=r"^config key 'model.source': weights file '.*' is damaged \(its header "):
        validate(_config(source=str(folder), gguf_file=None))
    weights.unlink()
    weights.mkdir()  # a path that open() refuses even to root, who reads every file
    with pytest.raises(ModelError) as unreadable:
        validate(_config(source=str(folder), gguf_file=None))
    assert str(unreadable.value) == (
        f"config key 'model.source': weights file '{weights}' cannot be read (Is a directory); make it readable "
        "or copy it again"
    )


def test_a_folder_materialized_before_the_parity_check_is_refused(tmp_path):
    materialize("m", str(_save(tmp_path / "mine", FAMILIES["gpt2"][0])), tmp_path / "model")
    identity = json.loads((tmp_path / "model" / IDENTITY).read_text())
    del identity["parity"], identity["logit_transform"]
    (tmp_path / "model" / IDENTITY).write_text(json.dumps(identity))
    with pytest.raises(ModelError, match="materialized before the logit parity check; delete it and run snakemake"):
        read_output_layer(tmp_path / "model")


def test_models_that_only_seem_causal_lms_are_refused_naming_the_folder_and_the_reason(tmp_path):
    """Admission: a checkpoint missing a tensor (transformers would fill it at random), a BERT folder
    (it loads as BertLMHeadModel, bidirectional: the causal probe sees a later token move an earlier
    position), an encoder-decoder config (BART loads as BartForCausalLM otherwise), and a tokenizer with
    more ids than the model's vocabulary: each one line naming model.source, no identity written."""
    from safetensors.torch import load_file

    cut = _save(tmp_path / "cut", FAMILIES["gpt_neox"][0])
    weights = load_file(cut / "model.safetensors")
    dropped = next(key for key in sorted(weights) if key.endswith("mlp.dense_h_to_4h.weight"))
    save_file({k: v for k, v in weights.items() if k != dropped}, cut / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"^config key 'model.source': '.*cut' \(GPTNeoXForCausalLM\) has 1 missing "):
        materialize("cut", str(cut), tmp_path / "out-cut")
    bert = tf.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    with pytest.raises(ModelError, match=r"'.*bert' \(BertLMHeadModel\) is not causal: changing later tokens moves"):
        materialize("bert", str(_save(tmp_path / "bert", bert)), tmp_path / "out-bert")
    bart = tf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path / "bart"
    torch.manual_seed(0)
    tf.BartForConditionalGeneration(bart).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    with pytest.raises(ModelError, match=r"'.*bart' is a 'bart' encoder-decoder model, not a causal LM"):
        materialize("bart", str(folder), tmp_path / "out-bart")
    small = tiny_config("gpt2", 200, hidden=32)
    with pytest.raises(ModelError, match=r"its tokenizer has 257 tokens but the model's vocabulary only 200 rows"):
        materialize("small", str(_save(tmp_path / "small", small)), tmp_path / "out-small")
    assert not any((tmp_path / f"out-{name}" / IDENTITY).exists() for name in ("cut", "bert", "bart", "small"))


def test_a_folder_digest_is_its_content_read_once_per_change(tmp_path):
    """The digest of a local model folder counts bytes and relative paths only: a touched or copied
    folder keeps it, and so does a README or a licence added to it (transformers never reads them); one
    changed byte of a file it reads (tokenizer config, weights) changes it; an unchanged file (same size and
    mtime) is not read again, a download tool's hidden files are not read at all."""
    from uph.model_identity import folder_digest

    folder = _save(tmp_path / "models" / "mine", FAMILIES["gpt2"][0])
    cache = tmp_path / "results" / ".hashes.json"
    digest = folder_digest(folder, cache)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "download.lock").write_text("12:00")
    for path in folder.iterdir():
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert folder_digest(folder, cache) == digest
    assert folder_digest(shutil.copytree(folder, tmp_path / "copy"), tmp_path / "other.json") == digest
    weights = folder / "model.safetensors"
    hashes = json.loads(cache.read_text())
    assert sorted(map(os.path.basename, hashes)) == sorted(p.name for p in folder.iterdir() if p.is_file())
    hashes[str(weights.resolve())][2] = "0" * 64  # what the cache says is what is used while size and mtime hold
    cache.write_text(json.dumps(hashes))
    assert folder_digest(folder, cache) != digest
    cache.write_text("{truncated")  # a damaged cache only costs a re-read
    assert folder_digest(folder, cache) == digest
    (folder / "README.md").write_text("# my model")  # what transformers never reads
    (folder / "LICENSE").write_text("MIT")
    assert folder_digest(folder, cache) == digest
    (folder / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text() + " ")
    assert folder_digest(folder, cache) != digest  # what it reads
    changed = folder_digest(folder, cache)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert folder_digest(folder, cache) != changed


def test_only_a_candidate_that_passed_admission_replaces_the_model(tmp_path):
    """install_model_folder swaps a checked candidate in (nothing of the old folder stays); a candidate
    without identity.json (refused, or cut short) is refused and the last good model stays byte for byte."""
    from uph.model_identity import install_model_folder

    model_dir = tmp_path / "results" / "model"
    materialize("a", str(_save(tmp_path / "a", FAMILIES["gpt2"][0])), model_dir)
    (model_dir / "modeling_old.py").write_text("# a trusted model's own code")
    before = {path.name: path.read_bytes() for path in model_dir.iterdir()}
    refused = tmp_path / "results" / "model_candidate-refused"
    shutil.copytree(model_dir, refused)
    (refused / IDENTITY).unlink()
    with pytest.raises(ModelError, match=r"model_candidate-refused' has no identity.json"):
        install_model_folder(refused, model_dir)
    assert {path.name: path.read_bytes() for path in model_dir.iterdir()} == before
    candidate = tmp_path / "results" / "model_candidate-b"
    identity = materialize("b", str(_save(tmp_path / "b", FAMILIES["gpt_neox"][0])), candidate)
    install_model_folder(candidate, model_dir)
    assert json.loads((model_dir / IDENTITY).read_text()) == identity and not candidate.exists()
    assert not (model_dir / "modeling_old.py").exists()
    assert sorted(p.name for p in model_dir.parent.iterdir()) == ["model", "model_candidate-refused"]


def test_a_gguf_file_is_read_once_and_as_gguf_reads_it_while_a_source_loads(tmp_path):
    """Transformers parses a GGUF file for the config, the tokenizer and the weights (uph.lm.data.models
    _gguf_read_once): within the block the same path gives the same reader, whose fields and tensors hold
    what gguf's own reader reads (a string array, numbers, block-quantized tensors); the tensor-name map is
    built once; the metadata comes as equal copies; Q4_1 and Q8_0 blocks de-quantize bit for bit as gguf
    does; after the block, and after an error in it, gguf's and transformers' own are back."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as loader

    from uph.lm.data.models import _gguf_read_once

    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("x", 3)
    writer.add_array("words", ["thou", "art", "ẞ", ""])
    weights = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    quantized = {
        kind: gguf.quantize(weights, kind) for kind in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0)
    }
    writer.add_tensor("t", np.ones((2, 3), dtype=np.float32))
    for kind, blocks in quantized.items():
        writer.add_tensor(kind.name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    own = gguf.GGUFReader(path)
    originals = (
        gguf.GGUFReader,
        gguf.get_tensor_name_map,
        gguf.dequantize,
        loader.load_gguf_checkpoint,
        loader._gguf_parse_value,
    )
    with _gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and first.fields["x"].parts[-1][0] == 3
        for name, field in own.fields.items():
            read = first.fields[name]
            assert (read.data, read.types) == (field.data, field.types), name
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(read.parts, field.parts)), name
        assert [bytes(first.fields["words"].parts[i]).decode() for i in first.fields["words"].data] == [
            "thou",
            "art",
            "ẞ",
            "",
        ]
        for read, tensor in zip(first.tensors, own.tensors, strict=True):
            assert read.name == tensor.name and np.array_equal(read.data, tensor.data)
            expected = originals[2](tensor.data, tensor.tensor_type)
            found = gguf.dequantize(read.data, read.tensor_type)
            assert found.dtype == np.float32 and np.array_equal(found, expected), tensor.name
        assert np.abs(gguf.dequantize(first.tensors[1].data, first.tensors[1].tensor_type) - weights).max() < 0.2
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == originals[:3]
    assert (loader.load_gguf_checkpoint, loader._gguf_parse_value) == originals[3:]
    assert gguf.GGUFReader(path) is not first
    with pytest.raises(ValueError), _gguf_read_once():
        raise ValueError("a refused source")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == originals[:3]
