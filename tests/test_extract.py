import numpy as np
import pandas as pd
import pytest
import torch

from uph.config import CPU_BATCH, GPU_BATCH_TOKENS, batch_windows
from uph.errors import CacheError, ModelError
from uph.lm.data.cache import cache_identity, read_shard, shard_manifest, shard_of, shard_writer
from uph.lm.data.extract import extract_users, user_groups, user_windows
from uph.lm.data.models import load_model, materialize, read_output_layer
from uph.model_identity import read_identity
from uph.splits import temporal_split


def _users(n_users=2, n_tokens=150, vocab=257, context=16, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        split = temporal_split(n_tokens + 10 * u, 0.8, gap=context)
        rows.append(
            (
                f"user{u}",
                split.n_tokens,
                split.train_end,
                split.test_start,
                rng.integers(0, vocab, split.n_tokens).tolist(),
            )
        )
    return pd.DataFrame(rows, columns=["user_id", "n_tokens", "train_end", "test_start", "tokens"])


def _build_cache(model_dir, path, users, context, dtype=torch.float32, batch_size=3, device="cpu"):
    """One shard holding every user of `users`, extracted on `device`; returns what a reader of it expects."""
    device = torch.device(device)
    model = load_model(model_dir, dtype=dtype, device=device)
    expect = {**cache_identity(read_identity(model_dir), dtype, context), **shard_manifest(users, 0, 1)}
    with shard_writer(path, expect, shard_manifest(users, 0, 1)) as write:
        extract_users(model, users, context, batch_size, device, write)
    return expect


def test_windows_cover_each_region_target_once():
    tokens = np.arange(100)
    windows = user_windows("u", tokens, train_end=70, test_start=86, context=16)
    for split, lo, hi in (("train", 0, 70), ("test", 86, 100)):
        firsts = [w.first + i for w in windows if w.split == split for i in range(len(w.inputs))]
        assert firsts == list(range(lo + 1, hi))  # every region token but the first, once, in order
    assert all(len(w.inputs) <= 16 for w in windows)


def _extracted(model_dir, users, context, batch_size, across_users):
    """{(user, split): (positions, targets, hidden)} as extract_users writes them, on the CPU."""
    written = {}

    def write(user_id, split, positions, targets, hidden):
        written[user_id, split] = (positions, targets, hidden)

    extract_users(load_model(model_dir), users, context, batch_size, torch.device("cpu"), write, across_users)
    return written


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_device_sized_batches_match_one_window_at_a_time(tiny_model_dir, arch):
    """The CUDA plan (batch_size null on CUDA: GPU_BATCH_TOKENS of windows, users batched together), run
    here on the CPU, gives the states of one window per forward pass, to float32 rounding: every state
    within 1e-5 (relative) + 1e-5 (absolute) of the other, the positions and targets equal."""
    context = 16
    users = _users(n_users=5, n_tokens=120, context=context)  # 8-9 windows a user, short last ones included
    gpu_batch = batch_windows(None, context, "cuda")
    assert gpu_batch == GPU_BATCH_TOKENS // context
    one = _extracted(tiny_model_dir(arch), users, context, 1, across_users=False)
    together = _extracted(tiny_model_dir(arch), users, context, gpu_batch, across_users=True)
    assert list(together) == list(one)  # written user by user, train before test
    for key, (positions, targets, hidden) in one.items():
        assert np.array_equal(together[key][0], positions) and np.array_equal(together[key][1], targets)
        torch.testing.assert_close(together[key][2], hidden, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def _by_hand(model, user, context: int, batch: int) -> dict:
    """{split: hidden [targets, H]} of one user computed here, not by uph.lm.data.extract: the user's windows of
    `context` inputs per region (train [0, train_end), test [test_start, n)), longest first (stable), `batch`
    at a time right-padded with id 0, each through the model's body (`model.model`: its last hidden state,
    the head's input for a llama), the rows cut back to their windows."""
    tokens = np.asarray(user.tokens)
    windows = [
        (split, tokens[s : min(s + context, hi - 1)])
        for split, lo, hi in (("train", 0, user.train_end), ("test", user.test_start, user.n_tokens))
        for s in range(lo, hi - 1, context)
    ]
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][1]))
    states = [None] * len(windows)
    for b in range(0, len(order), batch):
        rows = order[b : b + batch]
        ids = torch.zeros(len(rows), len(windows[rows[0]][1]), dtype=torch.long)
        for row, i in enumerate(rows):
            ids[row, : len(windows[i][1])] = torch.from_numpy(windows[i][1])
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        for row, i in enumerate(rows):
            states[i] = hidden[row, : len(windows[i][1])]
    return {split: torch.cat([h for (s, _), h in zip(windows, states) if s == split]) for split in ("train", "test")}


def test_cpu_default_batch_is_todays_and_keeps_its_bytes(tiny_model_dir, tmp_path):
    """`extract.batch_size: null` on a CPU is CPU_BATCH = 16 windows a user alone, as the CPU caches have
    always been built: the shard holds, bit for bit, the states of each user's windows computed by hand
    16 at a time (`_by_hand`, independent of uph.lm.data.extract). On CUDA users are gathered until they fill a
    batch."""
    from uph.config import schema_defaults

    assert schema_defaults("extract")["batch_size"] is None
    assert batch_windows(None, 128, torch.device("cpu")) == CPU_BATCH == 16
    assert batch_windows(None, 128, "cuda") == 256 and batch_windows(7, 128, "cuda") == 7
    assert list(user_groups([3, 20, 2], 16, across_users=False)) == [range(0, 1), range(1, 2), range(2, 3)]
    assert list(user_groups([3, 20, 2, 2, 40, 1], 8, across_users=True)) == [range(0, 2), range(2, 5), range(5, 6)]
    model_dir, users = tiny_model_dir("llama"), _users(n_users=3, n_tokens=300)  # 17-19 windows a user: 2 batches
    identity = _build_cache(model_dir, tmp_path / "default.parquet", users, 16, batch_size=None)
    cached, model = read_shard(tmp_path / "default.parquet", identity), load_model(model_dir)
    for user in users.itertuples():
        by_hand = _by_hand(model, user, 16, batch=16)
        assert torch.equal(cached[user.user_id].train_hidden, by_hand["train"]), user.user_id
        assert torch.equal(cached[user.user_id].test_hidden, by_hand["test"]), user.user_id


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cached_hidden_through_output_layer_reproduces_model_logits(tiny_model_dir, tmp_path, arch):
    model_dir, context = tiny_model_dir(arch), 16
    users = _users(context=context)
    identity = _build_cache(model_dir, tmp_path / "shard.parquet", users, context)
    cached = read_shard(tmp_path / "shard.parquet", identity)
    model = load_model(model_dir)
    layer = read_output_layer(model_dir)
    for row in users.itertuples():
        tokens = torch.tensor(row.tokens)
        states = cached[row.user_id]
        for split, lo, hi, hidden, targets in (
            ("train", 0, row.train_end, states.train_hidden, states.train_targets),
            ("test", row.test_start, row.n_tokens, states.test_hidden, states.test_targets),
        ):
            assert torch.equal(targets, tokens[lo + 1 : hi])
            # the model's own logits, window by window, with the full LM head
            logits = torch.cat(
                [model(tokens[s : min(s + context, hi - 1)][None]).logits[0] for s in range(lo, hi - 1, context)]
            )
            ours = layer.logits(hidden)
            rel = (ours - logits).norm() / logits.norm()
            assert rel < 1e-4, f"{arch} {split}: relative error {rel:.2e}"


def test_bfloat16_cache_round_trips_exactly(tiny_model_dir, tmp_path):
    model_dir, users = tiny_model_dir("llama"), _users(n_users=1)
    identity = _build_cache(model_dir, tmp_path / "s.parquet", users, 16, dtype=torch.bfloat16)
    states = read_shard(tmp_path / "s.parquet", identity)["user0"]
    model = load_model(model_dir, dtype=torch.bfloat16)
    tokens = torch.tensor(users.tokens[0][:16])[None]
    direct = model.base_model(input_ids=tokens).last_hidden_state[0, :15]
    assert states.train_hidden.dtype == torch.bfloat16
    assert torch.equal(states.train_hidden[:15], direct)


def test_cache_rejects_another_model_or_setting(tiny_model_dir, tmp_path):
    users = _users(n_users=1)
    llama = _build_cache(tiny_model_dir("llama"), tmp_path / "s.parquet", users, 16)
    gpt2 = {**llama, **cache_identity(read_identity(tiny_model_dir("gpt2")), torch.float32, 16)}
    with pytest.raises(CacheError, match=r"s.parquet' was built for something else: weights_sha256="):
        read_shard(tmp_path / "s.parquet", gpt2)
    with pytest.raises(CacheError, match=r"context=16 \(expected 32\)"):
        read_shard(tmp_path / "s.parquet", {**llama, "context": 32})
    with pytest.raises(CacheError, match=r"dtype='float32' \(expected 'bfloat16'\)"):
        read_shard(tmp_path / "s.parquet", {**llama, "dtype": "bfloat16"})
    assert read_shard(tmp_path / "s.parquet", {**llama, "dtype": "auto"}).keys() == {"user0"}  # as auto resolved


def test_damaged_cache_is_detected(tiny_model_dir, tmp_path):
    identity = _build_cache(tiny_model_dir("llama"), tmp_path / "s.parquet", _users(n_users=1), 16)
    data = (tmp_path / "s.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheError, match="cut.parquet' is damaged or truncated"):
        read_shard(tmp_path / "cut.parquet", identity)
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF  # inside a data page: the page checksum no longer matches
    (tmp_path / "edit.parquet").write_bytes(bytes(flipped))
    with pytest.raises(CacheError, match="edit.parquet' is damaged"):
        read_shard(tmp_path / "edit.parquet", identity)


def test_failed_extraction_leaves_no_shard(tiny_model_dir, tmp_path):
    identity = cache_identity(read_identity(tiny_model_dir("llama")), torch.float32, 16)
    with pytest.raises(RuntimeError):
        with shard_writer(tmp_path / "s.parquet", identity, shard_manifest(_users(), 0, 1)):
            raise RuntimeError("killed midway")
    assert list(tmp_path.iterdir()) == []


def test_shards_are_stable_and_spread():
    assert shard_of("hamlet/Hamlet", 4) == 2  # crc32: the same on every machine and run
    counts = np.bincount([shard_of(f"play/role{i}", 4) for i in range(400)], minlength=4)
    assert counts.min() > 70


def test_model_sources_fail_with_one_clear_line(tmp_path):
    with pytest.raises(ModelError, match="'/no/such/folder' is neither a local folder nor a hub id"):
        materialize("m", "/no/such/folder", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="model folder '.*empty' holds no weights"):
        materialize("m", str(tmp_path / "empty"), tmp_path / "out")
    with pytest.raises(ModelError, match="package 'no_such_package' is not installed"):
        materialize("m", "package:no_such_package", tmp_path / "out")
    with pytest.raises(ModelError, match="unknown tiny architecture 'tiny:mamba'"):
        materialize("m", "tiny:mamba", tmp_path / "out")
