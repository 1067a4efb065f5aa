"""Every measurement in a fresh process, in rounds; the measurements they return."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ...utils.cpu_allocator import keep_freed_memory, return_freed_memory
from .steps import attention_step, compile_timings, mixed_length_timings, model_step, onnx_timings
from .timing import call_peak_mb, median_seconds

#: The benchmarks whose CPU timing processes keep freed memory, as the training scripts do (unless
#: ``--glibc_malloc``): glibc's default returns large freed blocks to the system, so every call faults
#: its fresh pages in again, and how many depends on the process's history of allocations, not on the
#: method (docs/benchmarks.md).
KEEPS_FREED_MEMORY = ("attention", "model")
#: The benchmarks whose process returns several timings, and the function that takes them.
TIMINGS = {"compile": compile_timings, "onnx": onnx_timings, "mixed_lengths": mixed_length_timings}


@dataclass
class Measurement:
    method: str  # a method name, or "sdpa" (Transformers' own attention)
    seq_len: int
    mode: str  # "forward", "forward+backward" or "train step"
    seconds: float  # median over the rounds
    peak_mb: float
    pids: list[int]  # the fresh processes that measured the time (one per round) and the memory
    round_seconds: list[float] = field(default_factory=list)  # the time measured in each round


def time_ratio(mine: Measurement, other: Measurement) -> float:
    """``mine``'s time over ``other``'s: the median of the per-round ratios when both were measured
    in the same rounds (a machine whose speed drifts between rounds then slows both alike), else
    the ratio of their times."""
    if len(mine.round_seconds) == len(other.round_seconds) > 1:
        return statistics.median(a / b for a, b in zip(mine.round_seconds, other.round_seconds))
    return mine.seconds / other.seconds


def measure_request(request: dict[str, Any]) -> float | dict[str, float]:
    """Seconds (``request["measure"] == "time"``) or peak MB (``"memory"``) of the step asked for;
    for the other kinds, the timings of their function in :data:`TIMINGS`."""
    request = dict(request)
    what, kind, repeats, warmup, threads = (request.pop(key) for key in ("measure", "kind", "repeats", "warmup", "threads"))
    glibc_malloc = request.pop("glibc_malloc", False)
    if request["device"] == "cpu" and what == "memory" and not return_freed_memory():
        print("not glibc: CPU peak memory includes memory kept by the allocator", file=sys.stderr)
    elif request["device"] == "cpu" and what == "time" and kind in KEEPS_FREED_MEMORY and not glibc_malloc:
        keep_freed_memory()  # as the training scripts do
    if threads:
        torch.set_num_threads(threads)
    if kind in TIMINGS:
        return TIMINGS[kind](**request, repeats=repeats, warmup=warmup)
    step = (model_step if kind == "model" else attention_step)(**request)
    device = torch.device(request["device"])
    return median_seconds(step, device, repeats, warmup) if what == "time" else call_peak_mb(step, device)


def in_this_process(kind: str, device: str) -> bool:
    """Whether a job is measured in this process: attention and model steps on CUDA, whose peak is the
    caching allocator's own counter, reset for each measurement (a fresh process would pay CUDA's
    start-up for every one). CPU peaks are the process's resident set, and compile jobs must not share
    Inductor's caches: those get a fresh process each."""
    return device == "cuda" and kind in ("attention", "model")


def _failed(job: dict[str, Any], detail: str) -> RuntimeError:
    return RuntimeError(f"{job['kind']} benchmark ({job['measure']}) of {job['method']} at n={job['seq_len']} failed: {detail}")


@contextlib.contextmanager
def competing_process(active: bool) -> Iterator[subprocess.Popen | None]:
    """While active, one busy process beside the measurement (yielded; None when not active): an
    interpreter spinning on one core, as another job on a shared machine or in a container with a CPU
    limit would be."""
    if not active:
        yield None
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def measure_job(
    what: str,
    kind: str,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    busy: bool = False,
    **request: Any,
) -> tuple[Any, int]:
    """(value, pid): the time (``what`` "time") or peak memory ("memory") of one step (``kind``
    "attention": :func:`attention_step`, "model": :func:`model_step`; the kinds of :data:`TIMINGS`: their
    timings), in a fresh interpreter unless :func:`in_this_process`, so that no CPU measurement shares
    memory, caches or compiled kernels with another, and beside a busy process (:func:`competing_process`)
    if ``busy``. ``RuntimeError`` if the measurement fails."""
    job = {"kind": kind, "measure": what, "repeats": repeats, "warmup": warmup, "threads": threads, **request}
    if not in_this_process(kind, request["device"]):
        with competing_process(busy):
            return measure_in_fresh_process(job)
    try:  # CUDA steps: never beside a busy process (--competing_process is a CPU benchmark)
        return measure_request(job), os.getpid()
    except Exception as error:  # noqa: BLE001 - reported and skipped, as a failed fresh process is
        raise _failed(job, f"{type(error).__name__}: {str(error)[-2000:]}") from error
    finally:
        gc.collect()
        torch.cuda.empty_cache()


#: A measuring process is stopped when the machine has less memory than this left (MB): a job too
#: large for the machine (SDPA's n x n scores at the longest lengths) is then reported and skipped,
#: before the kernel's out-of-memory killer picks a process, maybe another one.
MEMORY_FLOOR_MB = 1024


def memory_available_mb() -> float:
    """The memory the machine can still give (``MemAvailable``, MB); unlimited where there is no
    ``/proc/meminfo``."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def measure_in_fresh_process(job: dict[str, Any]) -> tuple[Any, int]:
    """(value, pid) of :func:`measure_request` of ``job`` in a fresh interpreter, stopped (a
    ``RuntimeError`` saying so) if the machine runs short of memory (:data:`MEMORY_FLOOR_MB`)."""
    # Compile jobs compile from scratch: Inductor's on-disk caches would hand later processes the
    # kernels of earlier ones.
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"} if job["kind"] == "compile" else None
    with subprocess.Popen(
        [sys.executable, "-m", "hf_efficient_attn.tools.benchmark", json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        while True:
            try:
                stdout, stderr = child.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if memory_available_mb() < MEMORY_FLOOR_MB:
                    child.kill()
                    child.communicate()
                    raise _failed(job, f"out of memory: stopped with under {MEMORY_FLOOR_MB} MB left on the machine") from None
    if child.returncode != 0:
        raise _failed(job, f"\n{stderr[-2000:]}")
    answer = json.loads(stdout.strip().splitlines()[-1])
    return answer["value"], answer["pid"]


#: What a mode's name gains when its job ran beside a busy process (:func:`competing_process`).
BUSY = ", beside a busy process"


def mode_of(job: dict[str, Any]) -> str:
    """The measured call of a job: "train step", "forward+backward" or "forward", and :data:`BUSY`
    when it ran beside a busy process."""
    call = "train step" if job["kind"] == "model" else ("forward+backward" if job["backward"] else "forward")
    return call + (BUSY if job.get("busy") else "")


def measure_all(jobs: list[dict[str, Any]], rounds: int = 1) -> list[Measurement]:
    """Every job's time in each of ``rounds`` rounds (a round measures every job once, in turn) and
    its peak memory once, each in a fresh process; a job whose process fails is skipped."""
    times: list[list[float]] = [[] for _ in jobs]
    pids: list[list[int]] = [[] for _ in jobs]
    peaks: list[float] = [0.0] * len(jobs)
    failed: set[int] = set()
    progress = tqdm(total=len(jobs) * rounds, desc="benchmark", unit="run")
    for round_index in range(rounds):
        for i, job in enumerate(jobs):
            if i in failed:
                progress.update()
                continue
            progress.set_postfix_str(f"{job['method']} n={job['seq_len']} round {round_index + 1}/{rounds}")
            try:
                seconds, pid = measure_job("time", **job)
                times[i].append(seconds)
                pids[i].append(pid)
                if round_index == 0 and not job.get("busy"):  # the memory is the quiet twin's
                    peaks[i], pid = measure_job("memory", **job)
                    pids[i].append(pid)
                tqdm.write(
                    f"{job['method']:24s} n={job['seq_len']:6d} round {round_index + 1}: "
                    f"{seconds * 1000:10.1f} ms {peaks[i]:9.1f} MB"
                )
            except RuntimeError as error:
                failed.add(i)
                tqdm.write(f"skipped: {error}", file=sys.stderr)
            progress.update()
    progress.close()
    return [
        Measurement(job["method"], job["seq_len"], mode_of(job), statistics.median(times[i]), peaks[i], pids[i], times[i])
        for i, job in enumerate(jobs)
        if i not in failed
    ]


def skip_reason(error: RuntimeError) -> str:
    """A failed job's reason, short enough for a table: the last line of what :func:`_failed` says
    after naming the job (a failed process's last line of error output)."""
    message = str(error)
    lines = [line.strip() for line in message.partition(" failed: ")[2].splitlines() if line.strip()]
    return lines[-1][-200:] if lines else message[-200:]


def measure_timings(jobs: list[dict[str, Any]], rounds: int = 1) -> tuple[list[list[dict[str, float]]], dict[int, str]]:
    """The timings (a dict of seconds from a function of :data:`TIMINGS`) of every job in
    each of ``rounds`` rounds, a fresh process per job and round: per job, the list of its rounds
    (empty for a job whose process failed: it is reported and skipped, as in :func:`measure_all`);
    and the failed jobs' reasons (:func:`skip_reason`) by index."""
    results: list[list[dict[str, float]]] = [[] for _ in jobs]
    failed: dict[int, str] = {}
    progress = tqdm(total=len(jobs) * rounds, desc=f"{jobs[0]['kind']} benchmark", unit="run")
    for round_index in range(rounds):
        for i, job in enumerate(jobs):
            if i in failed:
                progress.update()
                continue
            progress.set_postfix_str(f"{job['method']} n={job['seq_len']} round {round_index + 1}/{rounds}")
            try:
                timings, _ = measure_job("time", **job)
                results[i].append(timings)
                tqdm.write(
                    f"{job['method']:24s} n={job['seq_len']:6d} round {round_index + 1}: "
                    + ", ".join(f"{key} {value:.4g}" for key, value in timings.items())
                    + (BUSY if job.get("busy") else "")
                )
            except RuntimeError as error:
                failed[i] = skip_reason(error)
                results[i] = []
                tqdm.write(f"skipped: {error}", file=sys.stderr)
            progress.update()
    progress.close()
    return results, failed
