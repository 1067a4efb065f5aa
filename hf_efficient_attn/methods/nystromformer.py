"""Nystromformer: softmax attention by the Nystrom method on segment-mean landmarks (Xiong et al.,
"Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention", AAAI 2021), with the
iterative pseudo-inverse ``iterative_pinv`` that Skyformer uses too.

What it computes and the choices made where the paper and official code differ (segments of the
real tokens, any length, exact attention for short sequences): docs/methods/nystromformer.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..registry import register_method
from .base import (
    AttentionMethod,
    AttentionShape,
    MethodOptions,
    Paper,
    apply_value_conv,
    check_choice,
    check_int,
    compute_dtype,
    depthwise_value_conv,
    is_tracing,
)


def iterative_pinv(
    mat: torch.Tensor, iterations: int, spectral_norm_at_most_one: bool = False, coefficient_over_heads: bool = False
) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of square matrices (..., m, m) by the order-3 iteration of
    Razavi et al. (2014) used by Nystromformer (Xiong et al. 2021, section 3) and Skyformer
    (Chen et al., NeurIPS 2021, section 4.4).

    Z_0 = A^T / (||A||_1 ||A||_inf) per matrix (Razavi et al.'s choice). For a row-stochastic
    softmax A, ||A||_inf = 1 and this is the official code's 1 / (largest column sum), which the
    official code takes over the whole batch (coupling batch elements) and we per matrix. With
    ``spectral_norm_at_most_one`` (Skyformer's normalised matrix, its Lemma 3) Z_0 = A^T /
    ||A||_1, the official Skyformer choice, which converges since ||A||_2 <= 1.
    Every Z_j is A^T times a polynomial in A A^T, so the iteration converges to A^+ also for a
    singular A; the error I - A Z_j of an eigen-direction shrinks as (1 - x)^3 (4 - x) / 4.
    (For an exactly singular A, rounding errors outside its range grow by 13/4 per step, so
    far more iterations than convergence needs drift away from A^+.)

    ``coefficient_over_heads`` (mat (B, H, m, m)): Z_0 = A^T / (the largest column sum over the H
    heads of each sequence), the official Nystromformer code's coefficient for a call on one
    sequence (it takes it over the whole batch), which released checkpoints were trained with.
    """
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    bound = mat.abs().sum(-2).amax(-1)  # ||A||_1, the largest column sum
    if coefficient_over_heads:
        bound = bound.amax(1, keepdim=True)
    elif not spectral_norm_at_most_one:
        bound = bound * mat.abs().sum(-1).amax(-1)  # times ||A||_inf, the largest row sum
    z = mat.transpose(-1, -2) / bound[..., None, None]
    for _ in range(iterations):
        az = mat @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_means_pooling(
    key_padding_mask: torch.Tensor | None,
    shape: tuple[int, int],
    num_landmarks: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, m, N) matrix P whose row j averages segment j of each sequence's real tokens, and the
    (B, m) bool of landmark slots in use (m_b = min(m, L_b) per sequence).

    The real token of rank r (0-based, in order) goes to segment floor(r m_b / L_b).
    """
    real = torch.ones(shape, dtype=torch.bool, device=device) if key_padding_mask is None else key_padding_mask
    lengths = real.sum(-1, keepdim=True)  # L_b
    used = lengths.clamp(max=num_landmarks)  # m_b
    rank = real.long().cumsum(-1) - 1
    segment = (rank.clamp(min=0) * used) // lengths.clamp(min=1)
    members = (F.one_hot(segment, num_landmarks).transpose(1, 2) * real[:, None, :]).to(dtype)  # (B, m, N)
    counts = members.sum(-1)
    return members / counts.clamp(min=1)[..., None], counts > 0


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis giving exactly zero weight where ``keep`` is False (a finite
    fill instead of -inf keeps rows with nothing to keep finite)."""
    if keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return scores.softmax(-1)


def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scaling: float,
    num_landmarks: int,
    pinv_iterations: int,
    pinv_over_heads: bool = False,
) -> torch.Tensor:
    """F A^+ (B V) with segment-mean landmarks, or F V for sequences of at most m real tokens
    (module docstring). q, k, v (B, H, N, D); returns (B, H, N, D). ``pinv_over_heads``: the
    pseudo-inverse's initial coefficient over the heads of each sequence (:func:`iterative_pinv`)."""
    batch, _, seq_len, _ = q.shape
    pool, used = segment_means_pooling(key_padding_mask, (batch, seq_len), num_landmarks, q.dtype, q.device)
    pool = pool[:, None]  # (B, 1, m, N), shared by the heads
    q = q * scaling
    q_landmarks, k_landmarks = pool @ q, pool @ k  # (B, H, m, D)
    used_cols = used[:, None, None, :]
    kernel_f = masked_softmax(q @ k_landmarks.transpose(-1, -2), used_cols)  # (B, H, N, m)

    lengths = torch.full((batch,), seq_len, device=q.device) if key_padding_mask is None else key_padding_mask.sum(-1)
    short = (lengths <= num_landmarks)[:, None, None, None]  # every real token is its own landmark
    # Traced: both forms and torch.where. Eager skips the form that no sequence uses (speed only).
    eager = not is_tracing()
    if eager and bool(short.all()):
        return kernel_f @ (pool @ v)
    kernel_a = masked_softmax(q_landmarks @ k_landmarks.transpose(-1, -2), used_cols)  # (B, H, m, m)
    keys = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    kernel_b = masked_softmax(q_landmarks @ k.transpose(-1, -2), keys)  # (B, H, m, N)
    out = kernel_f @ (iterative_pinv(kernel_a, pinv_iterations, coefficient_over_heads=pinv_over_heads) @ (kernel_b @ v))
    if eager and not bool(short.any()):
        return out
    return torch.where(short, kernel_f @ (pool @ v), out)


PINV_COEFFICIENTS = ("matrix", "heads")


@dataclass
class NystromformerOptions(MethodOptions):
    num_landmarks: int = field(
        default=64,
        metadata={
            "help": ("m; the paper's BERT-size pretraining and the official nystrom-512 config (its LRA configs try 32-256).")
        },
    )
    pinv_iterations: int = field(
        default=6, metadata={"help": ("Iterations of the pseudo-inverse (paper section 3, official `iterative_inv(n_iter=6)`).")}
    )
    pinv_coefficient: str = field(
        default="matrix",
        metadata={
            "help": (
                'Initial coefficient of the pseudo-inverse: `"matrix"`, 1 / (‖A‖₁ ‖A‖∞) per matrix (Razavi et '
                'al.); `"heads"`, 1 / (largest column sum over the heads of each sequence), the official code\'s for one '
                "sequence, which released checkpoints were trained with (docs/released_checkpoints.md)."
            )
        },
    )
    conv_kernel_size: int | None = field(
        default=None,
        metadata={
            "help": (
                "Odd window of a depthwise convolution over V added to the output, one filter per head (official BERT "
                "config: 33); None or 0 = off, the default, since pretrained checkpoints lack this new parameter."
            )
        },
    )

    def validate(self) -> None:
        check_int("num_landmarks", self.num_landmarks, 1)
        check_int("pinv_iterations", self.pinv_iterations, 0)
        check_choice("pinv_coefficient", self.pinv_coefficient, PINV_COEFFICIENTS)
        size = self.conv_kernel_size
        if size is None or (size == 0 and not isinstance(size, bool)):
            return
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % 2 == 0:
            raise ValueError(f"option 'conv_kernel_size' must be a positive odd integer, or None / 0 for off; got {size!r}")


@register_method
class Nystromformer(AttentionMethod):
    """F A^+ (B V) with m segment-mean landmarks (Xiong et al. 2021), padding-exact."""

    name = "nystromformer"
    paper = Paper(
        "Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention", "Xiong et al., AAAI 2021", "2102.03902"
    )
    cost = "O(n l d + l³)"
    budget_option = "num_landmarks"
    options_cls = NystromformerOptions

    def __init__(self, options: NystromformerOptions, shape: AttentionShape):
        super().__init__(options, shape)
        self.conv = depthwise_value_conv(shape.num_heads, options.conv_kernel_size)

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)  # softmax, pseudo-inverse and segment sums in fp32 for fp16 / bf16
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        opts = self.options
        over_heads = opts.pinv_coefficient == "heads"
        out = nystrom_attention(q, k, v, key_padding_mask, scaling, opts.num_landmarks, opts.pinv_iterations, over_heads)
        if self.conv is not None:
            out = out + apply_value_conv(self.conv, v)
        return out
