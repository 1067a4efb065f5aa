"""ProbSparse self-attention of Informer (Zhou et al., AAAI 2021), the baseline of seed 000
(section 3.3.1; Table 1 "Informer · w/ padding mask", made padding-aware as section 4.4 says).

For every query the sparsity measurement (Informer eq. 4, seed 000 section 3.3.1)

    M(q_i, K) = max_j (q_i k_j s) - mean_j (q_i k_j s)

is estimated on U = c ceil(ln m) keys drawn for that query uniformly with replacement among the m
real keys; the u = c ceil(ln m) real queries with the largest M get exact softmax attention over the
real keys, every other query outputs the mean of the real value rows (the "lazy" queries of
Informer's encoder).

Choices where the paper is vague:
- Counts as Informer's official code (factor * ceil(ln L)), with L the number of real tokens m of
  each sequence, at least 1 and at most m. When u >= m every real query is exact, which is the
  exactness limit of the method (e.g. a large ``factor``).
- The mean in M is over the U sampled keys (the estimate of Informer eq. 4); the official code
  divides the sampled sum by L_K instead. The key draws are shared by the heads and the batch (as
  the official ``torch.randint(L_K, (L_Q, sample_k))``), mapped to each sequence's real tokens.
- The selection (M and top-u) carries no gradient; the exact rows and the mean of V do.

Not padding invariant: the key draws (one row of uniforms per position) depend on the padded
length n.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import register_method
from .base import AttentionMethod, MethodOptions, check_int, check_positive, compute_dtype
from .skeinformer import gather_rows, masked_softmax_attention, real_mask, uniform_real_positions, value_mean

_CHUNK_ELEMENTS = 2**22  # bound on the gathered sampled keys held at once


def informer_count(length: torch.Tensor, factor: float) -> torch.Tensor:
    """c * ceil(ln m), clamped to [1, m] (0 for m = 0): the U and u of ProbSparse attention."""
    count = torch.ceil(factor * torch.ceil(torch.log(length.clamp(min=1).double()))).long()
    return torch.minimum(count.clamp(min=1), length)


def sparsity_measurement(
    q: torch.Tensor,
    k: torch.Tensor,
    real: torch.Tensor,
    scaling: float,
    factor: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Estimated M(q_i, K) (B, H, N) from U = c ceil(ln m) sampled real keys per query; -inf for
    padded queries."""
    batch, heads, seq_len, dim = q.shape
    lengths = real.sum(-1)
    max_samples = int(informer_count(torch.tensor(seq_len), factor))
    uniform = torch.rand(seq_len, max_samples, generator=generator, device=q.device)
    positions = uniform_real_positions(uniform.expand(batch, -1, -1), real)  # (B, N, U)
    valid = torch.arange(max_samples, device=q.device) < informer_count(lengths, factor)[:, None, None, None]
    num_valid = valid.sum(-1).clamp(min=1)
    measurement = torch.empty(batch, heads, seq_len, dtype=q.dtype, device=q.device)
    chunk = max(1, _CHUNK_ELEMENTS // (batch * heads * max_samples * dim))
    for start in range(0, seq_len, chunk):
        index = positions[:, start : start + chunk]  # (B, C, U)
        size = index.shape[1]
        keys = k.gather(2, index.reshape(batch, 1, -1, 1).expand(-1, heads, -1, dim))
        keys = keys.view(batch, heads, size, max_samples, dim)
        dots = (q[:, :, start : start + chunk, None, :] @ keys.transpose(-1, -2)).squeeze(-2) * scaling
        top = dots.masked_fill(~valid, float("-inf")).amax(-1)
        measurement[:, :, start : start + size] = top - (dots * valid).sum(-1) / num_valid
    return measurement.masked_fill(~real[:, None, :], float("-inf"))


@dataclass
class InformerOptions(MethodOptions):
    # c of u = c ln L (Informer section 3.1 / official default factor 5)
    factor: float = 5
    seed: int = 0

    def validate(self) -> None:
        check_positive("factor", self.factor)
        check_int("seed", self.seed, 0)


@register_method
class Informer(AttentionMethod):
    """ProbSparse self-attention: exact rows for the top-u queries by M, mean of V for the rest."""

    name = "informer"
    options_cls = InformerOptions
    samples = True
    padding_invariant = False  # the key draws depend on the padded length n

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        batch, heads, seq_len, _ = q.shape
        real = real_mask(key_padding_mask, batch, seq_len, q.device)
        factor = self.options.factor
        with torch.no_grad():
            measurement = sparsity_measurement(q, k, real, scaling, factor, self.generator(q.device))
            max_top = int(informer_count(torch.tensor(seq_len), factor))
            top = measurement.topk(max_top, dim=-1).indices  # (B, H, u_max), largest M first
            is_top = torch.arange(max_top, device=q.device) < informer_count(real.sum(-1), factor)[:, None, None]
        lazy = value_mean(v, real)  # (B, H, 1, D)
        _, exact = masked_softmax_attention(gather_rows(q, top), k, v, real, scaling)
        exact = torch.where(is_top[..., None], exact, lazy)  # ranks beyond u_b stay lazy
        return lazy.expand_as(v).scatter(2, top[..., None].expand_as(exact), exact)

