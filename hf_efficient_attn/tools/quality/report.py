"""Reporting quality results: CSV rows, markdown tables, the papers' claims, the plot."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from .errors import EXACT, QualityResult

COLUMNS = (
    "seq_len",
    "method",
    "option",
    "value",
    "budget",
    "approximates_softmax",
    "ms",
    "exact_ms",
    "speedup",
    "fro",
    "fro_sem",
    "spec",
    "spec_abs",
    "kernel_reference",
    "kernel_fro",
    "kernel_spec",
    "error",
)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"
    return str(x)


def rows(results: Sequence[QualityResult]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        row = r.row()
        row["speedup"] = r.exact_ms / r.ms if r.ms and not math.isnan(r.ms) else math.nan
        out.append({key: row.get(key) for key in COLUMNS})
    return out


def markdown_table(results: Sequence[QualityResult]) -> str:
    """One markdown table per sequence length."""
    lines = []
    for seq_len in sorted({r.seq_len for r in results}):
        subset = [r for r in results if r.seq_len == seq_len]
        lines += [
            f"### n = {seq_len} (exact SDPA: {_fmt(subset[0].exact_ms, 2)} ms per sequence per layer)",
            "",
            "| method | budget | ms | speed-up | rel. Frobenius err | rel. spectral err | vs own kernel (Frob / spec) |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in subset:
            name = r.method if r.approximates_softmax else f"{r.method} (not softmax)"
            if r.option is None:
                budget = "-"
            elif r.budget == r.value:
                budget = f"{r.option}={r.value}"
            else:
                budget = f"{r.option}={_fmt(r.value, 3)} (d={r.budget})"
            if r.error:
                lines.append(f"| {name} | {budget} | - | - | failed: {r.error} | | |")
                continue
            kernel = f"{r.kernel_reference}: {_fmt(r.kernel_fro)} / {_fmt(r.kernel_spec)}" if r.kernel_reference else ""
            lines.append(
                f"| {name} | {budget} | {_fmt(r.ms, 2)} | {_fmt(r.exact_ms / r.ms, 2)}x | "
                f"{_fmt(r.fro)} ± {_fmt(r.fro_sem, 2)} | {_fmt(r.spec)} | {kernel} |"
            )
        lines.append("")
    return "\n".join(lines)


def _ok(results: Iterable[QualityResult], method: str) -> list[QualityResult]:
    return [r for r in results if r.method == method and not r.error]


def check_claims(results: Sequence[QualityResult]) -> list[str]:
    """The papers' qualitative claims, checked on ``results``; one line each, per n."""
    lines = []
    for seq_len in sorted({r.seq_len for r in results}):
        res = [r for r in results if r.seq_len == seq_len and not r.error]
        approx = [r for r in res if r.approximates_softmax and r.method != EXACT]
        lines.append(f"n = {seq_len}:")
        # (1) MRA-2 most accurate per unit of time (MRA paper, Zeng et al. ICML 2022, Fig. 4): the Pareto front of
        # (time, Frobenius error) among softmax approximations.
        # V-Mean is left out: it is the floor (3), a budget-free baseline, not an approximation.
        candidates = [r for r in approx if r.method != "vmean"]
        front = [
            r
            for r in candidates
            if not any(o.ms <= r.ms and o.fro <= r.fro and (o.ms < r.ms or o.fro < r.fro) for o in candidates)
        ]
        front.sort(key=lambda r: r.ms)
        mra = [r for r in candidates if r.method.startswith("mra2")]
        if mra:
            others = [r for r in candidates if not r.method.startswith("mra2")]
            dominated = [o for o in others if any(m.ms <= o.ms and m.fro <= o.fro for m in mra)]
            share = sum(r.method.startswith("mra2") for r in front)
            lines.append(
                f"  MRA-2 best accuracy per time: {share}/{len(front)} Pareto-front points are MRA-2; "
                f"{len(dominated)}/{len(others)} points of other methods are beaten by an MRA-2 point "
                f"that is both faster and more accurate -> "
                f"{'HOLDS' if share == len(front) else 'PARTLY' if share else 'DOES NOT HOLD'}"
            )
        lines.append(
            "  Pareto front (ms, Frobenius; V-Mean excluded): "
            + ", ".join(f"{r.method}[{r.budget}] ({r.ms:.2f}, {r.fro:.3f})" for r in front)
        )
        # (2) Skeinformer beats Informer and Linformer at equal budget d
        # (Skeinformer paper, Chen, Zeng et al. NAACL 2022, Fig. 1).
        skein = {r.budget: r for r in _ok(res, "skeinformer")}
        for rival in ("informer", "linformer"):
            rivals = {r.budget: r for r in _ok(res, rival)}
            common = sorted(set(skein) & set(rivals))
            if common:
                wins = [d for d in common if skein[d].spec < rivals[d].spec]
                lines.append(
                    f"  Skeinformer < {rival} (spectral, equal d): wins at {len(wins)}/{len(common)} budgets "
                    + "("
                    + ", ".join(f"d={d}: {skein[d].spec:.3f} vs {rivals[d].spec:.3f}" for d in common)
                    + ")"
                )
        # (3) V-Mean is a reasonable floor (Skeinformer paper, Fig. 1).
        vmean = _ok(res, "vmean")
        if vmean:
            floor = vmean[0]
            worse = [r for r in approx if r.method != "vmean" and r.spec > floor.spec]
            lines.append(
                f"  V-Mean floor: spectral {floor.spec:.3f}, Frobenius {floor.fro:.3f}; "
                f"{len(worse)}/{len(approx) - 1} softmax-approximation points are worse than it"
                + (": " + ", ".join(f"{r.method}[{r.budget}]" for r in worse) if worse else "")
            )
    return lines


def plot(results: Sequence[QualityResult], path: str) -> None:
    """Error vs time, log axes, one line per method, one panel per sequence length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r.seq_len for r in results})
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 5), squeeze=False)
    methods = list(dict.fromkeys(r.method for r in results))
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    markers = {m: "os^Dv<>ph*"[(i // 10 + i) % 10] for i, m in enumerate(methods)}
    for ax, seq_len in zip(axes[0], lengths):
        subset = [r for r in results if r.seq_len == seq_len and not r.error and r.ms > 0]
        for method in methods:
            # Connected in budget order (a parametric curve; timings are noisy).
            points = [r for r in subset if r.method == method]
            if not points or method == EXACT:
                continue
            soft = points[0].approximates_softmax
            ax.plot(
                [r.ms for r in points],
                [max(r.fro, 1e-8) for r in points],
                marker=markers[method],
                linestyle="-" if soft else "--",
                color=colors[method],
                label=method if soft else f"{method} (not softmax)",
            )
            for r in points:
                if r.budget is not None:
                    ax.annotate(
                        str(r.budget),
                        (r.ms, max(r.fro, 1e-8)),
                        fontsize=6,
                        color=colors[method],
                        xytext=(2, 2),
                        textcoords="offset points",
                    )
        if subset:
            ax.axvline(subset[0].exact_ms, color="red", linestyle=":", label="exact (SDPA)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ms per sequence per layer (CPU)")
        ax.set_ylabel("relative error ||AV - R||_F / ||AV||_F")
        ax.set_title(f"n = {seq_len}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
