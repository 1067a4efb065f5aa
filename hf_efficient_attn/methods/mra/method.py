"""MRA-2 and MRA-2-s, the methods: the choice of backend, and the call that pads to
whole blocks, takes the block statistics and selection (:mod:`.selection`), the low-resolution part
(:mod:`.low_resolution`) and the exact part on a backend."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ...registry import register_method
from ..base import AttentionMethod, Paper, compute_dtype, is_tracing, pad_to_length
from .flex import FLEX_LENGTH_MULTIPLE, flex_mra_attention, flex_mra_attention_outside_graphs, flex_unavailable
from .gather import block_sparse_attention
from .low_resolution import low_resolution_attention
from .options import MraOptions
from .pairs import pair_attention
from .selection import block_stats, max_budget, select_blocks
from .triton import triton_mra_attention, triton_unavailable

#: Why each backend cannot run given inputs, or None: gather and pairs run every input.
BACKEND_PROBLEMS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "MraOptions"], str | None]] = {
    "gather": lambda q, k, v, options: None,
    "pairs": lambda q, k, v, options: None,
    "flex": lambda q, k, v, options: flex_unavailable(q, k, v, options.block_size),
    "triton": triton_unavailable,
}
#: The backends ``auto`` tries, in order, per device type (docs/methods/mra.md, "Backends"): on CUDA
#: the fused kernels, then static shapes (gather is launch-bound there); on CPU gather is the
#: fastest. flex is never tried: it compiles per length.
AUTO_ORDER = {"cuda": ("triton", "pairs", "gather")}
DEFAULT_AUTO_ORDER = ("gather", "pairs")

MRA_PAPER = Paper("Multi Resolution Analysis (MRA) for Approximate Self-Attention", "Zeng et al., ICML 2022", "2207.10284")


def padded_blocks(length: int, block_size: int, multiple: int) -> int:
    """Number of blocks after padding ``length`` tokens to a multiple of ``multiple`` (itself a
    multiple of ``block_size``).

    A traced graph (``torch.compile``, ``torch.export``) pads by at least one token, to at least two
    blocks: the compiler cannot tell whether a symbolic length is already a multiple, or holds one
    block, and would tie the graph to the answer (a guard: a recompilation for other lengths, an
    error under export). The extra padding changes no result: padded blocks are never selected."""
    if not is_tracing():
        return -(-length // multiple) * (multiple // block_size)
    return torch.sym_max((length // multiple + 1) * (multiple // block_size), 2)


# ----------------------------------------------------------------------------- methods


class _MraBase(AttentionMethod):
    options_cls = MraOptions
    #: True for MRA-2 (low-resolution term in the non-selected blocks), False for MRA-2-s.
    low_resolution: bool

    def _choose_backend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The backend of this call: the one asked for, or for ``auto`` the first of :data:`AUTO_ORDER`
        that can run these inputs; ``ValueError`` listing every backend's reason when none can. An
        exported program runs ``pairs``, whatever the backend (standard operators only)."""
        if torch.compiler.is_exporting():
            return "pairs"
        asked = self.options.backend
        candidates = AUTO_ORDER.get(q.device.type, DEFAULT_AUTO_ORDER) if asked == "auto" else (asked,)
        reasons = []
        for backend in candidates:
            reason = BACKEND_PROBLEMS[backend](q, k, v, self.options)
            if reason is None:
                return backend
            reasons.append(f"backend={backend!r} {reason}")
        raise ValueError(f"{self.name}: " + "; ".join(reasons))

    def attend(self, q, k, v, key_padding_mask, scaling):
        opts = self.options
        bs, (batch, _, length, _) = opts.block_size, q.shape
        backend = self._choose_backend(q, k, v)
        if backend == "triton":  # the whole call, selection included, in its own kernels
            return triton_mra_attention(q, k, v, key_padding_mask, scaling, opts, self.low_resolution)
        use_flex = backend == "flex"
        # flex: pad to a multiple of FLEX_LENGTH_MULTIPLE too, so that few lengths get compiled.
        multiple = math.lcm(bs, FLEX_LENGTH_MULTIPLE) if use_flex else bs
        nb = padded_blocks(length, bs, multiple)
        real = q.new_ones(batch, length, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
        real = pad_to_length(real, nb * bs, dim=1, value=False)
        work_dtype = q.dtype if use_flex else compute_dtype(q)
        # Padded tokens are zero (the base class zeroes key padding; internal padding adds zeros).
        # Blocks (B, H, nb, b, D): one view per tensor, shared by the block means and the exact part,
        # so that their gradients add up in one buffer.
        q, k, v = (pad_to_length(t.to(work_dtype), nb * bs, dim=2).contiguous().unflatten(2, (nb, bs)) for t in (q, k, v))
        if use_flex and not torch.is_grad_enabled():
            q, k, v = (t.detach() for t in (q, k, v))  # CPU flex refuses inputs that require grad

        stats_dtype = compute_dtype(q)
        stats = block_stats(q.to(stats_dtype), k.to(stats_dtype), v.to(stats_dtype), real, scaling)
        selected = select_blocks(
            stats.logits,
            stats.counts,
            opts.block_per_row,
            opts.initial_prior_first_n_blocks,
            opts.initial_prior_diagonal_n_blocks,
        )
        low_out = low_lse = None
        if self.low_resolution:
            low_out, low_lse = low_resolution_attention(stats, selected, scaling)
        if use_flex:
            q, k, v = (t.flatten(2, 3) for t in (q, k, v))
            # On CPU, Inductor cannot compile flex_attention inside an outer graph (docs/methods/mra.md).
            flex = flex_mra_attention if q.device.type == "cuda" else flex_mra_attention_outside_graphs
            out = flex(q, k, v, real, selected, bs, scaling, low_out, low_lse)
        elif backend == "pairs":
            out = pair_attention(
                q, k, v, selected, scaling, real, low_out, low_lse, max_pairs=max_budget(nb, opts.block_per_row)
            ).flatten(2, 3)
        else:
            out = block_sparse_attention(q, k, v, selected, scaling, real, low_out, low_lse).flatten(2, 3)
        # Slice only what was padded: a slice's backward allocates and fills a full-size gradient.
        return out if out.shape[2] == length else out[:, :, :length]


@register_method
class Mra2(_MraBase):
    """MRA-2: exact attention in the selected blocks, low resolution (eq. 13) in all others."""

    name = "mra2"
    paper = MRA_PAPER
    cost = "O((n/b)² d + n k b d)"
    budget_option = "block_per_row"
    low_resolution = True


@register_method
class Mra2Sparse(_MraBase):
    """MRA-2-s (eq. 18): exact attention in the selected blocks only."""

    name = "mra2_s"
    paper = MRA_PAPER
    cost = "O((n/b)² d + n k b d)"  # the low-resolution scores still pick the blocks
    budget_option = "block_per_row"
    low_resolution = False
