"""Kernelized attention and Skyformer (Chen et al., "Skyformer: Remodel Self-Attention
with Gaussian Kernel and Nystrom Method", NeurIPS 2021).

``kernelized`` replaces softmax by a Gaussian kernel (section 4.1, eq. 3), exactly; ``skyformer``
approximates that kernel by the Nystrom method on its PSD completion (section 4.2) with the
iterative pseudo-inverse of section 4.4. What each computes and the choices made where the paper is
vague (normalisation, landmarks, padding, exactness limit): docs/methods/skyformer.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..registry import register_method
from .base import (
    AttentionMethod,
    MethodOptions,
    Paper,
    check_int,
    check_positive,
    compute_dtype,
    pad_to_length,
    random_bits,
    seed_field,
    uniform_real_positions,
)
from .nystromformer import iterative_pinv

SKYFORMER_PAPER = Paper(
    "Skyformer: Remodel Self-Attention with Gaussian Kernel and Nyström Method", "Chen et al., NeurIPS 2021", "2111.00035"
)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """kappa(x_i, y_j) = exp(-|x_i - y_j|^2 / 2) for x (..., n, D), y (..., m, D): (..., n, m)."""
    exponent = x @ y.transpose(-1, -2) - x.square().sum(-1)[..., :, None] / 2 - y.square().sum(-1)[..., None, :] / 2
    return exponent.clamp(max=0).exp()  # the exponent is -|x - y|^2 / 2 <= 0 up to rounding


def kernelized_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None, data_scale: float
) -> torch.Tensor:
    """kappa(Q s, K s) V with s = data_scale (p^(-1/4)); padded keys get weight 0. O(n^2) work.

    Computed by ``scaled_dot_product_attention`` (fused kernels where available) on
    augmented vectors x' = [x, |x|^2/2, 1], y' = [y, 0, -|y|^2/2] (x = q s, y = k s), whose dot
    product is x.y - |y|^2/2, plus one extra key [0, 1, 0] with score |x|^2/2 and value
    [0, 1]. Since x.y - |y|^2/2 - |x|^2/2 = -|x - y|^2/2, softmax gives the real keys the weights
    kappa(x, y_j) / (1 + sum_j kappa(x, y_j)) and the extra key 1 / (1 + sum_j kappa(x, y_j)); the
    ratio of the two output parts is sum_j kappa(x, y_j) v_j. The extra key holds the largest
    score of every row, so the softmax is well scaled, and the divisor lies in [1/(n+1), 1].
    """
    batch, heads = q.shape[:2]
    x, y = q * data_scale, k * data_scale
    half_sq_x, half_sq_y = x.square().sum(-1, keepdim=True) / 2, y.square().sum(-1, keepdim=True) / 2
    queries = torch.cat([x, half_sq_x, torch.ones_like(half_sq_x)], -1)
    keys = torch.cat([y, torch.zeros_like(half_sq_y), -half_sq_y], -1)
    values = torch.cat([v, torch.zeros_like(v[..., :1])], -1)
    extra_key = keys.new_zeros(batch, heads, 1, keys.shape[-1])
    extra_key[..., -2] = 1.0
    extra_value = values.new_zeros(batch, heads, 1, values.shape[-1])
    extra_value[..., -1] = 1.0
    keys, values = torch.cat([keys, extra_key], 2), torch.cat([values, extra_value], 2)
    # zero columns up to a multiple of 8 change no dot product and keep the fused kernels usable
    queries, keys, values = (pad_to_length(t, -(-t.shape[-1] // 8) * 8, dim=-1) for t in (queries, keys, values))
    mask = None
    if key_padding_mask is not None:
        mask = torch.cat([key_padding_mask, key_padding_mask.new_ones(batch, 1)], -1)[:, None, None, :]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=1.0)
    return out[..., : v.shape[-1]] / out[..., v.shape[-1] : v.shape[-1] + 1]


def sample_landmarks(
    key_padding_mask: torch.Tensor | None, shape: tuple[int, int], bits: torch.Tensor, accumulation: int
) -> torch.Tensor:
    """Indices (B, accumulation, num_landmarks) into the rows of [Q; K] (0..2N-1), one per random
    bit draw (:func:`random_bits`, accumulation * num_landmarks of them, shared by the batch), uniform
    over the real tokens: the first half of the draws (in row-major order, as the official code)
    from the queries, the rest from the keys."""
    batch, seq_len = shape
    real = torch.ones(shape, dtype=torch.bool, device=bits.device) if key_padding_mask is None else key_padding_mask
    index = uniform_real_positions(bits, real)  # (B, accumulation * num_landmarks)
    is_key = torch.arange(bits.shape[0], device=bits.device) >= bits.shape[0] // 2
    return torch.where(is_key, index + seq_len, index).view(batch, accumulation, -1)  # key rows follow the queries


def skyformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    landmarks: torch.Tensor,
    data_scale: float,
    gamma: float,
    pinv_iterations: int,
) -> torch.Tensor:
    """Modified Nystrom approximation of ``kernelized_attention`` (eqs. 4-6, section 4.4).

    ``landmarks``: (B, accumulation, d) row indices of [Q; K]; column j of S is the sum of the
    indicators of ``landmarks[:, :, j]``.
    """
    batch, heads, seq_len, dim = q.shape
    accumulation, num_landmarks = landmarks.shape[1:]
    points = torch.cat([q, k], dim=2) * data_scale  # rows of the completion, eq. (4)
    index = landmarks.reshape(batch, 1, -1, 1).expand(batch, heads, accumulation * num_landmarks, dim)
    chosen = points.gather(2, index)  # (B, H, acc * d, D)

    def sketch(x: torch.Tensor) -> torch.Tensor:  # kappa(x, landmarks) S: sums over accumulation
        return gaussian_kernel(x, chosen).unflatten(-1, (accumulation, num_landmarks)).sum(-2)

    query_sketch = sketch(points[:, :, :seq_len])  # C_bar[Q rows] S, (B, H, N, d)
    key_sketch = sketch(points[:, :, seq_len:])  # C_bar[K rows] S
    if key_padding_mask is not None:
        key_sketch = key_sketch * key_padding_mask[:, None, :, None].to(key_sketch.dtype)
    middle = sketch(chosen).unflatten(-2, (accumulation, num_landmarks)).sum(-3)  # S^T C_bar S, (B, H, d, d)

    # Section 4.4: pseudo-inverse of D^-1/2 (M + gamma I) D^-1/2, D = diag((M + gamma I) 1).
    middle = middle + gamma * torch.eye(num_landmarks, dtype=middle.dtype, device=middle.device)
    d_inv_sqrt = middle.sum(-1).rsqrt()  # row sums >= 1 + gamma (each diagonal entry >= 1)
    normalised = d_inv_sqrt[..., :, None] * middle * d_inv_sqrt[..., None, :]
    pinv = iterative_pinv(normalised, pinv_iterations, spectral_norm_at_most_one=True)  # Lemma 3
    inverse = d_inv_sqrt[..., :, None] * pinv * d_inv_sqrt[..., None, :]
    return query_sketch @ (inverse @ (key_sketch.transpose(-1, -2) @ v))


@dataclass
class SkyformerOptions(MethodOptions):
    num_landmarks: int = field(
        default=128,
        metadata={"help": ('d, the columns of S (section 5: "the number of features to be 128 used in all methods").')},
    )
    accumulation: int = field(
        default=1, metadata={"help": ("Indicator vectors summed per column of S (1 in every official LRA config).")}
    )
    gamma: float = field(
        default=0.1, metadata={"help": ('γ of section 4.4 ("a small constant"; the official code adds 1e-1 · I).')}
    )
    pinv_iterations: int = field(
        default=6, metadata={"help": ("Iterations of Nyströmformer's iterative inverse (section 4.4; official code: 6).")}
    )
    seed: int = seed_field()

    def validate(self) -> None:
        check_int("num_landmarks", self.num_landmarks, 1)
        check_int("accumulation", self.accumulation, 1)
        check_positive("gamma", self.gamma)
        check_int("pinv_iterations", self.pinv_iterations, 0)
        check_int("seed", self.seed, 0)


class _GaussianKernelMethod(AttentionMethod):
    """Shared plumbing: fp32 compute for half inputs, data scale sqrt(scaling)."""

    approximates_softmax = False  # Gaussian kernel, not softmax (section 4.1)

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)  # exponentials, sums and the inverse in fp32 for fp16 / bf16
        return self.gaussian_attend(q.to(dtype), k.to(dtype), v.to(dtype), key_padding_mask, scaling**0.5)

    def gaussian_attend(self, q, k, v, key_padding_mask, data_scale):
        raise NotImplementedError


@register_method
class KernelizedAttention(_GaussianKernelMethod):
    """kappa(Q / p^(1/4), K / p^(1/4)) V, exactly (Skyformer paper, eq. 3; quadratic)."""

    name = "kernelized"
    paper = SKYFORMER_PAPER
    cost = "O(n² d)"

    def gaussian_attend(self, q, k, v, key_padding_mask, data_scale):
        return kernelized_attention(q, k, v, key_padding_mask, data_scale)


@register_method
class Skyformer(_GaussianKernelMethod):
    """Modified Nystrom approximation of kernelized attention with d sampled landmarks (Skyformer paper, eqs. 5-6)."""

    name = "skyformer"
    paper = SKYFORMER_PAPER
    cost = "O(n s d + s³)"
    budget_option = "num_landmarks"
    exact_reference = "kernelized"
    options_cls = SkyformerOptions
    samples = True  # fresh landmarks every training step, seeded ones in eval

    def seeded_draws(self, generator):
        # One draw per landmark, shared by the batch and independent of the length.
        return {"landmark_bits": random_bits((self.options.accumulation * self.options.num_landmarks,), generator)}

    def gaussian_attend(self, q, k, v, key_padding_mask, data_scale):
        opts = self.options
        shape = (q.shape[0], q.shape[2])
        landmarks = sample_landmarks(key_padding_mask, shape, self.draw_bits("landmark_bits"), opts.accumulation)
        return skyformer_attention(q, k, v, key_padding_mask, landmarks, data_scale, opts.gamma, opts.pinv_iterations)
