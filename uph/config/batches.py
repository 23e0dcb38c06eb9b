"""Extraction's batch size: `extract.batch_size`, or where it is null one that suits the device."""

from __future__ import annotations

CPU_BATCH = 16  # windows per extraction forward pass on a CPU where extract.batch_size is null
GPU_BATCH_TOKENS = 32_768  # tokens per forward pass on CUDA where it is null: 256 windows of 128, 128 of 256


def batch_windows(batch_size: int | None, context: int, device) -> int:
    """Windows per extraction forward pass (uph.lm.data.extract): `extract.batch_size`, or where it is null
    CPU_BATCH on a CPU and GPU_BATCH_TOKENS // context (at least 1) on CUDA (`device`: a name or a
    torch.device)."""
    if batch_size is not None:
        return batch_size
    if str(device).split(":")[0] == "cuda":
        return max(1, GPU_BATCH_TOKENS // context)
    return CPU_BATCH
