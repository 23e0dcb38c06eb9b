"""Which CPU kernels torch runs: ATEN_CPU_CAPABILITY caps them, as `make test`'s second pass relies on
(Makefile: AVX2_KERNELS), config `cpu_kernels: avx2` caps them in a job before it imports torch
(uph.job_start, uph.device.cap_cpu_kernels), and every CPU job records them (uph.device.device_record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from uph.device import CPU_KERNEL_CAPS, device_record, kernel_settings

# a workflow job's start (Snakemake's preamble puts `snakemake` in __main__ before the script's first import),
# then torch and the record the job writes
JOB = """
import json, sys
class Job: config = {config}
Job.__module__ = "snakemake.script"
snakemake = Job()
import uph.job_start
import torch
from uph.device import device_record
print(json.dumps(device_record(torch.device("cpu"))))
"""


def test_the_cpu_kernels_follow_aten_cpu_capability_and_jobs_record_them():
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        assert capability == "AVX2"
    record = device_record(torch.device("cpu"))
    assert record["cpu_capability"] == capability and record["threads"] == torch.get_num_threads()
    assert record["kernel_settings"] == kernel_settings()


def job_record(config: dict) -> dict:
    """The device record of a job started with `config`, in a process of its own without any kernel cap set."""
    environment = {k: v for k, v in os.environ.items() if k not in CPU_KERNEL_CAPS["avx2"]}
    job = subprocess.run(
        [sys.executable, "-c", JOB.format(config=repr(config))], env=environment, capture_output=True, text=True
    )
    assert job.returncode == 0, job.stderr
    return json.loads(job.stdout)


def test_config_cpu_kernels_avx2_caps_a_jobs_kernels_before_torch_loads_and_the_job_records_the_caps():
    capped = job_record({"cpu_kernels": "avx2"})
    assert capped["cpu_capability"] == "AVX2"
    assert capped["kernel_settings"] == (
        "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2"
    )
    native = job_record({"cpu_kernels": "native"})
    assert native["kernel_settings"] == "none" and native == job_record({})
