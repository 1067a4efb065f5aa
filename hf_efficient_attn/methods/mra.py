"""MRA-2 and MRA-2-s (Zeng et al., "Multi Resolution Analysis (MRA) for Approximate Self-Attention",
ICML 2022): masked block means and block-level scores (section 4.1, eqs. 10-12), the budget's
selection of block pairs (Alg. 1 with R = {b, 1}), and the output (Alg. 2, eqs. 13-14, 17-18): exact
attention in the selected blocks merged with the low-resolution part by their log-sum-exps.

The exact part runs on one of three backends: ``gather`` (:mod:`.block_sparse`), ``pairs``
(:mod:`.block_pairs`) or ``flex`` (FlexAttention, below); the ``triton`` backend (:mod:`.mra_triton`)
runs the whole call, selection included, in its own fused kernels. ``auto`` runs ``triton`` on CUDA
where it supports the inputs, else ``pairs``, and ``gather`` elsewhere. What each computes, the
choices made where the paper is vague (ranking, ties, priors, padding), compilation and export:
docs/methods/mra.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ..registry import register_method
from .base import AttentionMethod, MethodOptions, Paper, check_choice, check_int, compute_dtype, is_tracing, pad_to_length
from .block_pairs import pair_attention, row_major_cumsum
from .block_sparse import block_sparse_attention
from .mra_flex import FLEX_LENGTH_MULTIPLE, flex_mra_attention, flex_mra_attention_outside_graphs, flex_unavailable
from .mra_triton import triton_mra_attention, triton_unavailable

BACKENDS = ("auto", "flex", "gather", "pairs", "triton")
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
#: Elements of the (nb x nb) low-resolution tensors recomputed at once in the backward (4 MiB in
#: fp32): slices of whole heads, so that long inputs do not keep them for every head at once.
LOW_RESOLUTION_SLICE_ELEMENTS = 2**20

MRA_PAPER = Paper("Multi Resolution Analysis (MRA) for Approximate Self-Attention", "Zeng et al., ICML 2022", "2207.10284")


@dataclass
class MraOptions(MethodOptions):
    block_size: int = field(
        default=32,
        metadata={
            "help": (
                "b in R = {b, 1} (section 5; 32 is the paper's and the only size of the official CUDA kernels). Any "
                "positive integer works (exact at full budget for 1, 7 and 64, tested); a smaller b makes the (n/b)² part dearer."
            )
        },
    )
    block_per_row: int = field(
        default=4,
        metadata={
            "help": (
                "Exact blocks per query block on average (the budget of Alg. 1); 4 = Transformers' `MraConfig` default and "
                "the official RoBERTa-512 config. The official 4096-token runs use 16 with priors "
                "(`configs/methods/mra2-4096.json`)."
            )
        },
    )
    initial_prior_first_n_blocks: int = field(
        default=0,
        metadata={
            "help": (
                'Alg. 1 "prespecified via priors": the first n query-block rows and key-block columns (global tokens); '
                "0 = off, as in `MraConfig`."
            )
        },
    )
    initial_prior_diagonal_n_blocks: int = field(
        default=0, metadata={"help": ("Priors on the band |x − y| ≤ n // 2 around the diagonal; 0 = off, as in `MraConfig`.")}
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": (
                '`"gather"` (plain PyTorch, training and inference), `"pairs"` (plain PyTorch, static shapes), '
                '`"flex"` (compiled FlexAttention, inference on CPU), `"triton"` (fused Triton kernels, CUDA) or `"auto"` '
                "(on CUDA `triton` where it supports the inputs, else `pairs`; `gather` elsewhere)."
            )
        },
    )

    def validate(self) -> None:
        check_int("block_size", self.block_size, 1)
        check_int("block_per_row", self.block_per_row, 1)
        check_int("initial_prior_first_n_blocks", self.initial_prior_first_n_blocks, 0)
        check_int("initial_prior_diagonal_n_blocks", self.initial_prior_diagonal_n_blocks, 0)
        check_choice("backend", self.backend, BACKENDS)


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


class BlockStats(NamedTuple):
    """Low-resolution view of one padded input (eqs. 10-12 and 17)."""

    counts: torch.Tensor  # (B, nb) number of real tokens per block
    query_means: torch.Tensor  # (B, H, nb, D) mean of the real queries of each block
    key_means: torch.Tensor  # (B, H, nb, D)
    value_means: torch.Tensor  # (B, H, nb, D)
    logits: torch.Tensor  # (B, H, nb, nb) log mu = query mean . key mean * scaling, no gradient


def block_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor, scaling: float) -> BlockStats:
    """Masked block means (eqs. 11, 17) and log mu (eq. 12) of q, k, v as blocks (B, H, nb, b, D);
    ``real`` (B, nb * b) marks real tokens; q, k, v must be zero at the other positions."""
    counts = real.view(real.shape[0], -1, q.shape[3]).sum(-1)
    inv_count = 1.0 / counts.clamp(min=1).to(q.dtype)[:, None, :, None]
    q_mean, k_mean, v_mean = (t.sum(3) * inv_count for t in (q, k, v))
    with torch.no_grad():
        logits = q_mean @ k_mean.transpose(-1, -2) * scaling
    return BlockStats(counts, q_mean, k_mean, v_mean, logits)


def max_budget(blocks: int, block_per_row: int) -> int:
    """The largest budget of a sequence of ``blocks`` blocks: block_per_row x blocks, at most all pairs."""
    return torch.sym_min(block_per_row * blocks, blocks * blocks)


@torch.no_grad()
def select_blocks(
    logits: torch.Tensor, counts: torch.Tensor, block_per_row: int, first_n: int = 0, diagonal_n: int = 0
) -> torch.Tensor:
    """Alg. 1 for R = {b, 1}: bool (B, H, nb, nb), True for the block pairs attended exactly.

    Per sequence the budget is block_per_row x (query blocks holding a real token), capped at
    all real block pairs; pairs are ranked over the whole head (docs/methods/mra.md, "Choices where the paper is vague")."""
    batch, heads, nb, _ = logits.shape
    has_real = counts > 0
    # Pairs with a block without real tokens are never selected (a no-op without padding).
    logits = logits.masked_fill(~(has_real[:, None, :, None] & has_real[:, None, None, :]), -math.inf)
    row_max = logits.amax(-1, keepdim=True)
    score = logits - row_max.masked_fill_(row_max == -math.inf, 0.0)  # -inf: not eligible
    if first_n > 0 or diagonal_n > 0:
        # Rank by the number of prior sets a pair is in (first rows, first columns, diagonal band),
        # then by score: the official get_block_idxes adds 5e3 per set. Eligible scores lie in
        # [lowest, 0], so a step of 1 - lowest per set keeps the levels apart.
        idx = torch.arange(nb, device=logits.device)
        prior_sets = (idx[:, None] < first_n).to(score.dtype) + (idx[None, :] < first_n).to(score.dtype)
        if diagonal_n > 0:
            prior_sets += ((idx[:, None] - idx[None, :]).abs() <= diagonal_n // 2).to(score.dtype)
        lowest = score.masked_fill(score == -math.inf, math.inf).amin((-2, -1), keepdim=True)
        score = score + prior_sets * (1 - lowest)
    real_blocks = has_real.sum(-1)
    budget = torch.minimum(real_blocks * block_per_row, real_blocks * real_blocks)[:, None, None]  # (B, 1, 1)
    score = score.flatten(2)
    # The budget's threshold: the budget-th largest score of each head, from a top-k of the largest
    # budget any sequence of this shape can have (a static k; a sequence of padding only has budget 0).
    top = score.topk(max_budget(nb, block_per_row), dim=-1).values
    threshold = top.gather(-1, (budget - 1).clamp(min=0).expand(-1, heads, -1))
    # Ties at the threshold (e.g. row maxima, all 0, at one prior level; or -inf in a sequence of
    # padding only, whose budget is 0) go to the lowest (query block, key block) index, so that
    # appended padding cannot change the choice.
    above, tied = score > threshold, score == threshold
    tie_rank = row_major_cumsum(tied.view(batch, heads, nb, nb))
    selected = above | (tied & (tie_rank <= budget - above.sum(-1, keepdim=True)))
    return selected.view(batch, heads, nb, nb)


class LowResolutionAttention(torch.autograd.Function):
    """Alg. 2 at resolution b: per query block x, softmax over the key blocks y kept at low
    resolution of the scores log(c_y mu_{x,y}) = q~_x . k~_y * scaling + log c_y (eqs. 13, 17),
    applied to the value means v~_y. Returns (out, lse), (B, H, nb, D) and (B, H, nb); rows with
    no such block give 0 and -inf. The backward recomputes the (nb x nb) probabilities from the
    block means instead of keeping them (they are the largest tensors of MRA-2 at long lengths)."""

    @staticmethod
    def _probs(scores, dropped):
        """Softmax probabilities and log-sum-exp of ``scores`` (consumed in place) without the
        ``dropped`` pairs."""
        scores.masked_fill_(dropped, -math.inf)
        row_max = scores.amax(-1, keepdim=True)
        row_max.masked_fill_(row_max == -math.inf, 0.0)
        weights = scores.sub_(row_max).exp_()
        total = weights.sum(-1, keepdim=True)
        nonempty = total > 0
        total = torch.where(nonempty, total, 1.0)
        return weights.div_(total), torch.where(nonempty, row_max + total.log(), -math.inf).squeeze(-1)

    @staticmethod
    def forward(ctx, query_means, key_means, value_means, logits, log_counts, dropped, scaling: float):
        probs, lse = LowResolutionAttention._probs(logits + log_counts, dropped)
        out = probs @ value_means
        ctx.save_for_backward(query_means, key_means, value_means, log_counts, dropped, out)
        ctx.scaling = scaling
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):
        query_means, key_means, value_means, log_counts, dropped, out = ctx.saved_tensors
        batch, heads, nb, dim = query_means.shape
        flat = [t.reshape(batch * heads, *t.shape[2:]) for t in (query_means, key_means, value_means, grad_out, out)]
        dropped, grad_lse = dropped.reshape(batch * heads, nb, nb), grad_lse.reshape(batch * heads, nb)
        log_counts = log_counts.expand(batch, heads, 1, nb).reshape(batch * heads, 1, nb)
        grads = [torch.empty_like(t) for t in flat[:3]]
        # A few (batch, head) slices at a time, so that the recomputed (nb x nb) tensors of a few
        # slices only are alive (all of them would be the peak of MRA-2's backward at long lengths).
        # A traced backward takes all at once: a slice count would tie the graph to the length.
        step = batch * heads if is_tracing() else max(1, LOW_RESOLUTION_SLICE_ELEMENTS // nb**2)
        for s in (slice(i, i + step) for i in range(0, batch * heads, step)):
            mean_q, mean_k, mean_v, g_out, out_s = (t[s] for t in flat)
            probs, _ = LowResolutionAttention._probs(
                (mean_q @ mean_k.transpose(1, 2)).mul_(ctx.scaling).add_(log_counts[s]), dropped[s]
            )
            grads[2][s] = probs.transpose(1, 2) @ g_out
            # out_x = sum_y p_xy v_y and lse_x = log sum_y exp(s_xy):
            # dL/ds_xy = p_xy (g_x . v_y - g_x . out_x + dL/dlse_x).
            row_term = torch.einsum("sxd,sxd->sx", g_out, out_s).sub_(grad_lse[s])
            d_scores = (g_out @ mean_v.transpose(1, 2)).sub_(row_term[..., None]).mul_(probs)
            del probs
            grads[0][s] = d_scores @ mean_k * ctx.scaling
            grads[1][s] = d_scores.transpose(1, 2) @ mean_q * ctx.scaling
        return *(g.view(batch, heads, nb, dim) for g in grads), None, None, None, None


def low_resolution_attention(stats: BlockStats, selected: torch.Tensor, scaling: float):
    """(out, lse) of the low-resolution part of every query block (:class:`LowResolutionAttention`):
    over the key blocks that hold a real token and are not ``selected``."""
    log_counts = stats.counts.to(stats.logits.dtype).log()[:, None, None, :]
    dropped = selected | (stats.counts == 0)[:, None, None, :]
    return LowResolutionAttention.apply(
        stats.query_means, stats.key_means, stats.value_means, stats.logits, log_counts, dropped, scaling
    )


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
