"""The comparison's results: ``results.csv`` (every evaluation of every method), ``summary.md``
(final numbers against the reference and a recommendation) and ``comparison.png``."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from typing import Any

#: The reference every method is compared with: exact attention.
REFERENCE = "softmax"
RESULT_COLUMNS = ("method", "step", "seconds", "eval_loss", "eval_accuracy", "peak_memory_mb")
#: A method "recovers" when its final accuracy is within this many points of softmax's.
RECOVERY_POINTS = 1.0


def write_rows(path: str, rows: Sequence[dict[str, Any]]) -> None:
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)


def read_rows(path: str) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return [
            {key: value if key == "method" else int(value) if key == "step" else float(value)
             for key, value in row.items()}
            for row in csv.DictReader(f)
        ]  # fmt: skip


def final_rows(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each method's last evaluation, with ``seconds_per_step``, in the rows' method order."""
    final: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["method"] not in final or row["step"] > final[row["method"]]["step"]:
            final[row["method"]] = {**row, "seconds_per_step": row["seconds"] / max(row["step"], 1)}
    return final


def method_line(rows: Sequence[dict[str, Any]]) -> str:
    """The console line of a finished method."""
    last = next(iter(final_rows(rows).values()))
    return (
        f"{last['method']}: step {last['step']}, eval accuracy {last['eval_accuracy']:.4f}, eval loss "
        f"{last['eval_loss']:.4f}, {last['seconds_per_step']:.2f} s/step, peak memory {last['peak_memory_mb']:.0f} MB"
    )


def recommendation(final: dict[str, dict[str, Any]], seq_len: int) -> str:
    """The fastest method whose accuracy is within :data:`RECOVERY_POINTS` of the reference's and
    that is faster per step; the reference when there is none."""
    reference = final[REFERENCE]

    def gap(method: str) -> float:
        return 100 * (final[method]["eval_accuracy"] - reference["eval_accuracy"])

    def speed_up(method: str) -> float:
        return reference["seconds_per_step"] / final[method]["seconds_per_step"]

    close = [method for method in final if method != REFERENCE and gap(method) >= -RECOVERY_POINTS]
    faster = [method for method in close if speed_up(method) > 1]
    if faster:
        best = max(faster, key=speed_up)
        return (
            f"At {seq_len} tokens, use `{best}`: {gap(best):+.2f} points of accuracy against `{REFERENCE}`, "
            f"{speed_up(best):.2f}x its training speed."
        )
    if close:
        return (
            f"At {seq_len} tokens, use `{REFERENCE}`: {', '.join(f'`{m}`' for m in close)} came within "
            f"{RECOVERY_POINTS:g} point of its accuracy but train no faster at this length."
        )
    return f"At {seq_len} tokens, use `{REFERENCE}`: no method came within {RECOVERY_POINTS:g} point of its accuracy."


def summary_markdown(rows: Sequence[dict[str, Any]], seq_len: int, model: str, warmup_steps: int, setup: str) -> str:
    """``summary.md``: the final evaluation of each method against the reference, and the
    recommendation; ``setup`` says how much training and evaluation that was."""
    final = final_rows(rows)
    reference = final[REFERENCE]
    warmed = f", after a {warmup_steps}-step MLM-head warm-up with `{REFERENCE}` attention" if warmup_steps else ""
    lines = [
        f"# Attention methods at {seq_len} tokens",
        "",
        f"Continued masked-LM training of `{model}`: every method from the same weights{warmed}, on the same "
        f"batches with the same masks: {setup}. Held-out masked-token accuracy and loss at "
        f"the last step; `{REFERENCE}` "
        "(exact attention) is the reference. Seconds per step count optimisation steps only; peak memory is the "
        "method's process (resident set on CPU, allocated memory on GPU).",
        "",
        f"| method | steps | eval accuracy | gap to {REFERENCE} (points) | eval loss | seconds per step "
        f"| speed-up vs {REFERENCE} | peak memory (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method, row in final.items():
        gap = 100 * (row["eval_accuracy"] - reference["eval_accuracy"])
        speed_up = reference["seconds_per_step"] / row["seconds_per_step"]
        lines.append(
            f"| `{method}` | {row['step']} | {row['eval_accuracy']:.4f} | {gap:+.2f} | {row['eval_loss']:.4f} "
            f"| {row['seconds_per_step']:.2f} | {speed_up:.2f}x | {row['peak_memory_mb']:.0f} |"
        )
    lines += ["", f"**Recommendation.** {recommendation(final, seq_len)}", ""]
    return "\n".join(lines)


def check_plotting() -> None:
    """``ModuleNotFoundError`` saying how to install matplotlib, before any training."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ModuleNotFoundError("comparison.png needs matplotlib: pip install matplotlib") from err


def plot_comparison(rows: Sequence[dict[str, Any]], path: str, seq_len: int) -> None:
    """Accuracy against steps and against training seconds, one line per method."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for method in dict.fromkeys(row["method"] for row in rows):
        mine = [row for row in rows if row["method"] == method]
        style = {"color": "black", "linewidth": 2.5} if method == REFERENCE else {"linewidth": 1.5}
        accuracy = [row["eval_accuracy"] for row in mine]
        by_step.plot([row["step"] for row in mine], accuracy, marker="o", markersize=3, label=method, **style)
        by_time.plot([row["seconds"] for row in mine], accuracy, marker="o", markersize=3, label=method, **style)
    by_step.set(xlabel="training step", ylabel="held-out masked-token accuracy")
    by_time.set(xlabel="training seconds (optimisation steps only)")
    by_step.legend()
    for axes in (by_step, by_time):
        axes.grid(alpha=0.3)
    figure.suptitle(f"Continued masked-LM training at {seq_len} tokens, each attention method from the same weights")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
