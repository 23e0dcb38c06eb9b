"""Which CPU kernels torch runs: ATEN_CPU_CAPABILITY caps them, as `make test`'s second pass relies on
(Makefile: AVX2_KERNELS), and every CPU job records them (uph.device.device_record)."""

from __future__ import annotations

import os

import torch

from uph.device import device_record


def test_the_cpu_kernels_follow_aten_cpu_capability_and_jobs_record_them():
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        assert capability == "AVX2"
    record = device_record(torch.device("cpu"))
    assert record["cpu_capability"] == capability and record["threads"] == torch.get_num_threads()
