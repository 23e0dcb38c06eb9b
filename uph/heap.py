"""Freed memory kept for the next tensor, not handed back to the kernel and faulted in again.

Torch allocates a CPU tensor with the C library's malloc and frees it with free. glibc serves a block of
at least M_MMAP_THRESHOLD bytes (128 KiB at start, rising with the largest block freed) with its own mmap,
unmapped at free, and gives the top of its heap back once more than M_TRIM_THRESHOLD bytes there are free.
A training step or a fit pass allocates and frees the same few MB tensors again and again, so each
allocation maps fresh pages that the kernel zeroes one 4 KiB page fault at a time (what that costs, and
what this saves: docs/performance.md, "The heap").

    keep_freed_memory():  M_MMAP_THRESHOLD = 32 MiB (glibc's largest; larger blocks are still mapped)
                          M_TRIM_THRESHOLD = 1 GiB

The heap then grows to a job's peak and stays there: its peak resident memory is what it was. Allocation
moves no number: every tensor holds what it held. Only glibc has these settings (mallopt); elsewhere
(macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's maximum: HEAP_MAX_SIZE / 2 on 64-bit
TRIM_THRESHOLD = 2**30


def glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None where the C library is another."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds (module docstring) for this process; whether they were set."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
