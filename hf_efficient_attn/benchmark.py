"""Speed and peak memory against SDPA, versus sequence length; every measurement in a fresh process.

Two benchmarks, each a table (markdown + csv), the raw measurements (json) and a plot (png) in
``--output_dir``:

- attention (default): one call of every method on random q, k, v (batch 1, 12 heads,
  head_dim 64), forward and forward+backward, against exact attention through SDPA (method
  ``softmax``); writes ``attention.{md,csv,json,png}``.
- ``--model``: one training step (MLM forward, backward, AdamW step) of a roberta-base-width
  encoder (hidden 768, 12 heads, FFN 3072; ``--layers``, ``--vocab_size``) with Transformers'
  own SDPA attention ("sdpa") and with each method patched in; ``vmean`` (the mean of V,
  attention almost free) is the floor set by the rest of the model. Its timing processes keep
  freed memory for reuse, as the training scripts do on CPU (:mod:`.cpu_allocator`;
  ``--glibc_malloc``: glibc's defaults). Writes ``model_step.{md,csv,json,png}``.

- ``--compile``: eager against ``torch.compile`` for the same roberta-base-width model (an inference
  forward or, with ``--train``, a training step) on a padded batch (the last row a quarter padding),
  per method with Transformers' SDPA beside: the eager call, the first compiled call (compilation
  included, with Inductor's caches off so that every process compiles from scratch) and the
  steady-state compiled call. Writes ``compile.{md,csv,json}``.
- ``--onnx``: the same model's inference forward (batch 1, no padding) served by ONNX Runtime from
  its ONNX export (``scripts/export_onnx.py``'s exporter), against eager PyTorch, per method with
  Transformers' SDPA beside. Writes ``onnx.{md,csv,json}``.

The methods are given as ``--methods mra2,nystromformer`` and their options, per method, as
``--attn_config '{"mra2": {"backend": "flex"}}'`` (a method left out runs at its defaults).
A process times the median of ``--repeats`` calls after ``--warmup`` untimed calls: one for the
attention (it compiles compiled kernels), two for ``--model``, whose first step allocates the
optimizer state and whose second still grows the heap to its working size (the first steps fault
in many pages, later ones none; counts in docs/benchmarks.md), so that the timed step is a steady-
state one, like almost every step of a training run. With ``--rounds`` R > 1 every time is taken R
times, each round measuring every job once in turn, and the median is reported; ratios (speed-up,
time over the floor) are the medians of the per-round ratios, so that a machine whose speed drifts
during the run slows both sides of a ratio alike (``--model`` defaults to 3 rounds of one timed
step each). The attention step back-propagates a fixed random gradient of the output, dense like a
real model's (``out.sum()`` would hand the methods a broadcast one). Peak memory is what one more
call needs beyond the memory live before it (inputs, weights, optimizer state, accumulated
gradients): on CUDA the rise of ``max_memory_allocated``; on CPU the rise of the resident set's
high-water mark over the resident size before the call, with glibc's mmap threshold fixed at 128
KiB for that call so that freed tensors leave the resident set (otherwise the peak measures what
the allocator keeps).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from .cpu_allocator import keep_freed_memory, return_freed_memory
from .methods.base import AttentionShape
from .registry import build_method, list_methods
from .training.args import check_choice, check_positive_flags, parse_arguments, parse_method_configs, parse_method_names

ATTENTION_REFERENCE = "softmax"  # exact attention through SDPA, behind the method contract
MODEL_REFERENCE = "sdpa"  # Transformers' own SDPA attention
MODEL_FLOOR = "vmean"
DEFAULT_MODEL_METHODS = ["mra2", "mra2_s"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The encoder of ``--model``: roberta-base's width.
ROBERTA_BASE_WIDTH = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)


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


# ----------------------------------------------------------------------------- what is measured


def attention_step(method: str, seq_len: int, backward: bool, *, options: dict[str, Any] | None = None,
                   batch: int = 1, heads: int = 12, head_dim: int = 64, device: str = "cpu",
                   dtype: str = "fp32") -> Callable[[], None]:
    """One attention call of ``method`` (with ``options``) on random q, k, v (B, H, N, D), with
    backward (of a fixed random output gradient) if asked."""
    dev, torch_dtype = torch.device(device), DTYPES[dtype]
    module = build_method(method, options, AttentionShape(heads, head_dim, max(seq_len, 4096))).to(dev, torch_dtype)
    module.train(backward)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=dev, dtype=torch_dtype) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(backward)
    grad_out = torch.randn_like(q)

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = module(q, k, v, None, head_dim**-0.5)
            if backward:
                out.backward(grad_out)

    return step


def build_mlm_model(method: str, seq_len: int, layers: int = 2, vocab_size: int = 1024,
                    options: dict[str, Any] | None = None) -> torch.nn.Module:
    """A randomly initialised roberta-base-width ``RobertaForMaskedLM`` for ``seq_len`` tokens with
    attention ``method`` and its ``options`` (``"sdpa"``: Transformers' own) and attention dropout 0
    (the approximations apply none)."""
    import transformers

    from .patching import patch_model

    config = transformers.RobertaConfig(
        vocab_size=vocab_size, num_hidden_layers=layers, max_position_embeddings=seq_len + 2,
        attention_probs_dropout_prob=0.0, **ROBERTA_BASE_WIDTH,
    )
    if method == MODEL_REFERENCE:
        return transformers.AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa")
    return patch_model(transformers.AutoModelForMaskedLM.from_config(config), method, options)


def mlm_training_step(model: torch.nn.Module, batch: int, seq_len: int, dtype: str = "fp32") -> Callable[[], None]:
    """A closure doing one MLM training step of ``model`` (forward, backward, AdamW step, zero_grad)
    on fixed random tokens, 15% of them masked; bf16/fp16 through autocast, as Trainer's ``--bf16``."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    input_ids = torch.randint(3, model.config.vocab_size, (batch, seq_len), device=device)
    labels = torch.where(torch.rand(batch, seq_len, device=device) < 0.15, input_ids, -100)
    amp_dtype = DTYPES[dtype]

    def step() -> None:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def model_step(method: str, seq_len: int, *, options: dict[str, Any] | None = None, layers: int = 2,
               vocab_size: int = 1024, batch: int = 1, device: str = "cpu", dtype: str = "fp32") -> Callable[[], None]:
    """:func:`mlm_training_step` of :func:`build_mlm_model`."""
    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options).to(device).train()
    return mlm_training_step(model, batch, seq_len, dtype)


def padded_batch(vocab_size: int, batch: int, seq_len: int, device: str) -> dict[str, torch.Tensor]:
    """Random tokens with an attention mask whose last row (of two or more) is a quarter padding."""
    input_ids = torch.randint(3, vocab_size, (batch, seq_len), device=device)
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, seq_len - seq_len // 4:] = 0
    labels = torch.where(torch.rand(batch, seq_len, device=device) < 0.15, input_ids, -100).masked_fill(
        attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def compile_timings(method: str, seq_len: int, *, options: dict[str, Any] | None = None, train: bool = False,
                    layers: int = 2, vocab_size: int = 1024, batch: int = 2, device: str = "cpu", dtype: str = "fp32",
                    repeats: int = 3, warmup: int = 1) -> dict[str, float]:
    """Seconds of one call of the model eager (median of ``repeats`` after ``warmup``), of the first
    call of ``torch.compile(model)`` (compilation included) and of a steady-state compiled call
    (median); the call is an inference forward, or with ``train`` a training step (forward,
    backward, AdamW step) on :func:`padded_batch`."""
    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options).to(device).train(train)
    inputs = padded_batch(vocab_size, batch, seq_len, device)
    amp_dtype, dev = DTYPES[dtype], torch.device(device)

    def make_step(module: torch.nn.Module) -> Callable[[], None]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5) if train else None

        def step() -> None:
            with torch.set_grad_enabled(train), torch.autocast(dev.type, dtype=amp_dtype,
                                                                enabled=amp_dtype != torch.float32):
                loss = module(**inputs).loss
            if optimizer is not None:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        return step

    eager = median_seconds(make_step(model), dev, repeats, warmup)
    compiled_step = make_step(torch.compile(model))
    _sync(dev)
    start = time.perf_counter()
    compiled_step()
    _sync(dev)
    first_call = time.perf_counter() - start
    return {"eager_s": eager, "first_compiled_call_s": first_call,
            "compiled_s": median_seconds(compiled_step, dev, repeats, warmup)}


# ----------------------------------------------------------------------------- how it is measured


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(step: Callable[[], None], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``repeats`` calls of ``step`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
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
    _sync(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        _sync(device)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = _resident_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident size
    step()
    return max(_peak_resident_mb() - before, 0.0)


def onnx_timings(method: str, seq_len: int, *, options: dict[str, Any] | None = None, layers: int = 2,
                 vocab_size: int = 1024, batch: int = 1, device: str = "cpu", dtype: str = "fp32", repeats: int = 3,
                 warmup: int = 1) -> dict[str, float]:
    """Seconds of one inference forward of the model in eager PyTorch and in ONNX Runtime (its
    export by :func:`serving.onnx.export_onnx`), medians of ``repeats`` calls after ``warmup``."""
    import tempfile

    import onnxruntime

    from .serving.onnx import export_onnx

    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options).eval()
    input_ids = torch.randint(3, vocab_size, (batch, seq_len))
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    with torch.no_grad():
        eager = median_seconds(lambda: model(**inputs), torch.device("cpu"), repeats, warmup)
    with tempfile.TemporaryDirectory() as folder:
        export_onnx(model, f"{folder}/model.onnx", min(seq_len, 128))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(f"{folder}/model.onnx", options, providers=["CPUExecutionProvider"])
        feed = {name: tensor.numpy() for name, tensor in inputs.items()}
        served = median_seconds(lambda: session.run(None, feed), torch.device("cpu"), repeats, warmup)
    return {"eager_s": eager, "onnxruntime_s": served}


def _worker(request: dict[str, Any]) -> float | dict[str, float]:
    """Seconds (``request["measure"] == "time"``) or peak MB (``"memory"``) of the step asked for;
    for ``kind`` "compile" and "onnx", the timings of :func:`compile_timings` / :func:`onnx_timings`."""
    request = dict(request)
    what, kind, repeats, warmup, threads = (
        request.pop(key) for key in ("measure", "kind", "repeats", "warmup", "threads"))
    glibc_malloc = request.pop("glibc_malloc", False)
    if request["device"] == "cpu" and what == "memory" and not return_freed_memory():
        print("not glibc: CPU peak memory includes memory kept by the allocator", file=sys.stderr)
    elif request["device"] == "cpu" and what == "time" and kind == "model" and not glibc_malloc:
        keep_freed_memory()  # as the training scripts do
    if threads:
        torch.set_num_threads(threads)
    if kind in ("compile", "onnx"):
        return (compile_timings if kind == "compile" else onnx_timings)(**request, repeats=repeats, warmup=warmup)
    step = (model_step if kind == "model" else attention_step)(**request)
    device = torch.device(request["device"])
    return median_seconds(step, device, repeats, warmup) if what == "time" else call_peak_mb(step, device)


def measure_in_fresh_process(what: str, kind: str, repeats: int = 3, warmup: int = 1, threads: int | None = None,
                             **request: Any) -> tuple[Any, int]:
    """(value, pid): the time (``what`` "time") or peak memory ("memory") of one step (``kind``
    "attention": :func:`attention_step`, "model": :func:`model_step`) in a fresh interpreter, so
    that no measurement shares memory, caches or compiled kernels with another."""
    job = json.dumps({"kind": kind, "measure": what, "repeats": repeats, "warmup": warmup, "threads": threads,
                      **request})
    # Compile jobs compile from scratch: Inductor's on-disk caches would hand later processes the
    # kernels of earlier ones.
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"} if kind == "compile" else None
    done = subprocess.run([sys.executable, "-m", "hf_efficient_attn.benchmark", job],
                          capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} benchmark ({what}) of {request['method']} at n={request['seq_len']} failed:\n"
                           f"{done.stderr[-2000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["value"], answer["pid"]


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
                seconds, pid = measure_in_fresh_process("time", **job)
                times[i].append(seconds)
                pids[i].append(pid)
                if round_index == 0:
                    peaks[i], pid = measure_in_fresh_process("memory", **job)
                    pids[i].append(pid)
                tqdm.write(f"{job['method']:24s} n={job['seq_len']:6d} round {round_index + 1}: "
                           f"{seconds * 1000:10.1f} ms {peaks[i]:9.1f} MB")
            except RuntimeError as error:
                failed.add(i)
                tqdm.write(f"skipped: {error}", file=sys.stderr)
            progress.update()
    progress.close()
    return [
        Measurement(job["method"], job["seq_len"], _mode(job), statistics.median(times[i]), peaks[i], pids[i], times[i])
        for i, job in enumerate(jobs) if i not in failed
    ]


def measure_timings(jobs: list[dict[str, Any]], rounds: int = 1) -> list[list[dict[str, float]]]:
    """The timings (a dict of seconds: :func:`compile_timings`, :func:`onnx_timings`) of every job in
    each of ``rounds`` rounds, a fresh process per job and round; per job, the list of its rounds."""
    results: list[list[dict[str, float]]] = [[] for _ in jobs]
    progress = tqdm(total=len(jobs) * rounds, desc=f"{jobs[0]['kind']} benchmark", unit="run")
    for round_index in range(rounds):
        for i, job in enumerate(jobs):
            progress.set_postfix_str(f"{job['method']} n={job['seq_len']} round {round_index + 1}/{rounds}")
            timings, _ = measure_in_fresh_process("time", **job)
            results[i].append(timings)
            tqdm.write(f"{job['method']:24s} n={job['seq_len']:6d} round {round_index + 1}: "
                       + ", ".join(f"{key[:-2]} {value:.3f} s" for key, value in timings.items()))
            progress.update()
    progress.close()
    return results


def _median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def _median_ratio(rounds: list[dict[str, float]], key: str, other: list[dict[str, float]], other_key: str) -> float:
    """Median over the rounds of ``key`` / ``other_key`` (ratios per round: drift cancels)."""
    return statistics.median(r[key] / o[other_key] for r, o in zip(rounds, other))


def compile_table(jobs: list[dict[str, Any]], results: list[list[dict[str, float]]]) -> list[dict[str, Any]]:
    """One row per job: eager, first compiled and compiled times, the compiled speed-up and the first
    compiled call over the SDPA model's (the price of compiling the method)."""
    reference = {job["seq_len"]: r for job, r in zip(jobs, results) if job["method"] == MODEL_REFERENCE}
    rows = []
    for job, rounds in zip(jobs, results):
        row: dict[str, Any] = {
            "method": job["method"], "n": job["seq_len"], "call": "train step" if job["train"] else "forward",
            "eager_ms": round(_median(rounds, "eager_s") * 1000, 1),
            "first_compiled_call_s": round(_median(rounds, "first_compiled_call_s"), 1),
            "compiled_ms": round(_median(rounds, "compiled_s") * 1000, 1),
            "compiled_speedup": round(_median_ratio(rounds, "eager_s", rounds, "compiled_s"), 2),
        }
        if job["seq_len"] in reference:
            ratio = _median_ratio(rounds, "first_compiled_call_s", reference[job["seq_len"]], "first_compiled_call_s")
            row["first_call_vs_sdpa"] = round(ratio, 2)
        rows.append(row)
    return rows


def onnx_table(jobs: list[dict[str, Any]], results: list[list[dict[str, float]]]) -> list[dict[str, Any]]:
    """One row per job: eager and ONNX Runtime times, and ONNX Runtime's speed-up over the SDPA
    model served the same way (>1 = faster)."""
    reference = {job["seq_len"]: r for job, r in zip(jobs, results) if job["method"] == MODEL_REFERENCE}
    rows = []
    for job, rounds in zip(jobs, results):
        row: dict[str, Any] = {
            "method": job["method"], "n": job["seq_len"],
            "eager_ms": round(_median(rounds, "eager_s") * 1000, 1),
            "onnxruntime_ms": round(_median(rounds, "onnxruntime_s") * 1000, 1),
        }
        if job["seq_len"] in reference:
            ratio = _median_ratio(reference[job["seq_len"]], "onnxruntime_s", rounds, "onnxruntime_s")
            row["onnxruntime_speedup_vs_sdpa"] = round(ratio, 2)
        rows.append(row)
    return rows


def _mode(job: dict[str, Any]) -> str:
    return "train step" if job["kind"] == "model" else ("forward+backward" if job["backward"] else "forward")


# ----------------------------------------------------------------------------- tables and plots


def attention_table(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """One row per (method, n): times and memory, with ratios to SDPA (>1 = faster / smaller)."""
    by_key = {(m.method, m.seq_len, m.mode): m for m in measurements}
    rows = []
    for method in dict.fromkeys(m.method for m in measurements):
        for seq_len in sorted({m.seq_len for m in measurements if m.method == method}):
            row: dict[str, Any] = {"method": method, "n": seq_len}
            for mode, tag in (("forward", "fwd"), ("forward+backward", "fwdbwd")):
                mine, ref = by_key.get((method, seq_len, mode)), by_key.get((ATTENTION_REFERENCE, seq_len, mode))
                if mine is None:
                    continue
                row[f"{tag}_ms"] = round(mine.seconds * 1000, 1)
                row[f"{tag}_peak_mb"] = round(mine.peak_mb, 1)
                if ref is not None:
                    row[f"{tag}_speedup"] = round(time_ratio(ref, mine), 2)
                    row[f"{tag}_mem_ratio"] = round(ref.peak_mb / max(mine.peak_mb, 1e-3), 2)
            rows.append(row)
    return rows


def model_step_table(measurements: list[Measurement], batch: int = 1) -> list[dict[str, Any]]:
    """One row per (n, method): step time, tokens/s, speed-up over SDPA (>1 = faster), time over
    the vmean floor (+10% = 1.1x the floor's time) and peak memory relative to SDPA's (<1 = smaller)."""
    by_key = {(m.method, m.seq_len): m for m in measurements}
    rows = []
    for seq_len in sorted({m.seq_len for m in measurements}):
        ref, floor = by_key.get((MODEL_REFERENCE, seq_len)), by_key.get((MODEL_FLOOR, seq_len))
        for method in dict.fromkeys(m.method for m in measurements):
            mine = by_key.get((method, seq_len))
            if mine is None:
                continue
            row: dict[str, Any] = {"n": seq_len, "method": method, "step_s": round(mine.seconds, 3),
                                   "tokens_per_s": round(batch * seq_len / mine.seconds)}
            if ref is not None:
                row["speedup_vs_sdpa"] = round(time_ratio(ref, mine), 2)
            if floor is not None:
                row["time_over_vmean_floor"] = f"{(time_ratio(mine, floor) - 1) * 100:+.0f}%"
            row["peak_mb"] = round(mine.peak_mb)
            if ref is not None:
                row["peak_vs_sdpa"] = round(mine.peak_mb / max(ref.peak_mb, 1e-3), 2)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def plot(measurements: list[Measurement], path: Path, title: str) -> None:
    """Time (or tokens/s, for training steps) and peak memory versus n, one line per method and mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot written: matplotlib is not installed (pip install matplotlib) -> {path}", file=sys.stderr)
        return
    fig, (speed_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method, mode in dict.fromkeys((m.method, m.mode) for m in measurements):
        points = sorted((m.seq_len, m) for m in measurements if (m.method, m.mode) == (method, mode))
        ns = [n for n, _ in points]
        label = method if mode == "train step" else f"{method} ({mode})"
        if mode == "train step":
            speed_ax.plot(ns, [n / m.seconds for n, m in points], marker="o", label=label)
        else:
            speed_ax.plot(ns, [m.seconds * 1000 for _, m in points], marker="o", label=label)
        memory_ax.plot(ns, [m.peak_mb for _, m in points], marker="o", label=label)
    training = any(m.mode == "train step" for m in measurements)
    speed_ax.set_ylabel("tokens / s" if training else "ms per call")
    memory_ax.set_ylabel("peak memory (MB)")
    seq_lens = sorted({m.seq_len for m in measurements})
    for ax in (speed_ax, memory_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(seq_lens, [str(n) for n in seq_lens])
        ax.set_xlabel("sequence length n")
        ax.grid(True, which="both", alpha=0.3)
    memory_ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 110), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write(rows: list[dict[str, Any]], measurements: list[Measurement], out: Path, stem: str, title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.md").write_text(f"{title}\n\n{markdown(rows)}\n")
    (out / f"{stem}.json").write_text(json.dumps([asdict(m) for m in measurements], indent=1))
    plot(measurements, out / f"{stem}.png", title)


def _setting(args: BenchmarkArguments) -> str:
    threads = f", {args.threads or torch.get_num_threads()} CPU threads" if args.device == "cpu" else ""
    options = "".join(f"; {name} {json.dumps(config)}" for name, config in args.method_configs.items())
    return f"{args.device}{threads}, {args.dtype}, torch {torch.__version__}{options}"


def run(args: BenchmarkArguments) -> list[dict[str, Any]]:
    """Run the benchmark that ``args`` asks for; write and return its table."""
    common = dict(batch=args.batch, device=args.device, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
                  threads=args.threads)
    out = Path(args.output_dir)

    def job(method: str, **values: Any) -> dict[str, Any]:
        return dict(method=method, options=args.method_configs.get(method, {}), **values, **common)

    if args.compile or args.onnx:
        kind = "compile" if args.compile else "onnx"
        extra = {"train": args.train} if args.compile else {}
        jobs = [job(m, kind=kind, seq_len=n, layers=args.layers, vocab_size=args.vocab_size, **extra)
                for n in args.seq_lens for m in args.measured]
        results = measure_timings(jobs, args.rounds)
        if args.compile:
            rows = compile_table(jobs, results)
            call = "training step (MLM forward + backward + AdamW)" if args.train else "inference forward"
            title = (f"torch.compile against eager: {call} of a roberta-base-width encoder, {args.layers} layer(s), "
                     f"batch {args.batch} (the last row a quarter padding); {_setting(args)}; Inductor caches off")
        else:
            rows = onnx_table(jobs, results)
            title = (f"ONNX Runtime (CPU provider, {torch.get_num_threads() if args.threads is None else args.threads} "
                     f"threads) against eager PyTorch: inference forward of a roberta-base-width encoder, "
                     f"{args.layers} layer(s), batch {args.batch}; {_setting(args)}")
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"{kind}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        (out / f"{kind}.md").write_text(f"{title}\n\n{markdown(rows)}\n")
        (out / f"{kind}.json").write_text(json.dumps({"title": title, "rows": rows, "rounds": results}, indent=1))
    elif args.model:
        jobs = [job(m, kind="model", seq_len=n, layers=args.layers, vocab_size=args.vocab_size,
                    glibc_malloc=args.glibc_malloc)
                for n in args.seq_lens for m in args.measured]
        measurements = measure_all(jobs, args.rounds)
        rows = model_step_table(measurements, args.batch)
        malloc = "glibc's default malloc" if args.glibc_malloc else "malloc keeping freed memory"
        title = (f"Training step (MLM forward + backward + AdamW) of a roberta-base-width encoder, {args.layers} "
                 f"layer(s), vocabulary {args.vocab_size}, batch {args.batch}; {_setting(args)}"
                 + (f", {malloc}" if args.device == "cpu" else ""))
        _write(rows, measurements, out, "model_step", title)
    else:
        modes = [False] if args.forward_only else [False, True]
        jobs = [job(m, kind="attention", seq_len=n, backward=b, heads=args.heads, head_dim=args.head_dim)
                for m in args.measured for n in args.seq_lens for b in modes]
        measurements = measure_all(jobs, args.rounds)
        rows = attention_table(measurements)
        title = (f"Attention call, batch {args.batch}, {args.heads} heads, head_dim {args.head_dim}; "
                 f"{_setting(args)}")
        _write(rows, measurements, out, "attention", title)
    print(markdown(rows))
    return rows


EXAMPLES = """
examples:
  python scripts/benchmark.py --methods mra2,nystromformer --seq_lens 1024 4096
  python scripts/benchmark.py --model                    # mra2, mra2_s vs sdpa and vmean
  python scripts/benchmark.py --model --device cuda --dtype bf16 --methods mra2 --attn_config '{"mra2": {"backend": "flex"}}'
  python scripts/benchmark.py --compile --methods mra2,nystromformer --seq_lens 1024
  python scripts/benchmark.py --onnx --methods mra2
"""


@dataclass
class BenchmarkArguments:
    """The flags of ``scripts/benchmark.py``; defaults that depend on the benchmark are filled in, and
    every value checked, on construction."""

    model: bool = field(default=False, metadata={"help": "Benchmark a whole-model training step instead of attention."})
    compile: bool = field(
        default=False,
        metadata={"help": "Benchmark torch.compile against eager for a whole model (SDPA beside)."},
    )
    train: bool = field(default=False, metadata={"help": "--compile only: time a training step instead of a forward."})
    onnx: bool = field(
        default=False,
        metadata={"help": "Benchmark ONNX Runtime against eager PyTorch for a whole model (SDPA beside)."},
    )
    methods: str | None = field(
        default=None,
        metadata={"help": f"Methods to compare with SDPA, comma-separated. Default: every method "
                          f"({','.join(list_methods())}); with --model, --compile or --onnx: "
                          f"{','.join(DEFAULT_MODEL_METHODS)}."},
    )
    attn_config: str | None = field(
        default=None,
        metadata={"help": "Options per method, a JSON object keyed by method name, e.g. "
                          "'{\"mra2\": {\"block_per_row\": 8}}'; a method left out runs at its defaults."},
    )
    seq_lens: list[int] | None = field(
        default=None,
        metadata={"help": "Sequence lengths, space-separated. Default: 512 1024 2048 4096; with --model: 1024 2048 "
                          "4096 8192 16384; with --compile: 1024; with --onnx: 1024 4096."},
    )
    batch: int | None = field(default=None, metadata={"help": "Default: 1; with --compile: 2 (the last row a "
                                                              "quarter padding)."})
    heads: int = field(default=12, metadata={"help": "Attention benchmark only: heads."})
    head_dim: int = field(default=64, metadata={"help": "Attention benchmark only: head dimension."})
    layers: int = field(default=2, metadata={"help": "Whole-model benchmarks: encoder layers."})
    vocab_size: int = field(
        default=1024,
        metadata={"help": "Whole-model benchmarks: MLM vocabulary (small, so that the step measures the encoder; "
                          "roberta-base's 50265 adds the same cost to every method)."},
    )
    device: str = field(default="cuda" if torch.cuda.is_available() else "cpu", metadata={"help": "cpu or cuda."})
    dtype: str = field(
        default="fp32",
        metadata={"help": f"One of {', '.join(DTYPES)}. Attention: the dtype of q, k, v; whole model: the "
                          "autocast dtype (fp32 = none)."},
    )
    repeats: int | None = field(
        default=None,
        metadata={"help": "Timed calls per process after the warm-up, their median kept. Default: 3; with --model: 1."},
    )
    warmup: int | None = field(
        default=None,
        metadata={"help": "Untimed calls per process before the timed ones. Default: 1; with --model: 2 (the first "
                          "step allocates the optimizer state, the second still grows the heap)."},
    )
    rounds: int | None = field(
        default=None,
        metadata={"help": "Times every measurement is taken, each time in a new process, the jobs in turn; the "
                          "median is reported, ratios are medians of per-round ratios. Default: 1; with --model: 3."},
    )
    threads: int | None = field(
        default=None, metadata={"help": "CPU threads of each measuring process (default: torch's default)."}
    )
    forward_only: bool = field(default=False, metadata={"help": "Attention benchmark only: no backward."})
    glibc_malloc: bool = field(
        default=False,
        metadata={"help": "--model on CPU: time with glibc's default malloc, which returns freed memory to the "
                          "system, instead of keeping it for reuse as the training scripts do."},
    )
    output_dir: str = field(default="outputs/benchmark", metadata={"help": "Folder for the tables and plots."})

    def __post_init__(self) -> None:
        whole_model = self.model or self.compile or self.onnx
        if self.model + self.compile + self.onnx > 1:
            raise ValueError("--model, --compile and --onnx are three benchmarks: give one of them")
        if self.train and not self.compile:
            raise ValueError("--train applies to --compile (--model always times a training step)")
        if whole_model and self.forward_only:
            raise ValueError("--forward_only applies to the attention benchmark only")
        check_choice("device", self.device, ["cpu", "cuda"])
        check_choice("dtype", self.dtype, list(DTYPES))
        if self.glibc_malloc and not (self.model and self.device == "cpu"):
            raise ValueError("--glibc_malloc applies to --model on CPU only (the attention benchmark always uses "
                             "glibc's defaults)")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available; use --device cpu")
        if self.onnx and (self.device, self.dtype) != ("cpu", "fp32"):
            raise ValueError("--onnx times ONNX Runtime's CPU provider in fp32: leave --device and --dtype at cpu / fp32")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")
        check_positive_flags(self, "batch", "heads", "head_dim", "layers", "vocab_size", "repeats", "rounds", "threads")
        if self.seq_lens is not None and any(n < 1 for n in self.seq_lens):
            raise ValueError(f"--seq_lens must be positive integers, got {self.seq_lens}")
        self._fill_defaults()
        allowed = list_methods() + ([MODEL_REFERENCE] if whole_model else [])
        self.method_names = parse_method_names(
            self.methods, allowed, DEFAULT_MODEL_METHODS if whole_model else list_methods())
        references = [MODEL_REFERENCE] if (self.compile or self.onnx) else [MODEL_REFERENCE, MODEL_FLOOR] if self.model \
            else [ATTENTION_REFERENCE]
        #: What is measured: the references first, then the methods asked for.
        self.measured = references + [m for m in self.method_names if m not in references]
        self.method_configs = parse_method_configs(self.attn_config, [m for m in self.measured if m != MODEL_REFERENCE])

    def _fill_defaults(self) -> None:
        if self.batch is None:
            self.batch = 2 if self.compile else 1  # --compile: a padded batch, as served or trained
        if self.repeats is None:
            self.repeats = 1 if self.model else 3
        if self.rounds is None:
            self.rounds = 3 if self.model else 1
        if self.warmup is None:
            self.warmup = 2 if self.model else 1
        if self.seq_lens is None:
            self.seq_lens = ([1024] if self.compile else [1024, 4096] if self.onnx
                             else [1024, 2048, 4096, 8192, 16384] if self.model else [512, 1024, 2048, 4096])


def parse_args(argv: Sequence[str] | None = None) -> BenchmarkArguments:
    """The command line as :class:`BenchmarkArguments`; bad values raise ``ValueError`` naming what is
    allowed, before anything is measured."""
    (args,) = parse_arguments([BenchmarkArguments], argv, description=__doc__ + EXAMPLES)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line of ``scripts/benchmark.py``."""
    return run(parse_args(argv))


if __name__ == "__main__":  # a measuring process started by measure_in_fresh_process
    print(json.dumps({"value": _worker(json.loads(sys.argv[1])), "pid": os.getpid()}))
