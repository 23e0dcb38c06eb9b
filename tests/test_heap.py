"""uph.heap: a job's freed blocks stay in the heap for the next ones instead of being faulted in again."""

import subprocess
import sys

import pytest

from uph.heap import glibc

# Ten 3 MiB blocks allocated with malloc (as torch allocates a CPU tensor), written and freed, five times: the
# page faults of the last four rounds, in a process of its own, with or without keep_freed_memory first.
ROUNDS = """
import ctypes, resource, sys
from uph.heap import glibc, keep_freed_memory
libc = glibc()
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
if sys.argv[1] == "kept":
    assert keep_freed_memory()
def blocks():
    pointers = [libc.malloc(3 * 2**20) for _ in range(10)]
    for pointer in pointers:
        libc.memset(pointer, 1, 3 * 2**20)
    for pointer in pointers:
        libc.free(pointer)
blocks()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    blocks()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = 4 * 10 * 3 * 2**20 // 4096  # the pages the four rounds write


def faults(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", ROUNDS, mode], check=True, capture_output=True, text=True).stdout)


@pytest.mark.skipif(glibc() is None, reason="mallopt's thresholds are glibc's")
def test_freed_blocks_are_reused_without_page_faults():
    kept, default = faults("kept"), faults("default")
    assert default > PAGES // 2  # glibc gives the freed top of its heap back, and the next round faults it in
    assert kept < PAGES // 100, (kept, default)
