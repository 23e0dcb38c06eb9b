"""Device and compute-dtype selection shared by every stage."""
from __future__ import annotations

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when present, else cpu; 'cuda' without a GPU is an error naming the key."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config key 'device' is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 where the device supports it (CPUs and recent GPUs), else float32."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16
    return getattr(torch, name)
