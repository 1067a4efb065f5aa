"""glibc's malloc, set for CPU training at long lengths (or for measuring memory).

By default glibc gives blocks above its mmap threshold (128 KiB, rising with use to at most 32 MiB)
their own mapping and unmaps them when freed, and returns freed memory at the top of its heap to
the system. A training step at thousands of tokens allocates and frees hundreds of MB of
activations and gradients, so each step faults every page of them in again, which costs seconds of
system time per step at long lengths, for every attention method (the measurements are in
docs/benchmarks.md and docs/long_models_mlm.md, not here: they belong to one machine). PyTorch's
CPU performance tuning guide advises an allocator that keeps freed memory (jemalloc or tcmalloc,
preloaded); glibc's own ``mallopt`` does the same without a preload, which is what
:func:`keep_freed_memory` does. Cost: the resident set stays at the step's peak between steps.

``mallopt`` is called through ctypes because Python has no binding for it.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
#: mallopt takes an int: the largest threshold it can be given.
NEVER = 2**31 - 1
#: Environment variables through which a user chooses the allocator's behaviour; when one is set,
#: :func:`keep_freed_memory` leaves the allocator alone.
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def _mallopt(option: int, value: int) -> bool:
    """glibc's ``mallopt(option, value)``; False where the C library is not glibc. ``CDLL(None)``
    looks the symbol up in the running process, which has its C library loaded already."""
    try:
        return ctypes.CDLL(None).mallopt(option, value) == 1
    except (OSError, AttributeError):
        return False


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (no mmap-served blocks, no trimming of the heap),
    unless the environment already chooses (:data:`USER_SETTINGS`). Returns whether it did."""
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    return _mallopt(M_MMAP_THRESHOLD, NEVER) and _mallopt(M_TRIM_THRESHOLD, NEVER)


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at its initial 128 KiB, before the process allocates tensors:
    freed tensors of 128 KiB or more then leave the resident set at once (by default the threshold
    grows and the heap keeps them), so that the resident set follows the live tensors, as CUDA's
    allocated-memory counters do. Slows allocation. Returns whether it did (False: not glibc)."""
    return _mallopt(M_MMAP_THRESHOLD, 128 * 1024)
