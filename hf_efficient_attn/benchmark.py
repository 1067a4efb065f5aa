"""Time and peak memory of each method against SDPA, versus sequence length.

Every (method, length, mode) runs in a fresh process so that its peak memory is its own:
on CUDA ``torch.cuda.max_memory_allocated``; on CPU the rise of the process's peak
resident set (``ru_maxrss``) over the resident size before the first attention call.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .methods.base import AttentionShape
from .registry import build_method, list_methods

REFERENCE = "softmax"  # exact attention through SDPA


@dataclass
class Measurement:
    method: str
    seq_len: int
    mode: str  # "forward" or "forward+backward"
    seconds: float
    peak_mb: float


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(
    method: str,
    seq_len: int,
    backward: bool,
    *,
    batch: int = 1,
    heads: int = 12,
    head_dim: int = 64,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
    options: dict[str, Any] | None = None,
) -> Measurement:
    """Median wall time of ``repeats`` calls after one warm-up call, and the peak memory."""
    dev = torch.device(device)
    module = build_method(method, options, AttentionShape(heads, head_dim, max(seq_len, 4096))).to(dev, dtype)
    module.train(backward)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=dev, dtype=dtype) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(backward)

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = module(q, k, v, None, head_dim**-0.5)
            if backward:
                out.sum().backward()
        _sync(dev)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated() / 2**20
    else:
        baseline = _resident_mb()
    step()  # warm-up (and compilation, for compiled kernels)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20 - baseline
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - baseline
    mode = "forward+backward" if backward else "forward"
    return Measurement(method, seq_len, mode, statistics.median(times), max(peak, 0.0))


def measure_in_subprocess(method: str, seq_len: int, backward: bool, **kwargs: Any) -> Measurement:
    """:func:`measure` in a fresh interpreter, so that peak memory is not shared between runs."""
    request = json.dumps({"method": method, "seq_len": seq_len, "backward": backward, **kwargs})
    done = subprocess.run(
        [sys.executable, "-m", "hf_efficient_attn.benchmark", "--worker", request],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark of {method} at n={seq_len} failed:\n{done.stderr[-2000:]}")
    return Measurement(**json.loads(done.stdout.strip().splitlines()[-1]))


def ratio_table(measurements: list[Measurement]) -> list[dict[str, Any]]:
    """One row per (method, n): times and memory, with ratios to SDPA (>1 = faster / smaller)."""
    by_key = {(m.method, m.seq_len, m.mode): m for m in measurements}
    rows = []
    for method in dict.fromkeys(m.method for m in measurements):
        for seq_len in sorted({m.seq_len for m in measurements if m.method == method}):
            row: dict[str, Any] = {"method": method, "n": seq_len}
            for mode, tag in (("forward", "fwd"), ("forward+backward", "fwdbwd")):
                mine, ref = by_key.get((method, seq_len, mode)), by_key.get((REFERENCE, seq_len, mode))
                if mine is None:
                    continue
                row[f"{tag}_ms"] = round(mine.seconds * 1000, 1)
                row[f"{tag}_peak_mb"] = round(mine.peak_mb, 1)
                if ref is not None:
                    row[f"{tag}_speedup"] = round(ref.seconds / mine.seconds, 2)
                    row[f"{tag}_mem_ratio"] = round(ref.peak_mb / max(mine.peak_mb, 1e-3), 2)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    methods = args.methods or list_methods()
    methods = [REFERENCE] + [m for m in methods if m != REFERENCE]
    kwargs = dict(batch=args.batch, heads=args.heads, head_dim=args.head_dim, device=args.device, repeats=args.repeats)
    measurements = []
    modes = [False] if args.forward_only else [False, True]
    total = len(methods) * len(args.seq_lens) * len(modes)
    for i, (method, seq_len, backward) in enumerate(
        (m, n, b) for m in methods for n in args.seq_lens for b in modes
    ):
        try:
            result = measure_in_subprocess(method, seq_len, backward, **kwargs)
        except RuntimeError as error:
            print(f"[{i + 1}/{total}] skipped: {error}", file=sys.stderr)
            continue
        measurements.append(result)
        print(f"[{i + 1}/{total}] {method:14s} n={seq_len:5d} {result.mode:17s} "
              f"{result.seconds * 1000:9.1f} ms {result.peak_mb:8.1f} MB", flush=True)
    rows = ratio_table(measurements)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "benchmark.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    (out / "benchmark.md").write_text(markdown(rows) + "\n")
    (out / "measurements.json").write_text(json.dumps([asdict(m) for m in measurements], indent=1))
    print(markdown(rows))
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--methods", nargs="+", help=f"default: all ({', '.join(list_methods())})")
    p.add_argument("--seq-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--out-dir", default="outputs/benchmark")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.worker:
        print(json.dumps(asdict(measure(**json.loads(args.worker)))))
        return
    run(args)


if __name__ == "__main__":
    main()
