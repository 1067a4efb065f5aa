"""MRA-2 and MRA-2-s (Zeng et al., "Multi Resolution Analysis (MRA) for Approximate Self-Attention",
ICML 2022): masked block means and block-level scores (section 4.1, eqs. 10-12), the budget's
selection of block pairs (Alg. 1 with R = {b, 1}), and the output (Alg. 2, eqs. 13-14, 17-18): exact
attention in the selected blocks merged with the low-resolution part by their log-sum-exps.

The exact part runs on one of three backends: ``gather`` (:mod:`.block_sparse`), ``pairs``
(:mod:`.block_pairs`) or ``flex`` (FlexAttention, below); ``auto`` runs ``pairs`` on CUDA and
``gather`` elsewhere. What each computes, the choices made where the paper is vague (ranking,
ties, priors, padding), compilation and export: docs/methods/mra.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ..registry import register_method
from .base import AttentionMethod, MethodOptions, Paper, check_choice, check_int, compute_dtype, is_tracing
from .block_pairs import pair_attention, row_major_cumsum
from .block_sparse import block_sparse_attention

BACKENDS = ("auto", "flex", "gather", "pairs")
#: The flex path pads the length to a multiple of this, so that few shapes get compiled
#: (compiled shapes are static: one compilation per (batch, heads, padded length,
#: head_dim, dtype, method)). Padded blocks are never selected, so the padding costs next to nothing.
FLEX_LENGTH_MULTIPLE = 1024
#: Dynamo compiles at most this many shapes of flex_attention (its default, 8, would run any
#: further shape through eager flex, which materialises the dense score matrix).
FLEX_RECOMPILE_LIMIT = 64
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Elements of the (nb x nb) low-resolution tensors recomputed at once in the backward (4 MiB in
#: fp32): slices of whole heads, so that long inputs do not keep them for every head at once.
LOW_RESOLUTION_SLICE_ELEMENTS = 2**20

MRA_PAPER = Paper("Multi Resolution Analysis (MRA) for Approximate Self-Attention", "Zeng et al., ICML 2022", "2207.10284")


@dataclass
class MraOptions(MethodOptions):
    # b in R = {b, 1}: section 5, "Baselines": "R = {32, 1} ... denoted in experiments as MRA-2".
    # Any positive integer is accepted (the paper's Alg. 1 works for any b; exact at full budget
    # for b = 1, 7, 64 on both backends, tested); the official CUDA kernels fix b = 32. Smaller b
    # costs more: the low-resolution part is (n/b)^2.
    block_size: int = 32
    # Exact blocks per query block, on average (budget m_1 = block_per_row x number of query
    # blocks, Alg. 1). 4 = Transformers' MraConfig default and the official RoBERTa-512 config
    # "base-512-4"; the official 4096-token runs use 16 (with priors, e.g. first 1, diagonal 5).
    block_per_row: int = 4
    # Alg. 1 "prespecified via priors"; 0 = off (Transformers' MraConfig defaults).
    initial_prior_first_n_blocks: int = 0
    initial_prior_diagonal_n_blocks: int = 0
    # "auto", "flex", "gather" or "pairs" (docs/methods/mra.md, "Backends").
    backend: str = "auto"

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


def pad_to_length(x: torch.Tensor, length: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """``x`` padded at the end of ``dim`` to ``length``."""
    if x.shape[dim] == length:  # eager only: traced lengths always differ (padded_blocks)
        return x
    pad = [0, 0] * (x.dim() - dim % x.dim() - 1) + [0, length - x.shape[dim]]
    return F.pad(x, pad, value=value)


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
def select_blocks(logits: torch.Tensor, counts: torch.Tensor, block_per_row: int, first_n: int = 0,
                  diagonal_n: int = 0) -> torch.Tensor:
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
                (mean_q @ mean_k.transpose(1, 2)).mul_(ctx.scaling).add_(log_counts[s]), dropped[s])
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
    return LowResolutionAttention.apply(stats.query_means, stats.key_means, stats.value_means, stats.logits,
                                        log_counts, dropped, scaling)


# ----------------------------------------------------------------------------- flex backend

_compiled_flex: dict[bool, Callable] = {}


def _flex(autotune: bool) -> Callable:
    """flex_attention compiled for static shapes; with ``autotune``, under Inductor's max-autotune, the
    only setting whose backward tile list holds tiles narrower than 64 (see :func:`_needs_autotune`)."""
    if autotune not in _compiled_flex:
        _compiled_flex[autotune] = torch.compile(flex_attention, dynamic=False,
                                                 options={"max_autotune": True} if autotune else None)
    return _compiled_flex[autotune]


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will record a call on ``tensors`` (then flex needs its backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _needs_autotune(q: torch.Tensor, block_size: int, backward: bool) -> bool:
    """Whether a CUDA backward of flex at ``block_size`` needs max-autotune: Inductor keeps only the
    backward tiles that divide the sparse block size, and its default tile for fp16/bf16 on recent GPUs
    is 64 x 128 (fp32: 16), so blocks of 32 find none by default (torch 2.11-2.13
    ``get_flex_attn_bwd_configs``)."""
    return backward and q.device.type == "cuda" and q.dtype != torch.float32 and block_size < 128


def _block_list(sel: torch.Tensor):
    """(B, H, nq, nk) bool -> BlockMask's (count, indices): int32, selected indices first."""
    order = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True)
    return sel.sum(-1, dtype=torch.int32), order.to(torch.int32)


def flex_mra_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor,
                       selected: torch.Tensor, block_size: int, scaling: float,
                       low_out: torch.Tensor | None = None, low_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention over the selected blocks in one FlexAttention call; given the
    low-resolution (out, lse) of every query block, (B, H, nb, D) and (B, H, nb), query block x
    also attends to one virtual key with value ``low_out[x]`` and score ``low_lse[x]``, which is
    exactly the log-sum-exp merge of both parts (docs/methods/mra.md, "Backends")."""
    batch, heads, length, dim = q.shape
    nb = length // block_size
    blocks_real = real.view(batch, nb, block_size)
    full_key_block = blocks_real.all(-1)[:, None, None, :]
    dense, partial = selected & full_key_block, selected & ~full_key_block
    score_mod, key_ok = None, real
    if low_out is not None:
        # Virtual key x sits at position length + x, in virtual block x // block_size.
        n_virtual = -(-nb // block_size) * block_size
        k = torch.cat([k, k.new_zeros(batch, heads, n_virtual, dim)], 2)
        v = torch.cat([v, F.pad(low_out, (0, 0, 0, n_virtual - nb)).to(v.dtype)], 2)
        key_ok = F.pad(real, (0, n_virtual), value=True)
        own_block = torch.arange(nb, device=q.device) // block_size
        virtual = F.one_hot(own_block, n_virtual // block_size).bool() & blocks_real.any(-1)[:, None, :, None]
        dense = torch.cat([dense, virtual.expand(batch, heads, -1, -1)], -1)
        partial = F.pad(partial, (0, n_virtual // block_size), value=False)
        first_virtual = torch.tensor(length, device=q.device)

        def score_mod(score, b, h, q_idx, kv_idx):
            x = q_idx // block_size
            virtual_score = torch.where(kv_idx - first_virtual == x, low_lse[b, h, x], -math.inf)
            return torch.where(kv_idx < first_virtual, score, virtual_score)

    def mask_mod(b, h, q_idx, kv_idx):
        return key_ok[b, kv_idx]

    backward = needs_grad(q, k, v)
    block_mask = BlockMask.from_kv_blocks(  # the backward walks the mask by key block: q blocks too
        *_block_list(partial), *_block_list(dense), BLOCK_SIZE=block_size, mask_mod=mask_mod,
        seq_lengths=(length, k.shape[2]), compute_q_blocks=backward,
    )
    # Triton's default tiles (64-128) must divide the sparse block size; ask for block-sized ones
    # (Triton tiles are powers of two >= 16: _MraBase._use_flex refuses other block sizes on CUDA).
    options = {"BLOCK_M": block_size, "BLOCK_N": block_size} if q.device.type == "cuda" else None
    arguments = dict(score_mod=score_mod, block_mask=block_mask, scale=scaling, kernel_options=options)
    if torch.compiler.is_compiling():  # inside an outer compiled graph (CUDA only): compiled with it
        return flex_attention(q, k, v, **arguments)
    # Private dynamo config (no public setter for the recompile limit): scoped to this call only.
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
        return _flex(_needs_autotune(q, block_size, backward))(q, k, v, **arguments)


#: :func:`flex_mra_attention` run eagerly, with its own compiled kernel, also from a compiled graph
#: (a graph break there).
flex_mra_attention_outside_graphs = torch.compiler.disable(flex_mra_attention)


# ----------------------------------------------------------------------------- methods


class _MraBase(AttentionMethod):
    options_cls = MraOptions
    #: True for MRA-2 (low-resolution term in the non-selected blocks), False for MRA-2-s.
    low_resolution: bool

    def _use_flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether this call runs FlexAttention: only for ``backend="flex"`` (``auto`` never is),
        and not under export (both backends export :mod:`.block_sparse`'s static formulation)."""
        if self.options.backend != "flex" or torch.compiler.is_exporting():
            return False
        if q.dtype not in FLEX_DTYPES:
            raise ValueError(f"{self.name}: backend='flex' supports dtypes {list(FLEX_DTYPES)}, got {q.dtype}")
        block_size, head_dim = self.options.block_size, q.shape[-1]
        if q.device.type == "cuda" and (block_size < 16 or block_size & (block_size - 1) or head_dim < 16):
            raise ValueError(
                f"{self.name}: backend='flex' on CUDA needs block_size a power of two >= 16 and head_dim >= 16 "
                f"(Triton's tiles), got block_size {block_size}, head_dim {head_dim}; use backend='gather'"
            )
        if needs_grad(q, k, v) and q.device.type != "cuda":
            raise ValueError(
                f"{self.name}: backend='flex' has no backward on {q.device.type} (compiled FlexAttention is "
                "inference-only there); use backend='gather' or 'auto', or run under torch.no_grad()"
            )
        return True

    def _use_pairs(self, q: torch.Tensor) -> bool:
        """Whether the exact part runs :mod:`.block_pairs` (``pairs``, and ``auto`` on CUDA) rather than
        :mod:`.block_sparse`'s grouped kernel (``gather``, and ``auto`` elsewhere)."""
        backend = self.options.backend
        return backend == "pairs" or (backend == "auto" and q.device.type == "cuda")

    def attend(self, q, k, v, key_padding_mask, scaling):
        opts = self.options
        bs, (batch, _, length, _) = opts.block_size, q.shape
        use_flex, use_pairs = self._use_flex(q, k, v), self._use_pairs(q)
        # flex: pad to a multiple of FLEX_LENGTH_MULTIPLE too, so that few lengths get compiled.
        multiple = math.lcm(bs, FLEX_LENGTH_MULTIPLE) if use_flex else bs
        nb = padded_blocks(length, bs, multiple)
        real = q.new_ones(batch, length, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
        real = pad_to_length(real, nb * bs, dim=1, value=False)
        work_dtype = q.dtype if use_flex else compute_dtype(q)
        # Padded tokens are zero (the base class zeroes key padding; internal padding adds zeros).
        # Blocks (B, H, nb, b, D): one view per tensor, shared by the block means and the exact part,
        # so that their gradients add up in one buffer.
        q, k, v = (pad_to_length(t.to(work_dtype), nb * bs, dim=2).contiguous().unflatten(2, (nb, bs))
                   for t in (q, k, v))
        if use_flex and not torch.is_grad_enabled():
            q, k, v = (t.detach() for t in (q, k, v))  # CPU flex refuses inputs that require grad

        stats_dtype = compute_dtype(q)
        stats = block_stats(q.to(stats_dtype), k.to(stats_dtype), v.to(stats_dtype), real, scaling)
        selected = select_blocks(stats.logits, stats.counts, opts.block_per_row,
                                 opts.initial_prior_first_n_blocks, opts.initial_prior_diagonal_n_blocks)
        low_out = low_lse = None
        if self.low_resolution:
            low_out, low_lse = low_resolution_attention(stats, selected, scaling)
        if use_flex:
            q, k, v = (t.flatten(2, 3) for t in (q, k, v))
            # On CPU, Inductor cannot compile flex_attention inside an outer graph (torch 2.13: its CPU
            # template fails on mask tensors computed in the same graph), so there it runs outside it.
            flex = flex_mra_attention if q.device.type == "cuda" else flex_mra_attention_outside_graphs
            out = flex(q, k, v, real, selected, bs, scaling, low_out, low_lse)
        else:
            kernel = pair_attention if use_pairs else block_sparse_attention
            out = kernel(q, k, v, selected, scaling, real, low_out, low_lse,
                         max_pairs=max_budget(nb, opts.block_per_row)).flatten(2, 3)
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
    cost = "O(n k b d)"
    budget_option = "block_per_row"
    low_resolution = False
