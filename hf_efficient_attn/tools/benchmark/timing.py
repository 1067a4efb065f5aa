"""How one step is timed and how much memory one call of it needs."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(step: Callable[[], None], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``repeats`` calls of ``step`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_resident_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def call_peak_mb(step: Callable[[], None], device: torch.device) -> float:
    """Memory one steady-state call of ``step`` (after a warm-up call) needs beyond what is live
    before it (inputs, weights, optimizer state, accumulated gradients): on CUDA the rise of
    ``max_memory_allocated``; on CPU the rise of the resident set's high-water mark (reset through
    /proc/self/clear_refs) over the resident size before the call."""
    step()
    synchronize(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        synchronize(device)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = _resident_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident size
    step()
    return max(_peak_resident_mb() - before, 0.0)
