"""Exact softmax attention through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import register_method
from .base import AttentionMethod, Paper


def exact_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """softmax(Q K^T * scaling) V over the real keys, by SDPA (flash / memory-efficient kernels)."""
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)


@register_method
class SoftmaxAttention(AttentionMethod):
    """Exact softmax attention (no options)."""

    name = "softmax"
    paper = Paper("Attention Is All You Need", "Vaswani et al., NeurIPS 2017", "1706.03762")
    cost = "O(n² d)"

    def attend(self, q, k, v, key_padding_mask, scaling):
        return exact_attention(q, k, v, key_padding_mask, scaling)

    @staticmethod
    def probabilities(q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        """softmax(Q K^T * scaling) over the real keys, (B, H, N, N): what ``output_attentions=True``
        returns, as Transformers' eager attention (padded query rows too; no dropout)."""
        scores = (q @ k.transpose(-1, -2)).float() * scaling
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
        return scores.softmax(-1).to(q.dtype)


def softmax_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact attention in float64 from its definition, for tests and error measurements."""
    scores = q.double() @ k.double().transpose(-1, -2) * q.shape[-1] ** -0.5
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v.double()).to(q.dtype)
