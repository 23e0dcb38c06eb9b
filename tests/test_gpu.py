"""The CUDA path against the CPU path, on the same inputs: the fit engine (objective, gradient and
curvature of every head and the full bias, and an exact fit's certified optimum), the attention kernels
(triple product and 2-simplicial: values and gradients) and extraction (the cached hidden states).
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
from test_extract import _build_cache, _users
from test_fit import BETA_LAM, HEAD_SETTINGS, D

from uph.attention.self_attention import simplicial_attention, triple_product_attention
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
