"""Device and compute-dtype selection shared by every stage."""

from __future__ import annotations

import torch

from uph.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")  # config key `device`
DTYPES = ("auto", "float32", "bfloat16", "float16")  # config key `extract.dtype`


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when present, else cpu; 'cuda' without a GPU is an error naming the key."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config key 'device' is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 where the hardware computes it natively, else float32.

    CPUs without bfloat16 instructions (AVX512-BF16 or AMX; e.g. AVX2-only machines) emulate it
    and run bfloat16 matmuls several times slower than float32, so there float32 is the fast choice.
    """
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    return getattr(torch, name)
