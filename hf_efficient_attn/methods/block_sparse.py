"""Block-sparse softmax attention over a list of selected (query block, key block) pairs.

The exact part of MRA-2 (seed 003, Alg. 2 at resolution 1): every query block x attends, by exact
softmax, to the keys of its selected key blocks S_x, and optionally to one extra key per query
block with a given value and score. MRA-2 passes its low-resolution part as that extra key: value
= the low-resolution output of x, score = its log-sum-exp, so the softmax over [exact scores,
extra score] is exactly the log-sum-exp merge of the two parts (Alg. 2, eq. 14).

Computation (flash attention's scheme, in plain PyTorch so that one code runs on CPU and CUDA):

- Query blocks are grouped by their number c of selected key blocks and cut into chunks of at
  most ``CHUNK_KEY_BLOCKS`` key blocks; a chunk of G query blocks is one ``bmm`` of their
  gathered (G, c * b, d) keys against their (G, b, d) queries, so every row's softmax is an
  ordinary softmax over one dimension and no segment reduction is needed.
- The forward keeps only the output and the per-row log-sum-exp; the backward gathers the
  selected blocks again and recomputes the probabilities from the log-sum-exp (P = exp(S - lse),
  dS = P * (dP - rowsum(dO * O))). Memory beyond the inputs and outputs is one chunk, O(n)
  overall, instead of the gathered blocks and probabilities of every pair.
- The grouping (which chunk holds which blocks) is computed once per call and shared by the
  forward and the backward.

The ``bmm``/``index_select``/``index_add_`` formulation is written by hand because no library
kernel takes a ragged list of key blocks per query block with a backward on CPU: PyTorch's
FlexAttention has no compiled CPU backward (torch 2.13) and SDPA takes dense masks only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

#: Key blocks gathered per chunk (b = 32, d = 64, fp32: 256 KiB of keys per 32 blocks). On CPU 256
#: was fastest (fwd+bwd at 4096 / 16384 tokens, 2 threads: 32 -> 127 / -, 64 -> 104 / 505,
#: 128 -> 96 / 471, 256 -> 89 / 430, 512 -> 99 / 441 ms); on CUDA bigger chunks mean fewer launches.
CHUNK_KEY_BLOCKS = {"cpu": 256, "cuda": 4096}


class Chunk(NamedTuple):
    """G query blocks that each attend to exactly ``count`` key blocks."""

    count: int
    query_blocks: torch.Tensor  # (G,) ids in [0, B * H * nb)
    key_blocks: torch.Tensor  # (G * count,) ids in [0, B * H * nb), query block-major


class BlockPlan(NamedTuple):
    chunks: list[Chunk]
    empty_query_blocks: torch.Tensor  # ids of query blocks with no selected key block
    heads: int
    blocks: int  # nb, blocks per sequence


def plan_blocks(selected: torch.Tensor, chunk_key_blocks: int) -> BlockPlan:
    """Group the query blocks of ``selected`` (bool (B, H, nb, nb)) by their number of selected
    key blocks, in chunks of at most ``chunk_key_blocks`` key blocks (one query block at least)."""
    nb = selected.shape[-1]
    per_row = selected.reshape(-1, nb)
    counts = per_row.sum(-1)
    rows, cols = per_row.nonzero(as_tuple=True)  # row-major: each row's key blocks are contiguous
    key_of_pair = rows - rows % nb + cols  # key block id in the same (batch, head)
    first_pair = counts.cumsum(0) - counts
    sorted_counts, order = counts.sort(stable=True)
    values, sizes = torch.unique_consecutive(sorted_counts, return_counts=True)
    chunks, empty, start = [], order[:0], 0
    for count, size in zip(values.tolist(), sizes.tolist()):
        group = order[start:start + size]
        start += size
        if count == 0:
            empty = group
            continue
        keys = key_of_pair[first_pair[group, None] + torch.arange(count, device=selected.device)]
        step = max(1, chunk_key_blocks // count)
        chunks += [Chunk(count, group[i:i + step], keys[i:i + step].reshape(-1)) for i in range(0, size, step)]
    return BlockPlan(chunks, empty, selected.shape[1], nb)


class _Blocks(NamedTuple):
    """The tensors one chunk needs, gathered."""

    q: torch.Tensor  # (G, b, d), scaled
    k: torch.Tensor  # (G, c * b, d)
    v: torch.Tensor  # (G, c * b, d)
    key_padding: torch.Tensor | None  # (G, c * b, 1) True for padded keys, or None


class BlockSparseAttention(torch.autograd.Function):
    """softmax over [selected key blocks, one extra key] per query block; see the module docstring.

    q, k, v are blocks (B, H, nb, b, d), viewed inside as (R, b, d) with R = B * H * nb;
    ``key_padding`` (B * nb, b) or None; ``extra_value`` (R, d) and ``extra_score`` (R,) or None.
    Returns the output as blocks (B, H, nb, b, d)."""

    @staticmethod
    def _gather(q, k, v, key_padding, plan: BlockPlan, chunk: Chunk, scaling: float) -> _Blocks:
        g, c, (_, b, d) = chunk.query_blocks.numel(), chunk.count, q.shape
        keys = chunk.key_blocks
        padding = None
        if key_padding is not None:  # key block id (batch, head, y) -> (batch, y)
            batch_block = keys // (plan.heads * plan.blocks) * plan.blocks + keys % plan.blocks
            padding = key_padding.index_select(0, batch_block).view(g, c * b, 1)
        return _Blocks(
            q.index_select(0, chunk.query_blocks).mul_(scaling),
            k.index_select(0, keys).view(g, c * b, d),
            v.index_select(0, keys).view(g, c * b, d),
            padding,
        )

    @staticmethod
    def _scores(blocks: _Blocks) -> torch.Tensor:
        """S^T = K Q^T, (G, c * b, b), keys on dim 1: in this orientation every bmm of the forward
        and the backward takes contiguous or cheaply transposed operands (5% faster on CPU)."""
        scores = torch.bmm(blocks.k, blocks.q.transpose(1, 2))
        if blocks.key_padding is not None:
            scores.masked_fill_(blocks.key_padding, -math.inf)
        return scores

    @staticmethod
    def forward(ctx, q, k, v, key_padding, extra_value, extra_score, plan: BlockPlan, scaling: float):
        shape = q.shape
        q, k, v = (t.reshape(-1, *shape[-2:]) for t in (q, k, v))
        rows, b, d = q.shape
        out = q.new_empty(rows, b, d)
        lse = q.new_empty(rows, b)
        for chunk in plan.chunks:
            blocks = BlockSparseAttention._gather(q, k, v, key_padding, plan, chunk, scaling)
            scores = BlockSparseAttention._scores(blocks)
            row_max = scores.amax(1)  # finite: every selected block holds a real key
            if extra_score is not None:
                extra = extra_score.index_select(0, chunk.query_blocks)[:, None]
                row_max = torch.maximum(row_max, extra)
            probs = scores.sub_(row_max[:, None, :]).exp_()
            total = probs.sum(1)
            result = torch.bmm(probs.transpose(1, 2), blocks.v)
            if extra_score is not None:
                extra_weight = torch.exp(extra - row_max)
                total += extra_weight
                result.addcmul_(extra_weight[..., None], extra_value.index_select(0, chunk.query_blocks)[:, None, :])
            out.index_copy_(0, chunk.query_blocks, result.div_(total[..., None]))
            lse.index_copy_(0, chunk.query_blocks, total.log_().add_(row_max))
        empty = plan.empty_query_blocks
        if extra_score is not None:  # the extra key alone
            out.index_copy_(0, empty, extra_value.index_select(0, empty)[:, None, :].expand(-1, b, -1))
            lse.index_copy_(0, empty, extra_score.index_select(0, empty)[:, None].expand(-1, b))
        else:
            out.index_fill_(0, empty, 0.0)
            lse.index_fill_(0, empty, -math.inf)
        ctx.save_for_backward(q, k, v, key_padding, extra_value, extra_score, out, lse)
        ctx.plan, ctx.scaling, ctx.shape = plan, scaling, shape
        return out.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, key_padding, extra_value, extra_score, out, lse = ctx.saved_tensors
        plan, scaling, shape = ctx.plan, ctx.scaling, ctx.shape
        grad_out = grad_out.reshape(q.shape)
        delta = torch.einsum("rbd,rbd->rb", grad_out, out)  # rowsum(dO * O), without a (R, b, d) temporary
        # Allocated in the input's shape and returned as is: a plain tensor (not a view) lets autograd
        # add the block means' gradient into it in place.
        grads = q.new_empty(shape), q.new_zeros(shape), q.new_zeros(shape)
        grad_q, grad_k, grad_v = (t.view(q.shape) for t in grads)
        grad_q.index_fill_(0, plan.empty_query_blocks, 0.0)  # the other rows are written below
        for chunk in plan.chunks:
            g, c, idx = chunk.query_blocks.numel(), chunk.count, chunk.query_blocks
            blocks = BlockSparseAttention._gather(q, k, v, key_padding, plan, chunk, scaling)
            d_out, row_lse, row_delta = grad_out.index_select(0, idx), lse.index_select(0, idx), delta.index_select(0, idx)
            probs = BlockSparseAttention._scores(blocks).sub_(row_lse[:, None, :]).exp_()
            grad_v.index_add_(0, chunk.key_blocks, torch.bmm(probs, d_out).view(g * c, *q.shape[1:]))
            d_scores = torch.bmm(blocks.v, d_out.transpose(1, 2)).sub_(row_delta[:, None, :]).mul_(probs)
            grad_q.index_copy_(0, idx, torch.bmm(d_scores.transpose(1, 2), blocks.k).mul_(scaling))
            grad_k.index_add_(0, chunk.key_blocks, torch.bmm(d_scores, blocks.q).view(g * c, *q.shape[1:]))
        if extra_score is None:
            return *grads, None, None, None, None, None
        # The extra key of row i has probability p_i = exp(score - lse_i) (0 in rows without any key):
        # d value = sum_i p_i dO_i, d score = sum_i p_i (dO_i . value - rowsum(dO_i * O_i)).
        extra_prob = torch.exp(extra_score[:, None] - lse).masked_fill_(lse == -math.inf, 0.0)
        grad_extra_value = torch.einsum("rb,rbd->rd", extra_prob, grad_out)
        value_dot = torch.einsum("rbd,rd->rb", grad_out, extra_value)
        grad_extra_score = (extra_prob * (value_dot - delta)).sum(-1)
        return *grads, None, grad_extra_value, grad_extra_score, None, None


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    selected: torch.Tensor,
    scaling: float,
    key_real: torch.Tensor | None = None,
    extra_value: torch.Tensor | None = None,
    extra_score: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact softmax attention of q, k, v given as blocks (B, H, nb, b, D) (copied if not
    contiguous) over the key blocks ``selected`` (bool (B, H, nb, nb)) of each query block, plus,
    when given, one extra key per query block with value ``extra_value`` (B, H, nb, D) and score
    ``extra_score`` (B, H, nb). ``key_real`` (B, nb * b) marks real keys (None: all); every
    selected block must hold one. Rows with neither a selected block nor an extra key are 0.
    Returns blocks (B, H, nb, b, D)."""
    batch, heads, nb, block_size, dim = q.shape
    plan = plan_blocks(selected, CHUNK_KEY_BLOCKS.get(q.device.type, CHUNK_KEY_BLOCKS["cuda"]))
    key_padding = None if key_real is None or bool(key_real.all()) else ~key_real.reshape(batch * nb, block_size)
    if extra_score is not None:
        extra_value, extra_score = extra_value.reshape(-1, dim).to(q.dtype), extra_score.reshape(-1).to(q.dtype)
    return BlockSparseAttention.apply(q, k, v, key_padding, extra_value, extra_score, plan, scaling)
