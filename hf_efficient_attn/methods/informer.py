"""ProbSparse self-attention of Informer (Zhou et al., AAAI 2021), the baseline of the
Skeinformer paper (Chen, Zeng et al., NAACL 2022, section 3.3.1), padding-aware.

The ``c ceil(ln m)`` real queries with the largest sampled sparsity measurement get exact softmax
attention, every other query the mean of the real values. What it computes and the choices made
where the paper is vague (counts, sampling, gradients): docs/methods/informer.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..registry import register_method
from .base import (
    AttentionMethod,
    MethodOptions,
    Paper,
    check_int,
    check_positive,
    compute_dtype,
    is_tracing,
    random_bits,
    seed_field,
    uniform_real_positions,
)
from .skeinformer import gather_rows, masked_softmax_attention, real_mask, value_mean

_CHUNK_ELEMENTS = 2**22  # bound on the gathered sampled keys held at once in eager mode


def informer_count(length: torch.Tensor, factor: float) -> torch.Tensor:
    """c * ceil(ln m), clamped to [1, m] (0 for m = 0): the U and u of ProbSparse attention."""
    count = torch.ceil(factor * torch.ceil(torch.log(length.clamp(min=1).double()))).long()
    return torch.minimum(count.clamp(min=1), length)


def informer_count_of(length: int, factor: float) -> int:
    """``informer_count`` of a Python int (a shape), computed the same way in double precision."""
    return min(max(math.ceil(factor * math.ceil(math.log(max(length, 1)))), 1), length)


def _measure(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, scaling: float) -> torch.Tensor:
    """max - mean of q_i . k_j s over the valid sampled keys j = positions (B, C, U) of every query
    i of q (B, H, C, D): (B, H, C). ``valid`` (B, 1, 1, U) marks the samples that count."""
    batch, heads, size, dim = q.shape
    keys = k.gather(2, positions.reshape(batch, 1, -1, 1).expand(-1, heads, -1, dim))
    dots = (q[:, :, :, None, :] @ keys.view(batch, heads, size, -1, dim).transpose(-1, -2)).squeeze(-2) * scaling
    top = dots.masked_fill(~valid, float("-inf")).amax(-1)
    return top - (dots * valid).sum(-1) / valid.sum(-1).clamp(min=1)


def sparsity_measurement(
    q: torch.Tensor, k: torch.Tensor, real: torch.Tensor, scaling: float, factor: float, bits: torch.Tensor
) -> torch.Tensor:
    """Estimated M(q_i, K) (B, H, N) from U = c ceil(ln m) sampled real keys per query; -inf for
    padded queries. ``bits`` (N, U_max) are random bits (:func:`random_bits`), one row per query
    position shared by the batch, with U_max >= U of every sequence; sample j of query i is the
    real key that bits[i, j] maps to, and only the first U samples of a sequence count."""
    batch, heads, seq_len, dim = q.shape
    positions = uniform_real_positions(bits, real)  # (B, N, U_max)
    valid = torch.arange(bits.shape[1], device=q.device) < informer_count(real.sum(-1), factor)[:, None, None, None]
    if is_tracing():  # one piece: a loop over chunks of a symbolic length cannot be traced
        measurement = _measure(q, k, positions, valid, scaling)
    else:
        chunk = max(1, _CHUNK_ELEMENTS // (batch * heads * bits.shape[1] * dim))
        starts = range(0, seq_len, chunk)
        pieces = [_measure(q[:, :, i : i + chunk], k, positions[:, i : i + chunk], valid, scaling) for i in starts]
        measurement = torch.cat(pieces, 2)
    return measurement.masked_fill(~real[:, None, :], float("-inf"))


@dataclass
class InformerOptions(MethodOptions):
    factor: float = field(default=5, metadata={"help": "c of u = c ln L (Informer section 3.1, official default)."})
    seed: int = seed_field()

    def validate(self) -> None:
        check_positive("factor", self.factor)
        check_int("seed", self.seed, 0)


@register_method
class Informer(AttentionMethod):
    """ProbSparse self-attention: exact rows for the top-u queries by M, mean of V for the rest."""

    name = "informer"
    paper = Paper(
        "Informer: Beyond Efficient Transformer for Long Sequence Time-Series Forecasting", "Zhou et al., AAAI 2021", "2012.07436"
    )
    cost = "O(n c ln n · d)"
    budget_option = "factor"
    options_cls = InformerOptions
    samples = True

    def seeded_draws(self, generator):
        # One row of key draws per query position, shared by the heads and the batch.
        max_len = self.shape.max_seq_len
        return {"key_bits": random_bits((max_len, informer_count_of(max_len, self.options.factor)), generator)}

    def count_bound(self, seq_len: int) -> int:
        """A static bound on U and u of every sequence of ``seq_len`` tokens: c ceil(ln n), or, traced
        (torch.export cannot keep the log of a symbolic length), that of max_seq_len capped at n.
        Samples and ranks past a sequence's own count are masked, so the outputs are the same."""
        if is_tracing():
            return torch.sym_min(informer_count_of(self.shape.max_seq_len, self.options.factor), seq_len)
        return informer_count_of(seq_len, self.options.factor)

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        batch, _, seq_len, _ = q.shape
        real = real_mask(key_padding_mask, batch, seq_len, q.device)
        factor, bound = self.options.factor, self.count_bound(seq_len)
        with torch.no_grad():
            bits = self.draw_bits("key_bits", (seq_len, bound))
            measurement = sparsity_measurement(q, k, real, scaling, factor, bits)
            top = measurement.topk(bound, dim=-1).indices  # (B, H, u_max), largest M first
            is_top = torch.arange(bound, device=q.device) < informer_count(real.sum(-1), factor)[:, None, None]
        lazy = value_mean(v, real)  # (B, H, 1, D)
        _, exact = masked_softmax_attention(gather_rows(q, top), k, v, real, scaling)
        exact = torch.where(is_top[..., None], exact, lazy)  # ranks beyond u_b stay lazy
        return lazy.expand_as(v).scatter(2, top[..., None].expand_as(exact), exact)
