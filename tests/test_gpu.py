"""The CUDA path against the CPU path, on the same inputs: the fit engine (objective, gradient and
curvature of every head and the full bias, and an exact fit's certified optimum), the attention kernels
(triple product and 2-simplicial: values and gradients) and extraction (the cached hidden states); the
attention study's training steps replayed from a CUDA graph against the same steps run eagerly.
Skipped where no CUDA device is present, as in `make test`; `make gpu-check` runs them, then the tiny
study on CUDA against CPU (benchmarks/gpu_check.py, whose comparison is checked here on CPU).

Tolerances: float64 agrees to rounding (1e-10 relative); float32 sums in another order on a GPU, so
agreement is to 1e-5 relative (the effects the study reports are about 1e-3 nats, on NLLs near 5).
TF32 is off (uph.device), else float32 matmuls would keep 10 mantissa bits and miss these."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_attention_runs import TINY
from test_extract import _build_cache, _users
from test_fit import BETA_LAM, HEAD_SETTINGS, D

from uph.attention.model import build_model
from uph.attention.runs import RunAdamW
from uph.attention.self_attention import simplicial_attention, triple_product_attention
from uph.attention.steps import WARMUP, TrainSteps
from uph.attention.tasks import make_batch
from uph.device import device_record, peak_device_memory, setup_device
from uph.lm.data.cache import read_shard
from uph.lm.data.models import OutputLayer
from uph.lm.engine.fit import fit_theta
from uph.lm.engine.heads import HEADS, full_bias_head, make_head
from uph.lm.engine.objective import Objective
from uph.lm.engine.solvers import SolverSettings
from uph.lm.engine.tokens import prepare

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module", autouse=True)
def cuda_as_the_jobs_set_it():
    """TF32 off and deterministic kernels, as uph.logs.rule_logging sets every extract and fit job."""
    if torch.cuda.is_available():
        setup_device("cuda")


CUDA = torch.device("cuda")
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}  # relative, CUDA against CPU


def heads(lm):
    h, y, W, b, svd = lm
    made = {name: make_head(name, W, d=D, alpha=0.5, settings=HEAD_SETTINGS, svd=svd, bias=b) for name in HEADS}
    return {**made, "full_bias": full_bias_head(W, b)}


def close(cuda: torch.Tensor, cpu: torch.Tensor, dtype) -> None:
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * cpu.abs().max())


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", [*HEADS, "full_bias"])
def test_the_fit_engine_on_cuda_computes_what_it_computes_on_cpu(lm, name, dtype):
    h, y, W, b, _ = lm
    head = heads(lm)[name]
    layer = OutputLayer(W.to(dtype), b.to(dtype))
    theta = 0.3 * torch.randn(head.d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    values = {}
    for device in ("cpu", CUDA):
        tokens = prepare(h.to(dtype), y, layer, chunk=64, device=device)
        objective = Objective(tokens, head, *BETA_LAM)
        values[device] = (objective(theta), objective.curvature())
    (cpu, cpu_curvature), (cuda, cuda_curvature) = values["cpu"], values[CUDA]
    assert cuda.objective == pytest.approx(cpu.objective, rel=TOLERANCE[dtype])
    assert (cuda.ce, cuda.kl) == pytest.approx((cpu.ce, cpu.kl), rel=TOLERANCE[dtype], abs=TOLERANCE[dtype])
    close(cuda.grad, cpu.grad, dtype)
    close(cuda_curvature, cpu_curvature, dtype)


@needs_cuda
@pytest.mark.parametrize("name", ["svd_cvh", "full_bias"])
def test_an_exact_fit_on_cuda_reaches_the_cpu_fits_certified_optimum(lm, name):
    h, y, W, b, _ = lm
    head, settings = heads(lm)[name], SolverSettings.defaults(max_iter=2000)
    layer = OutputLayer(W.float(), b.float())
    fits = {
        device: fit_theta(prepare(h.float(), y, layer, device=device), head, "exact", settings)
        for device in ("cpu", CUDA)
    }
    (_, cpu), (theta, cuda) = fits["cpu"], fits[CUDA]
    assert cuda.certificate <= max(settings.tol, 2 * cpu.certificate)  # float32: certified to its noise floor
    assert cuda.objective == pytest.approx(cpu.objective, rel=1e-6)
    torch.testing.assert_close(theta.cpu(), fits["cpu"][0], rtol=1e-3, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("attention", [triple_product_attention, simplicial_attention])
def test_the_attention_kernels_on_cuda_compute_what_they_compute_on_cpu(attention, dtype):
    generator = torch.Generator().manual_seed(4)
    q, k, r, v = (torch.randn(2, 3, 16, 8, dtype=dtype, generator=generator) for _ in range(4))
    weights = torch.randn(2, 3, 16, 8, dtype=dtype, generator=generator)
    results = {}
    for device in ("cpu", CUDA):
        inputs = [x.to(device).requires_grad_() for x in (q, k, r, v)]
        out = attention(*inputs)
        results[device] = (out, *torch.autograd.grad((out * weights.to(device)).sum(), inputs))
    for cuda, cpu in zip(results[CUDA], results["cpu"]):
        close(cuda.detach(), cpu.detach(), dtype)


def graph_steps(attention: str, graphs: bool, steps: int, keep_at: int | None = None, measure_at: int | None = None):
    """`steps` steps of three runs (lrs 0.01, 0.003, 0.01; run 1 leaves at step `keep_at`) through
    TrainSteps on CUDA: (each step's losses, the final weights, the TrainSteps)."""
    model = build_model("residual", attention, TINY, [0, 1, 2]).to(CUDA)
    trainer = TrainSteps(model, RunAdamW(model, [0.01, 0.003, 0.01], 0.1), 1.0, CUDA, graphs)
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    losses = []
    for step in range(steps):
        if step == keep_at:
            trainer.keep_runs(torch.tensor([0, 2], device=CUDA))
            generators = [generators[0], generators[2]]
        batches = [make_batch("loud_copy", TINY, 4, TINY.train_len, generator) for generator in generators]
        loss, _ = trainer(batches, 0.5, measure=step == measure_at)
        losses.append(loss.clone())  # a replay's losses are its graph's output, rewritten by the next
    torch.cuda.synchronize()
    return torch.cat(losses).cpu(), trainer.optimizer.flat.cpu(), trainer


@needs_cuda
@pytest.mark.parametrize("attention", ["standard", "triple_capped", "diff"])
def test_training_steps_replayed_on_cuda_from_a_graph_are_the_eager_steps(attention):
    """A replay runs the eager step's kernels on the same buffers: through the warm-up steps, a capture,
    replays, a logging step run eagerly between them, a run leaving the batch and the second capture after
    it, the losses and weights are the eager steps'. Bit for bit where the eager steps repeat bit for bit;
    the training rules run without deterministic kernels (uph.device.TRAINING_RULES: SDPA's and the
    embedding's backward add with atomics), so where two eager runs differ, the replays may differ from them
    by as much: float32 sums in another order, about 1e-7 of a value a step, grown over 12 AdamW steps of
    at most lr = 0.01 each to well under the 1e-5 held here (a wrong replay, a stale input or scalar, moves
    a loss by 1e-3 or more)."""
    eager_losses, eager_weights, _ = graph_steps(attention, False, 12, keep_at=8, measure_at=5)
    again_losses, again_weights, _ = graph_steps(attention, False, 12, keep_at=8, measure_at=5)
    losses, weights, trainer = graph_steps(attention, True, 12, keep_at=8, measure_at=5)
    assert trainer.captured == 2 and trainer.replayed == 12 - 2 * WARMUP - 1
    if torch.equal(again_losses, eager_losses) and torch.equal(again_weights, eager_weights):
        assert torch.equal(losses, eager_losses) and torch.equal(weights, eager_weights)
    else:
        torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(weights, eager_weights, rtol=0, atol=1e-5)


@needs_cuda
def test_a_training_step_replayed_on_cuda_is_one_launch():
    """The profiler's CUDA runtime calls over 4 steps: a replayed step launches one graph and no kernel
    of its own (its inputs arrive by copies); an eager step launches hundreds."""
    from torch.profiler import ProfilerActivity, profile

    launches = {}
    for graphs in (False, True):
        *_, trainer = graph_steps("triple_capped", graphs, WARMUP + 1)
        generator = torch.Generator().manual_seed(9)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                trainer([make_batch("loud_copy", TINY, 4, TINY.train_len, generator) for _ in range(3)], 0.5)
            torch.cuda.synchronize()
        names = [event.name for event in prof.events()]
        launches[graphs] = (names.count("cudaLaunchKernel") / 4, names.count("cudaGraphLaunch") / 4)
    assert launches[True] == (0, 1) and launches[False][0] > 100, launches


@needs_cuda
def test_extraction_on_cuda_caches_the_states_extraction_on_cpu_caches(tiny_model_dir, tmp_path):
    model_dir, users, context = tiny_model_dir("llama"), _users(n_users=2), 16
    shards = {}
    for device in ("cpu", CUDA):
        path = tmp_path / f"{device}.parquet"
        expect = _build_cache(model_dir, path, users, context, device=device)
        shards[device] = read_shard(path, expect)
    for user, cpu in shards["cpu"].items():
        cuda = shards[CUDA][user]
        assert torch.equal(cuda.train_targets, cpu.train_targets) and torch.equal(cuda.test_targets, cpu.test_targets)
        close(cuda.train_hidden, cpu.train_hidden, torch.float32)
        close(cuda.test_hidden, cpu.test_hidden, torch.float32)


SPEC = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
)
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)


def test_the_gpu_check_passes_a_run_against_itself_and_names_each_departure(tiny_study, tmp_path):
    """gpu_check compares with uph.compare (tests/test_compare.py holds its tolerances), and a CPU-only
    branch's table byte for byte."""
    cpu = tiny_study.workdir / "results"
    assert gpu_check.compare_runs(cpu, cpu) == []
    cuda = tmp_path / "results"
    shutil.copytree(cpu / "tables", cuda / "tables")
    shutil.copy(cpu / "provenance.json", cuda)
    personalization = pd.read_csv(cpu / "tables" / "personalization.csv")
    personalization.loc[1, "delta_nll"] += 1e-3  # beyond uph.compare's NLL tolerance
    personalization.to_csv(cuda / "tables/personalization.csv", index=False)
    with open(cuda / "tables/feedback.csv", "a") as f:
        f.write("\n")
    problems = gpu_check.compare_runs(cpu, cuda)
    assert problems[0].startswith("personalization [") and " delta_nll: " in problems[0]
    assert problems[-1] == "feedback: ran on CPU in both runs, yet its bytes differ"


@needs_cuda
def test_a_cuda_jobs_record_holds_its_peak_device_memory():
    """uph.device.peak_device_memory, which every CUDA job logs and records when it ends (uph.logs): a 256 MiB
    tensor held once shows in both peaks; a CPU job's record gets none."""
    torch.cuda.reset_peak_memory_stats()
    held = torch.empty(64 * 2**20, dtype=torch.float32, device=CUDA)
    del held
    peak = peak_device_memory(device_record(CUDA))
    assert peak["peak_allocated_mib"] >= 256 and peak["peak_reserved_mib"] >= peak["peak_allocated_mib"]
    assert peak_device_memory(device_record(torch.device("cpu"))) == {}
