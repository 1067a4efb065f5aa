"""A method against exact attention on captured layers: relative Frobenius and spectral-norm
errors, and wall time."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from ...methods.base import AttentionShape
from ...methods.softmax import softmax_reference
from ...registry import MethodChoice, build_method, get_method_class
from .budgets import budget_grid, budget_size

#: Methods that approximate a kernel other than softmax -> the package's exact version of it.

#: Exact attention through SDPA; its own error is a sanity check (should be ~1e-7).
EXACT = "softmax"


def exact_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_per_chunk: int = 4) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V in float64, a few heads at a time (bounded memory)."""
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(0, q.shape[1], heads_per_chunk):
            sl = (b, slice(h, h + heads_per_chunk))
            out[sl] = softmax_reference(*(t[sl].double() for t in (q, k, v)))
    return out


def relative_errors(exact: torch.Tensor, approx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-matrix errors of ``approx`` against ``exact``, both (..., N, D), each matrix N x D.

    Returns tensors of shape ``exact.shape[:-2]`` (e.g. (B, H)):
    ``fro`` = ||E||_F / ||X||_F, ``spec`` = ||E||_2 / ||X||_2 and ``spec_abs`` = ||E||_2,
    with E = approx - exact and X = exact (float64). ``spec`` is the largest singular value
    ratio; since ||E||_2 <= ||E||_F and ||X||_2 >= ||X||_F / sqrt(D), spec <= sqrt(D) * fro.
    """
    exact = exact.double()
    diff = approx.double() - exact
    spec_abs = torch.linalg.matrix_norm(diff, ord=2)
    return {
        "fro": torch.linalg.matrix_norm(diff) / torch.linalg.matrix_norm(exact),
        "spec": spec_abs / torch.linalg.matrix_norm(exact, ord=2),
        "spec_abs": spec_abs,
    }


@dataclass
class QualityResult:
    """One (method, budget, seq_len) measurement, averaged over layers, texts and heads."""

    method: str
    option: str | None
    value: Any
    seq_len: int
    approximates_softmax: bool
    budget: Any  # comparable size d (sampled rows/columns, features, landmarks, MRA blocks per row)
    fro: float  # mean relative Frobenius error vs exact softmax
    spec: float  # mean relative spectral error vs exact softmax
    spec_abs: float  # mean absolute spectral error vs exact softmax (the Skeinformer paper's ||BV - R||_2)
    fro_sem: float  # standard error of ``fro`` over layers x texts x heads
    ms: float  # wall time per sequence for one layer (all heads): best of repeats, median over layers
    exact_ms: float  # same for exact attention (SDPA) on the same inputs
    kernel_reference: str | None = None
    kernel_fro: float | None = None  # vs the method's own exact kernel (e.g. yoso vs yoso_e)
    kernel_spec: float | None = None
    error: str | None = None  # set when the method failed (e.g. budget larger than n)

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _build(method: str, options: dict[str, Any], layer: int, q: torch.Tensor) -> nn.Module:
    shape = AttentionShape(num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2], layer_idx=layer)
    return build_method(MethodChoice.of(method, options), shape).eval()


def _timed(module: nn.Module, q, k, v, repeats: int) -> tuple[torch.Tensor, float]:
    """Output of one call (also the warm-up) and the fastest wall time of ``repeats`` more
    (with ``repeats=0``, the time of that first call, compilation and all). The minimum, as
    ``timeit`` advises: on a shared CPU the slower repeats measure the other processes."""
    scaling = q.shape[-1] ** -0.5
    with torch.no_grad():
        start = time.perf_counter()
        out = module(q, k, v, None, scaling)
        times = [time.perf_counter() - start] if repeats == 0 else []
        for _ in range(repeats):
            start = time.perf_counter()
            module(q, k, v, None, scaling)
            times.append(time.perf_counter() - start)
    return out, min(times)


def exact_reference(layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], kernel: str = EXACT) -> list[torch.Tensor]:
    """Exact outputs per layer in float64: softmax from its definition, or another exact
    kernel method (``yoso_e``, ``kernelized``) run in float64."""
    if kernel == EXACT:
        return [exact_softmax_attention(q, k, v) for q, k, v in layers]
    outputs = []
    for layer, (q, k, v) in enumerate(layers):
        module = _build(kernel, {}, layer, q)
        with torch.no_grad():
            outputs.append(module.double()(q.double(), k.double(), v.double(), None, q.shape[-1] ** -0.5).double())
    return outputs


def evaluate_method(
    method: str,
    layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    option: str | None = None,
    value: Any = None,
    *,
    options: dict[str, Any] | None = None,
    references: dict[str, list[torch.Tensor]] | None = None,
    exact_ms: float = float("nan"),
    repeats: int = 3,
) -> QualityResult:
    """Errors and time of ``method`` (with ``options``, and the budget ``option=value`` over them) on
    captured layers.

    ``references`` caches exact outputs per kernel name (``"softmax"``, ``"yoso_e"``, ...);
    missing ones are computed and stored in it.
    """
    references = {} if references is None else references
    cls = get_method_class(method)
    options = {**(options or {}), **({} if option is None else {option: value})}
    seq_len, batch = layers[0][0].shape[2], layers[0][0].shape[0]
    budget = None if option is None else budget_size(method, value, seq_len)
    kernel = None if cls.exact_reference == EXACT else cls.exact_reference
    for name in {EXACT} | ({kernel} if kernel else set()):
        if name not in references:
            references[name] = exact_reference(layers, name)
    errors: dict[str, list[torch.Tensor]] = {"fro": [], "spec": [], "spec_abs": [], "kfro": [], "kspec": []}
    times = []
    try:
        for layer, (q, k, v) in enumerate(layers):
            out, seconds = _timed(_build(method, options, layer, q), q, k, v, repeats)
            if not torch.isfinite(out).all():
                raise FloatingPointError("non-finite output")
            times.append(seconds / batch)
            for key, err in relative_errors(references[EXACT][layer], out).items():
                errors[key].append(err.flatten())
            if kernel:
                kernel_err = relative_errors(references[kernel][layer], out)
                errors["kfro"].append(kernel_err["fro"].flatten())
                errors["kspec"].append(kernel_err["spec"].flatten())
    except (ValueError, RuntimeError, FloatingPointError) as err:
        return QualityResult(
            method,
            option,
            value,
            seq_len,
            cls.approximates_softmax,
            budget,
            *([math.nan] * 5),
            exact_ms,
            kernel_reference=kernel,
            error=f"{type(err).__name__}: {err}".splitlines()[0][:200],
        )
    flat = {key: torch.cat(vals) for key, vals in errors.items() if vals}
    fro = flat["fro"]
    return QualityResult(
        method=method,
        option=option,
        value=value,
        seq_len=seq_len,
        approximates_softmax=cls.approximates_softmax,
        budget=budget,
        fro=fro.mean().item(),
        spec=flat["spec"].mean().item(),
        spec_abs=flat["spec_abs"].mean().item(),
        fro_sem=(fro.std() / math.sqrt(fro.numel())).item() if fro.numel() > 1 else 0.0,
        ms=1000 * statistics.median(times),
        exact_ms=exact_ms,
        kernel_reference=kernel,
        kernel_fro=flat["kfro"].mean().item() if "kfro" in flat else None,
        kernel_spec=flat["kspec"].mean().item() if "kspec" in flat else None,
    )


def exact_time_ms(layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], repeats: int = 3) -> float:
    """Wall time (ms per sequence, one layer, median over layers) of exact attention through SDPA."""
    batch = layers[0][0].shape[0]
    times = []
    for layer, (q, k, v) in enumerate(layers):
        _, seconds = _timed(_build(EXACT, {}, layer, q), q, k, v, repeats)
        times.append(seconds / batch)
    return 1000 * statistics.median(times)


def evaluate(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    methods: Iterable[str] | None = None,
    *,
    attn_configs: dict[str, dict[str, Any]] | None = None,
    repeats: int = 3,
    progress: Any = None,
) -> list[QualityResult]:
    """Every method of :func:`budget_grid` at every budget on the captured ``layers``, with its options
    from ``attn_configs`` (method -> options; the budget option swept over them).

    Budgets of n or more are left out (:func:`budget_grid`).
    """
    seq_len = layers[0][0].shape[2]
    grid = budget_grid(methods, seq_len)
    references: dict[str, list[torch.Tensor]] = {}
    exact_ms = exact_time_ms(layers, repeats)
    results = []
    for method, (option, values) in grid.items():
        for value in values:
            result = evaluate_method(
                method,
                layers,
                option,
                value,
                options=(attn_configs or {}).get(method),
                references=references,
                exact_ms=exact_ms,
                repeats=repeats,
            )
            results.append(result)
            if progress is not None:
                progress(result)
    return results
