"""Skeinformer and V-Mean (Chen, Zeng et al., "Sketching as a Tool for Understanding and
Accelerating Self-attention for Long Sequences", NAACL 2022).

``skeinformer`` is Algorithm 1: pilot rows, importance-sampled columns, adaptive row normalisation
and pilot reutilisation; its Table 1 ablations are options. ``vmean`` outputs the mean of the real
value rows for every query. What each computes and the choices made where the paper is vague
(sampling, padding, exactness limit): docs/methods/skeinformer.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..registry import register_method
from .base import (
    AttentionMethod,
    MethodOptions,
    Paper,
    check_choice,
    check_int,
    compute_dtype,
    is_tracing,
    random_bits,
    seed_field,
    uniform_from_bits,
    uniform_real_positions,
)
from .softmax import exact_attention

SKEINFORMER_PAPER = Paper(
    "Sketching as a Tool for Understanding and Accelerating Self-attention for Long Sequences",
    "Chen, Zeng et al., NAACL 2022",
    "2112.05359",
)


def real_mask(key_padding_mask: torch.Tensor | None, batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """Bool (B, N), True for real tokens (all True when there is no padding)."""
    if key_padding_mask is None:
        return torch.ones(batch, seq_len, dtype=torch.bool, device=device)
    return key_padding_mask


def value_mean(v: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mean of the real value rows, (B, H, 1, D)."""
    weights = real[:, None, :, None].to(v.dtype)
    return (v * weights).sum(2, keepdim=True) / weights.sum(2, keepdim=True).clamp(min=1)


def fill_masked(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``scores`` with the dtype's lowest value where ``keep`` (broadcast) is False. Eager mode skips
    an all-True ``keep``, which would change nothing (a speed shortcut: the fill and its backward
    are full passes over the scores); traced models always fill."""
    if not is_tracing() and bool(keep.all()):
        return scores
    return scores.masked_fill(~keep, torch.finfo(scores.dtype).min)


def masked_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rows softmax(q K^T s) over the real keys and their outputs: (weights, weights @ v)."""
    weights = fill_masked((q * scaling) @ k.transpose(-1, -2), real[:, None, None, :]).softmax(-1)
    return weights, weights @ v


def column_probabilities(pilot_rows: torch.Tensor, v: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Eq. (5): p_i ∝ (sum_k b_{j_k i}^2)^(1/2) ||V_i|| from the pilot rows B_J (B, H, d, N);
    padded columns get 0 (section 4.4). Returns (B, H, N), summing to 1 over the real columns."""
    scores = pilot_rows.square().sum(-2).sqrt() * v.norm(dim=-1) * real[:, None, :]
    return scores / scores.sum(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)


def sample_without_replacement(probs: torch.Tensor, real: torch.Tensor, num: int, bits: torch.Tensor) -> torch.Tensor:
    """``num`` column indices (B, H, num) drawn without replacement with probabilities ``probs``
    (B, H, N) by Gumbel top-k, with one Gumbel variable per column made from random ``bits``
    (broadcastable to ``probs``); real columns always rank before padded ones, so a sequence with
    m <= num real tokens gets all of them."""
    tiny = torch.finfo(probs.dtype).tiny
    gumbel = -torch.log(-torch.log(uniform_from_bits(bits, probs.dtype)))
    keys = (probs.clamp(min=tiny).log() + gumbel).masked_fill(~real[:, None, :], float("-inf"))
    return keys.topk(num, dim=-1).indices


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` (B, H, d) of x (B, H, N, D): (B, H, d, D)."""
    return x.gather(2, index[..., None].expand(-1, -1, -1, x.shape[-1]))


@dataclass
class SkeinformerOptions(MethodOptions):
    num_samples: int = field(default=256, metadata={"help": "d of Algorithm 1 (Appendix A.1: 256)."})
    column_sampling: str = field(
        default="importance", metadata={"help": ('Eq. (5) (section 4.1); `"uniform"` = Table 1\'s "w/o column sampling".')}
    )
    row_normalization: str = field(
        default="adaptive",
        metadata={
            "help": (
                'Eq. (6) (section 4.2); `"simple"` (softmax over the sampled columns, Informer\'s: Table 1\'s "w/ simple '
                'row normalization") or `"none"` (D⁻¹ A S Sᵀ V of section 4.1 with the exact D).'
            )
        },
    )
    pilot_reuse: bool = field(
        default=True,
        metadata={"help": ('Algorithm 1 line 12 (section 4.3); False = Table 1\'s "w/o pilot sampling reutilization".')},
    )
    seed: int = seed_field()

    def validate(self) -> None:
        check_int("num_samples", self.num_samples, 1)
        check_choice("column_sampling", self.column_sampling, ["importance", "uniform"])
        check_choice("row_normalization", self.row_normalization, ["adaptive", "simple", "none"])
        if not isinstance(self.pilot_reuse, bool):
            raise ValueError(f"option 'pilot_reuse' must be True or False, got {self.pilot_reuse!r}")
        check_int("seed", self.seed, 0)


def skeinformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    real: torch.Tensor,
    scaling: float,
    options: SkeinformerOptions,
    pilot_bits: torch.Tensor | None,
    column_bits: torch.Tensor,
) -> torch.Tensor:
    """Algorithm 1 on (B, H, N, D) inputs in a float dtype; ``real`` (B, N) marks real tokens.
    Random bits (shared by the batch): ``pilot_bits`` (H, d) for the pilot rows (None when neither
    the importance sampling nor the pilot reutilisation needs them), ``column_bits`` (H, N) for the
    Gumbel variables of the columns."""
    batch, heads, seq_len, _ = q.shape
    num = options.num_samples
    lengths = real.sum(-1)[:, None, None]  # m, (B, 1, 1)

    # lines 1-3: pilot sampling, uniform with replacement among the real queries
    if pilot_bits is not None:
        pilot_index = uniform_real_positions(pilot_bits, real)  # (B, H, d)
        pilot_rows, pilot_out = masked_softmax_attention(gather_rows(q, pilot_index), k, v, real, scaling)

    # lines 4-5: column probabilities and sampling without replacement
    with torch.no_grad():
        if options.column_sampling == "importance":
            probs = column_probabilities(pilot_rows, v, real)
        else:
            probs = (real[:, None, :] / lengths).to(q.dtype).expand(batch, heads, seq_len)
        columns = sample_without_replacement(probs, real, num, column_bits)
    valid = real[:, None, :].expand(batch, heads, seq_len).gather(-1, columns)[:, :, None, :]  # (B, H, 1, d)
    num_valid = valid.sum(-1, keepdim=True)  # d per sequence: min(num, m)
    k_cols, v_cols = gather_rows(k, columns), gather_rows(v, columns) * valid.mT

    # lines 6-7: the sampled columns of A (shifted by the row max of the sampled logits)
    logits = (q * scaling) @ k_cols.transpose(-1, -2)  # (B, H, N, d)
    masked = fill_masked(logits, valid)  # padded draws (sequences with m < d): exp(masked - shift) = 0
    if options.row_normalization == "adaptive":  # lines 8-11, eq. (6)
        # R_i is invariant to a per-row shift; 0 for a sequence without real tokens keeps it finite
        shift = torch.where(num_valid > 0, masked.amax(-1, keepdim=True), 0.0).detach()
        sampled = (masked - shift).exp()
        # log g_i = mean_k of the valid logits = q_i . (mean of the drawn real keys) s
        mean_key = (k_cols * valid.mT).sum(2, keepdim=True) / num_valid.mT.clamp(min=1)
        geo_mean = ((q * scaling) @ mean_key.mT - shift).exp()  # g
        real_v_sum = (v * real[:, None, :, None]).sum(2, keepdim=True)
        unselected_v = real_v_sum - v_cols.sum(2, keepdim=True)  # V_{(J')^c}^T 1
        numerator = sampled @ v_cols + geo_mean * unselected_v
        denominator = sampled.sum(-1, keepdim=True) + (lengths[..., None] - num_valid) * geo_mean
        out = numerator / denominator.clamp(min=torch.finfo(q.dtype).tiny)
    elif options.row_normalization == "simple":  # softmax over the sampled columns (Informer)
        out = masked.softmax(-1) @ v_cols
    else:  # D^-1 A S S^T V with the exact row sums D and the 1/(d p_j) weights of Definition 3.1
        scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~real[:, None, None, :], torch.finfo(q.dtype).min)
        sampled = (masked - scores.logsumexp(-1, keepdim=True)).exp()
        all_drawn = num_valid >= lengths[..., None]
        drawn_probs = probs.gather(-1, columns)[:, :, None, :].clamp(min=torch.finfo(q.dtype).tiny)
        weights = torch.where(all_drawn, 1.0, 1.0 / (num_valid * drawn_probs))
        out = (sampled * weights) @ v_cols

    if options.pilot_reuse:  # line 12: the pilot rows' exact outputs
        # Pilot rows are drawn with replacement: "mean" over the copies of a row (all equal) writes
        # it once and sends each copy its share of the gradient (plain scatter would send each
        # copy the whole gradient).
        index = pilot_index[..., None].expand_as(pilot_out)
        out = out.scatter_reduce(2, index, pilot_out, reduce="mean", include_self=False)
    return out


@register_method
class Skeinformer(AttentionMethod):
    """Algorithm 1 of Chen, Zeng et al. 2022: pilot sampling, eq. (5) column importance sampling,
    eq. (6) adaptive row normalisation, pilot sampling reutilisation."""

    name = "skeinformer"
    paper = SKEINFORMER_PAPER
    cost = "O(n s d)"
    budget_option = "num_samples"
    options_cls = SkeinformerOptions
    samples = True

    def seeded_draws(self, generator):
        # Shared by the batch: pilot rows per head, one Gumbel variable per head and key position.
        heads, num = self.shape.num_heads, self.options.num_samples
        return {
            "pilot_bits": random_bits((heads, num), generator),
            "column_bits": random_bits((heads, self.shape.max_seq_len), generator),
        }

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        batch, heads, seq_len, _ = q.shape
        opts = self.options
        if opts.num_samples >= seq_len:  # every column is drawn: exact softmax attention
            return exact_attention(q, k, v, key_padding_mask, scaling)
        real = real_mask(key_padding_mask, batch, seq_len, q.device)
        needs_pilot = opts.pilot_reuse or opts.column_sampling == "importance"
        pilot_bits = self.draw_bits("pilot_bits") if needs_pilot else None
        column_bits = self.draw_bits("column_bits", (heads, seq_len))
        return skeinformer_attention(q, k, v, real, scaling, opts, pilot_bits, column_bits)


@register_method
class VMean(AttentionMethod):
    """(1/m) 1 1^T V (Skeinformer paper, section 5): every query outputs the mean of the real value rows."""

    name = "vmean"
    paper = SKEINFORMER_PAPER
    cost = "O(n d)"

    def attend(self, q, k, v, key_padding_mask, scaling):
        batch, _, seq_len, _ = q.shape
        real = real_mask(key_padding_mask, batch, seq_len, q.device)
        out = value_mean(v.to(compute_dtype(v)), real).expand_as(v)
        # the output does not depend on q and k; link them with weight 0 so that they get a zero
        # gradient rather than none (the method contract expects gradients for q, k and v)
        return out + 0.0 * (q.sum() + k.sum())
