"""The device, compute dtype and numerics of every job, and the record of them each job leaves.

Torch is imported inside the functions that compute with it: the DAG build asks `requests_gpu` and
`branch_device`, and the torch-free jobs (tables, aggregate) write their record with `host_record`,
neither loading torch.

Where each branch computes. `device` (auto | cpu | cuda; auto: cuda when the job's machine has one)
is the default of extraction (`extract.device`) and of the fit stage (`fit.device`); the small training
runs (`copy_task.device`, `attention.device`, `feedback.device`) run on cpu unless their key says
otherwise: tiny models that would only queue on a GPU. A job whose device is cuda, or auto where the
machine building the DAG sees a GPU (`gpu_visible`), asks Snakemake for resource `gpu: 1`.

Precision. The personalization effects the study reports are about 1e-3 nats; bfloat16 hidden states
move a base NLL by 3e-3 to 1e-2, and TF32 matmuls (10 mantissa bits) move float32 NLLs by more than
the effects. So `extract.dtype` is float32 by default, `auto` means bfloat16 only where the hardware
computes it natively and float32 elsewhere (never float16), and `setup_device` turns TF32 off on CUDA.

Determinism. On CPU every job repeats bit for bit: the same config and inputs give the same bytes
(tests/test_aggregate.py runs the tiny study twice; tests/test_reliability.py reruns parts of it). On
CUDA, extraction and the fit stage run with deterministic kernels (`torch.use_deterministic_algorithms`
with warn_only: an op without one warns; and `CUBLAS_WORKSPACE_CONFIG=:4096:8`), so they repeat bit for
bit on one GPU model and software stack (not yet checked on a GPU), and agree with the CPU to rounding
(float32 sums in another order: tests/test_gpu.py).
The training runs (copy task, attention study, feedback) train through standard attention's fused SDPA
backward and embedding backward, which accumulate with atomics on CUDA: there they repeat only to a
tolerance, not bit for bit, and on cpu (their default) bit for bit.
"""

from __future__ import annotations

import glob
import os
import platform
import socket
from importlib.util import find_spec
from pathlib import Path

from uph.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")  # config key `device`
BRANCH_DEVICES = (None, *DEVICES)  # config keys `<branch>.device`: None is the branch's default
DTYPES = ("auto", "float32", "bfloat16", "float16")  # config key `extract.dtype`
# The device of each branch's jobs when its `<branch>.device` key is null: None follows the top-level `device`.
BRANCH_DEFAULTS = {"extract": None, "fit": None, "copy_task": "cpu", "attention": "cpu", "feedback": "cpu"}
# Rules whose CUDA kernels include some without a deterministic version (SDPA and embedding backward):
# they run without torch's deterministic mode and repeat on CUDA only to a tolerance.
TRAINING_RULES = ("copy_task_train", "attention_lr", "attention_train", "feedback_train")
# The branch whose device each rule's jobs compute on (branch_device); rules not named use no torch device.
FIT_RULES = ("fit_global", "fit_global_unigram", "fit_global_neural_cache", "validate", "fit", "fit_others")
RULE_BRANCHES = {
    "extract": "extract",
    "copy_task_train": "copy_task",
    "attention_lr": "attention",
    "attention_train": "attention",
    "feedback_train": "feedback",
    **dict.fromkeys((*FIT_RULES, "cross_user", "cross_user_headline"), "fit"),
}
CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's deterministic workspace (read when its first handle is made)


def branch_device(config: dict, branch: str) -> str:
    """The device `branch`'s jobs compute on (auto | cpu | cuda): its `<branch>.device`, else BRANCH_DEFAULTS."""
    return config[branch].get("device") or BRANCH_DEFAULTS[branch] or config["device"]


def job_device(rule: str, config: dict) -> str | None:
    """The configured device (auto | cpu | cuda) of a job of `rule`, from the run's config; None for a rule
    that computes on no torch device. Not a param: a device moves rounding only, so changing it reruns no
    job (uph.records)."""
    branch = RULE_BRANCHES.get(rule)
    return None if branch is None else branch_device(config, branch)


def gpu_visible() -> bool:
    """Whether this machine can run a CUDA job, without importing torch: an NVIDIA device file
    (/dev/nvidia0, /dev/nvidia1, ...) that CUDA_VISIBLE_DEVICES does not hide (empty or -1), and a
    CUDA build of torch (torch/lib/libtorch_cuda.so; the CPU wheel has none)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    if not glob.glob("/dev/nvidia[0-9]*"):
        return False
    spec = find_spec("torch")
    folders = spec.submodule_search_locations if spec is not None else None
    return any(glob.glob(os.path.join(folder, "lib", "libtorch_cuda*")) for folder in folders or [])


def requests_gpu(device: str) -> bool:
    """Whether a job of configured device `device` asks for a GPU: cuda, or auto where `gpu_visible`."""
    return device == "cuda" or (device == "auto" and gpu_visible())


def resolve_device(name: str = "auto"):
    """'auto' -> cuda when present, else cpu; 'cuda' without a GPU is an error naming the key."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config key 'device' is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


def bfloat16_native(device) -> bool:
    """Whether `device` computes bfloat16 in hardware: a CUDA GPU with bfloat16 units (Ampere or later,
    not emulated), or a CPU with AVX512-BF16 or AMX. Elsewhere bfloat16 is emulated, several times
    slower than float32 on AVX2-only CPUs."""
    import torch

    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, check, lambda: False)() for check in checks)
    return False


def resolve_dtype(name: str, device):
    """The compute dtype of `extract.dtype` on `device`: 'auto' -> bfloat16 where `bfloat16_native`,
    else float32 (never float16: its range overflows on large activations)."""
    import torch

    if name == "auto":
        return torch.bfloat16 if bfloat16_native(device) else torch.float32
    return getattr(torch, name)


def setup_device(name: str, deterministic: bool = True):
    """Resolve the configured device `name` and set this process's numerics for it, once per job
    (uph.logs.rule_logging does, for every job with a `device` param). On CUDA: TF32 off for matmuls
    and cuDNN, float32 matmuls at 'highest' precision, and with `deterministic` (every job but
    TRAINING_RULES) torch's deterministic kernels (warn_only: an op without one warns and runs) with
    cuBLAS's deterministic workspace, and without it torch's default kernels. On CPU nothing changes (the
    CPU path's bytes stay as they were)."""
    if name != "cpu":  # before CUDA makes its first cuBLAS handle
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    device = resolve_device(name)
    if device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    return device


def cpuinfo_fields() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo ('model name', 'flags', 'vendor_id', ...); {} where there is none."""
    cpuinfo = Path("/proc/cpuinfo")
    fields = {}
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if not line.strip():
                break  # the end of the first CPU's block
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    return cpuinfo_fields().get("model name") or platform.processor() or platform.machine()


# Config key `cpu_kernels`: the vector instructions torch's CPU kernels may use. `native`: what the CPU has
# (AVX512 on most of our machines); `avx2`: at most AVX2, for ATen's own kernels, MKL (its instructions, and
# its conditional numerical reproducibility, which fixes its code path and so its summation order) and
# oneDNN, the kernels every x86 CPU of the last decade runs alike, so that runs on two vendors' CPUs can be
# held to the same bytes (uph.compare's exact mode). Set in a job's environment before torch is imported.
CPU_KERNEL_CAPS = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
}
KERNEL_SETTINGS = tuple(CPU_KERNEL_CAPS["avx2"])  # the environment variables that cap the CPU kernels


def cap_cpu_kernels(config: dict) -> None:
    """Set the environment that caps torch's CPU kernels as config `cpu_kernels` says; a job runs it before
    it imports torch (uph.job_start), and its jobs' processes inherit it. `native` leaves the environment as
    it is (a cap set there by hand stays, and is recorded)."""
    os.environ.update(CPU_KERNEL_CAPS[config.get("cpu_kernels", "native")])


def kernel_caps() -> dict[str, str]:
    """The caps (KERNEL_SETTINGS) set in this process's environment, by name."""
    return {name: os.environ[name] for name in KERNEL_SETTINGS if name in os.environ}


def kernel_settings() -> str:
    """kernel_caps as a job records them, 'NAME=value ...'; 'none' without any."""
    return " ".join(f"{name}={value}" for name, value in kernel_caps().items()) or "none"


def cpu_description() -> str:
    """This machine's CPU (cpu_model) with the vector extensions that change float32 kernels."""
    fields = cpuinfo_fields()
    if not fields:
        return f"{cpu_model()} (vector extensions unknown)"
    flags = fields.get("flags", "").split()
    vector = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if flag in flags]
    return f"{cpu_model()} ({', '.join(vector) or 'no AVX2'})"


def cpu_identity() -> str:
    """The CPU's vendor, family, model and stepping (/proc/cpuinfo): what tells two CPU generations apart
    where a virtual machine names both alike ('AMD EPYC'); 'unknown' where not readable."""
    fields = cpuinfo_fields()
    wanted = ("vendor_id", "cpu family", "model", "stepping")
    if not all(key in fields for key in wanted):
        return "unknown"
    return "{} family {} model {} stepping {}".format(*(fields[key] for key in wanted))


def machine_record() -> dict:
    """The machine a run's record is written on: its CPU and vector extensions, its vendor, family, model and
    stepping, logical cores, and the settings that cap torch's CPU kernels below what the CPU has
    (KERNEL_SETTINGS, where set)."""
    return {
        "cpu": cpu_description(),
        "cpu_identity": cpu_identity(),
        "logical_cores": os.cpu_count(),
        "kernel_settings": kernel_caps(),
    }


def host_record() -> dict:
    """What a job that computes without torch ran on: its host and CPU."""
    return {"host": socket.gethostname(), "device": "cpu", "device_name": cpu_model()}


def device_record(device, dtype=None) -> dict:
    """What a torch job computes on and how: its host, the device and its name (the GPU's or the
    CPU's model), the float32 matmul precision, on the CPU the kernels torch runs and its threads, on CUDA whether TF32 and deterministic kernels are on,
    and the job's compute dtype where it has one."""
    import torch

    record = {**host_record(), "device": device.type, "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device.type == "cpu":  # the kernels torch dispatches to (AVX512, AVX2, ...), their caps and its threads
        record.update(
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            kernel_settings=kernel_settings(),
            threads=torch.get_num_threads(),
        )
    if device.type == "cuda":
        record.update(
            device_name=torch.cuda.get_device_name(device),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32,
            deterministic=torch.are_deterministic_algorithms_enabled(),
        )
    if dtype is not None:
        record["dtype"] = str(dtype).removeprefix("torch.")
    return record


def peak_device_memory(record: dict) -> dict:
    """A CUDA job's peak device memory in MiB, as torch's caching allocator saw it over the whole job:
    what its tensors held at most (`peak_allocated_mib`) and what it reserved from the GPU at most
    (`peak_reserved_mib`: what a GPU shared by several jobs must have room for). Empty on a CPU."""
    if record["device"] != "cuda":
        return {}
    import torch

    return {
        "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20),
        "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20),
    }


def describe(record: dict) -> str:
    """One log line of a job's record."""
    line = f"on {record['host']}: {record['device']} ({record['device_name']})"
    if "dtype" in record:
        line += f", {record['dtype']}"
    if "float32_matmul_precision" in record:
        line += f", float32 matmuls at '{record['float32_matmul_precision']}' precision"
    if record["device"] == "cuda":
        tf32 = "on" if record["tf32_matmul"] or record["tf32_cudnn"] else "off"
        kernels = "deterministic" if record["deterministic"] else "nondeterministic"
        line += f", TF32 {tf32}, {kernels} kernels"
    return line


HOST_READS = ("__bool__", "__float__", "__int__", "item", "tolist", "nonzero", "cpu")  # Tensor methods that read back


def count_host_reads(function, *args, **kwargs) -> tuple[object, int]:
    """function(*args, **kwargs) and how many times it read a tensor's values back to the host (a call of
    one of HOST_READS: on a GPU, each waits for the device; on a CPU `cpu()` is counted too). For tests and
    benchmarks: it patches torch.Tensor while it runs, in this thread's process."""
    import torch

    count = 0

    def counted(method):
        def read(*args, **kwargs):
            nonlocal count
            count += 1
            return method(*args, **kwargs)

        return read

    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    try:
        for name, method in originals.items():
            setattr(torch.Tensor, name, counted(method))
        result = function(*args, **kwargs)
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    return result, count


DEVICE_PART = "uph: device part"  # the profiler range of a round's device work (uph.lm.engine.round, .objective)


def count_dispatched_ops(function, *args, **kwargs) -> tuple[object, int]:
    """function(*args, **kwargs) and how many operations it dispatched in its device part (torch.profiler: the
    aten operations called from Python within a DEVICE_PART range, not those they call in turn; on a GPU,
    a kernel launch or more each; the host's float64 steps on each user's values are outside). For tests
    and benchmarks."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        result = function(*args, **kwargs)

    def counted(event) -> bool:
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent and parent.name.startswith("aten::")):
            return False
        while parent is not None and parent.name != DEVICE_PART:
            parent = parent.cpu_parent
        return parent is not None

    return result, sum(counted(event) for event in profile.events())
