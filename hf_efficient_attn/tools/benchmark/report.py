"""The tables (markdown, csv, json) and plots of the measurements."""

from __future__ import annotations

import csv
import json
import statistics
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .processes import BUSY, Measurement, time_ratio
from .steps import ATTENTION_REFERENCE, MODEL_FLOOR, MODEL_REFERENCE


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
            "method": job["method"],
            "n": job["seq_len"],
            "call": "train step" if job["train"] else "forward",
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


def mixed_lengths_table(jobs: list[dict[str, Any]], results: list[list[dict[str, float]]]) -> list[dict[str, Any]]:
    """One row per job: tokens/s of padded and packed batches, inference and training, the packed
    speed-up (median of per-round ratios) and the largest logit difference between the two forms."""
    rows = []
    for job, rounds in zip(jobs, results):
        tokens = sum(job["lengths"])
        padded_tokens = sum(max(job["lengths"][i : i + job["batch"]]) * len(job["lengths"][i : i + job["batch"]])
                            for i in range(0, len(job["lengths"]), job["batch"]))  # fmt: skip
        row: dict[str, Any] = {"method": job["method"], "documents": len(job["lengths"]), "tokens": tokens,
                               "padded_tokens": padded_tokens}  # fmt: skip
        for call in ("forward", "train"):
            for form in ("padded", "packed"):
                row[f"{call}_{form}_tok_per_s"] = round(tokens / _median(rounds, f"{form}_{call}_s"))
            speedup = _median_ratio(rounds, f"padded_{call}_s", rounds, f"packed_{call}_s")
            row[f"{call}_packed_speedup"] = round(speedup, 2)
        row["max_abs_logit_difference"] = float(f"{max(r['max_abs_logit_difference'] for r in rounds):.2g}")
        rows.append(row)
    return rows


def onnx_table(
    jobs: list[dict[str, Any]], results: list[list[dict[str, float]]], skipped: dict[int, str] | None = None
) -> list[dict[str, Any]]:
    """One row per job measured quiet: eager and ONNX Runtime times (fp32, and int8 where measured),
    ONNX Runtime's speed-up over the SDPA model served the same way (>1 = faster) and its time over
    the vmean floor model's (+10% = 1.1x the floor's), each a median of per-round ratios; with the
    job's twin measured beside a busy process (--competing_process), also its times and their ratio
    to the quiet ones. A job in ``skipped`` (by index: its reason) keeps its row with the reason, e.g.
    SDPA's scores too large for the memory."""
    skipped = skipped or {}
    measured = [(job, rounds) for i, (job, rounds) in enumerate(zip(jobs, results)) if i not in skipped]
    quiet = {(job["method"], job["seq_len"]): rounds for job, rounds in measured if not job.get("busy")}
    busy = {(job["method"], job["seq_len"]): rounds for job, rounds in measured if job.get("busy")}
    rows = []
    for i, (job, rounds) in enumerate(zip(jobs, results)):
        if job.get("busy"):  # reported in its quiet twin's row
            continue
        n = job["seq_len"]
        reference, floor = quiet.get((MODEL_REFERENCE, n)), quiet.get((MODEL_FLOOR, n))
        row: dict[str, Any] = {"method": job["method"], "n": n}
        if i in skipped:
            rows.append({**row, "skipped": skipped[i]})
            continue
        row["eager_ms"] = round(_median(rounds, "eager_s") * 1000, 1)
        for key, tag in (("onnxruntime_s", "onnxruntime"), ("onnxruntime_int8_s", "int8")):
            if key not in rounds[0]:
                continue
            row[f"{tag}_ms"] = round(_median(rounds, key) * 1000, 1)
            if reference:
                row[f"{tag}_speedup_vs_sdpa"] = round(_median_ratio(reference, key, rounds, key), 2)
            if floor:
                row[f"{tag}_over_vmean_floor"] = f"{(_median_ratio(rounds, key, floor, key) - 1) * 100:+.0f}%"
            beside_busy = busy.get((job["method"], n))
            if beside_busy:
                row[f"{tag}_busy_ms"] = round(_median(beside_busy, key) * 1000, 1)
                row[f"{tag}_busy_slowdown"] = round(_median_ratio(beside_busy, key, rounds, key), 2)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- tables and plots


def attention_table(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """One row per (method, n): times and memory, with ratios to SDPA (>1 = faster / smaller); with
    --competing_process also the times beside a busy process and their ratio to the quiet times."""
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
                busy = by_key.get((method, seq_len, mode + BUSY))
                if busy is not None:  # --competing_process: the same call beside a busy process
                    row[f"{tag}_busy_ms"] = round(busy.seconds * 1000, 1)
                    row[f"{tag}_busy_slowdown"] = round(time_ratio(busy, mine), 2)
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
            row: dict[str, Any] = {
                "n": seq_len,
                "method": method,
                "step_s": round(mine.seconds, 3),
                "tokens_per_s": round(batch * seq_len / mine.seconds),
            }
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
        if all(m.peak_mb > 0 for _, m in points):  # jobs beside a busy process take no memory measurement
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
    speed_ax.legend(fontsize=7)  # every line: the memory panel has none for jobs beside a busy process
    fig.suptitle(textwrap.fill(title, 110), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_table(rows: list[dict[str, Any]], out: Path, stem: str, title: str) -> None:
    """``stem.csv`` and ``stem.md`` (under ``title``) in ``out``; a column for every key of any row."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.md").write_text(f"{title}\n\n{markdown(rows)}\n")


def write_outputs(rows: list[dict[str, Any]], measurements: list[Measurement], out: Path, stem: str, title: str) -> None:
    """The table (:func:`write_table`), the measurements (``stem.json``) and their plot (``stem.png``)."""
    write_table(rows, out, stem, title)
    (out / f"{stem}.json").write_text(json.dumps([asdict(m) for m in measurements], indent=1))
    plot(measurements, out / f"{stem}.png", title)
