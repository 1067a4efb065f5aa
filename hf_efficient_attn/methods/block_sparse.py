"""Block-sparse softmax attention over a list of selected (query block, key block) pairs.

The exact part of MRA-2 (seed 003, Alg. 2 at resolution 1): every query block x attends, by exact
softmax, to the keys of its selected key blocks S_x, and optionally to one extra key per query
block with a given value and score. MRA-2 passes its low-resolution part as that extra key: value
= the low-resolution output of x, score = its log-sum-exp, so the softmax over [exact scores,
extra score] is exactly the log-sum-exp merge of the two parts (Alg. 2, eq. 14).

Computation (flash attention's scheme, in plain PyTorch so that one code runs on CPU and CUDA):

- Forward, query block-major: query blocks are grouped by their number c of selected key blocks
  and cut into chunks of at most ``CHUNK_BLOCKS`` key blocks; a chunk of G query blocks is
  one ``bmm`` of their gathered (G, c * b, d) keys against their (G, b, d) queries, so every
  row's softmax is an ordinary softmax over one dimension and no segment reduction is needed.
- The forward keeps only the output and the per-row log-sum-exp; the backward gathers the
  selected blocks again and recomputes the probabilities from the log-sum-exp (P = exp(S - lse),
  dS = P * (dP - rowsum(dO * O))). Memory beyond the inputs and outputs is one chunk, O(n)
  overall, instead of the gathered blocks and probabilities of every pair.
- Backward, key block-major (FlashAttention-2's dK/dV loop): key blocks are grouped by the number
  of query blocks that selected them, so a key block's dK and dV are each one ``bmm`` over the
  rows of all its query blocks, written once; only dQ is accumulated (``index_add_``). The
  query block-major backward accumulated both dK and dV and was 7% slower on CPU (4096 tokens).

The ``bmm``/``index_select``/``index_add_`` formulation is written by hand because no library
kernel takes a ragged list of key blocks per query block with a backward on CPU: PyTorch's
FlexAttention has no compiled CPU backward (torch 2.13) and SDPA takes dense masks only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

#: Partner blocks gathered per chunk (b = 32, d = 64, fp32: 256 KiB per 32 blocks). On CPU 256 was
#: fastest (fwd+bwd at 4096 / 16384 tokens, 2 threads: 32 -> 127 / -, 64 -> 104 / 505, 128 -> 96 /
#: 471, 256 -> 89 / 430, 512 -> 99 / 441 ms; with the key block-major backward 128 and 512 are 2%
#: and 4% slower than 256 at 4096); on CUDA bigger chunks mean fewer launches.
CHUNK_BLOCKS = {"cpu": 256, "cuda": 4096}


def chunk_size_for(device: torch.device) -> int:
    """Partner blocks per chunk on ``device`` (:data:`CHUNK_BLOCKS`)."""
    return CHUNK_BLOCKS.get(device.type, CHUNK_BLOCKS["cuda"])


class Chunk(NamedTuple):
    """G row blocks that are each paired with exactly ``count`` partner blocks (in the forward: query
    blocks and their selected key blocks; in the backward: key blocks and the query blocks that
    selected them)."""

    count: int
    rows: torch.Tensor  # (G,) block ids in [0, B * H * nb)
    partners: torch.Tensor  # (G * count,) block ids in [0, B * H * nb), row-major


class BlockPlan(NamedTuple):
    chunks: list[Chunk]
    empty_rows: torch.Tensor  # ids of row blocks without a partner
    heads: int
    blocks: int  # nb, blocks per sequence


def plan_blocks(selected: torch.Tensor, chunk_blocks: int) -> BlockPlan:
    """Group the row blocks of ``selected`` (bool (B, H, nb, nb), rows x partners) by their number of
    partners, in chunks of at most ``chunk_blocks`` partners (one row block at least)."""
    nb = selected.shape[-1]
    per_row = selected.reshape(-1, nb)
    counts = per_row.sum(-1)
    rows, cols = per_row.nonzero(as_tuple=True)  # row-major: each row's partners are contiguous
    partner_of_pair = rows - rows % nb + cols  # partner block id in the same (batch, head)
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
        partners = partner_of_pair[first_pair[group, None] + torch.arange(count, device=selected.device)]
        step = max(1, chunk_blocks // count)
        chunks += [Chunk(count, group[i:i + step], partners[i:i + step].reshape(-1)) for i in range(0, size, step)]
    return BlockPlan(chunks, empty, selected.shape[1], nb)


def _key_padding(key_padding: torch.Tensor, plan: BlockPlan, keys: torch.Tensor) -> torch.Tensor:
    """(len(keys), b) True for the padded keys of key blocks ``keys``: id (batch, head, y) -> (batch, y)."""
    return key_padding.index_select(0, keys // (plan.heads * plan.blocks) * plan.blocks + keys % plan.blocks)


class BlockSparseAttention(torch.autograd.Function):
    """softmax over [selected key blocks, one extra key] per query block; see the module docstring.

    q, k, v are blocks (B, H, nb, b, d), viewed inside as (R, b, d) with R = B * H * nb;
    ``key_padding`` (B * nb, b) or None; ``extra_value`` (R, d) and ``extra_score`` (R,) or None;
    ``selected`` (B, H, nb, nb) and its query block-major ``plan``. Returns the output as blocks
    (B, H, nb, b, d)."""

    @staticmethod
    def forward(ctx, q, k, v, key_padding, extra_value, extra_score, selected, plan: BlockPlan, scaling: float):
        shape = q.shape
        q, k, v = (t.reshape(-1, *shape[-2:]) for t in (q, k, v))
        rows, b, d = q.shape
        out = q.new_empty(rows, b, d)
        lse = q.new_empty(rows, b)
        no_bias = q.new_zeros(())
        for chunk in plan.chunks:
            g, c, queries, keys = chunk.rows.numel(), chunk.count, chunk.rows, chunk.partners
            # S^T = scaling * K Q^T, (G, c * b, b), keys on dim 1: in this orientation both bmm take
            # contiguous or cheaply transposed operands (5% faster on CPU); the scaling rides on the bmm.
            scores = torch.baddbmm(no_bias, k.index_select(0, keys).view(g, c * b, d),
                                   q.index_select(0, queries).transpose(1, 2), beta=0, alpha=scaling)
            if key_padding is not None:
                scores.masked_fill_(_key_padding(key_padding, plan, keys).view(g, c * b, 1), -math.inf)
            row_max = scores.amax(1)  # finite: every selected block holds a real key
            if extra_score is not None:
                extra = extra_score.index_select(0, queries)[:, None]
                row_max = torch.maximum(row_max, extra)
            probs = scores.sub_(row_max[:, None, :]).exp_()
            total = probs.sum(1)
            result = torch.bmm(probs.transpose(1, 2), v.index_select(0, keys).view(g, c * b, d))
            if extra_score is not None:
                extra_weight = torch.exp(extra - row_max)
                total += extra_weight
                result.addcmul_(extra_weight[..., None], extra_value.index_select(0, queries)[:, None, :])
            out.index_copy_(0, queries, result.div_(total[..., None]))
            lse.index_copy_(0, queries, total.log_().add_(row_max))
        empty = plan.empty_rows
        if extra_score is not None:  # the extra key alone
            out.index_copy_(0, empty, extra_value.index_select(0, empty)[:, None, :].expand(-1, b, -1))
            lse.index_copy_(0, empty, extra_score.index_select(0, empty)[:, None].expand(-1, b))
        else:
            out.index_fill_(0, empty, 0.0)
            lse.index_fill_(0, empty, -math.inf)
        ctx.save_for_backward(q, k, v, key_padding, extra_value, extra_score, out, lse, selected)
        ctx.scaling, ctx.shape = scaling, shape
        return out.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, key_padding, extra_value, extra_score, out, lse, selected = ctx.saved_tensors
        scaling, shape = ctx.scaling, ctx.shape
        grad_out = grad_out.contiguous().view(q.shape)
        rows, b, d = q.shape
        delta = torch.bmm(grad_out.view(-1, 1, d), out.view(-1, d, 1)).view(rows, b)  # rowsum(dO * O)
        neg_lse, neg_scaled_delta = -lse, delta * -scaling
        # Allocated in the input's shape and returned as is: a plain tensor (not a view) lets autograd
        # add the block means' gradient into it in place.
        grads = q.new_zeros(shape), q.new_empty(shape), q.new_empty(shape)
        grad_q, grad_k, grad_v = (t.view(q.shape) for t in grads)
        # Key block-major (FlashAttention-2's dK/dV pass): each chunk holds key blocks that are
        # selected by the same number c of query blocks, so dK and dV of a key block come out of one
        # bmm each over its c * b query rows and are written once; only dQ is accumulated.
        plan = plan_blocks(selected.transpose(-1, -2), chunk_size_for(q.device))
        grad_k.index_fill_(0, plan.empty_rows, 0.0)
        grad_v.index_fill_(0, plan.empty_rows, 0.0)
        for chunk in plan.chunks:
            g, c, keys, queries = chunk.rows.numel(), chunk.count, chunk.rows, chunk.partners
            q_rows, d_out = (t.index_select(0, queries).view(g, c * b, d) for t in (q, grad_out))
            k_block, v_block = k.index_select(0, keys), v.index_select(0, keys)
            # P = exp(scaling * Q K^T - lse), (G, c * b, b); the scaling rides on the bmm (alpha).
            scores = torch.baddbmm(neg_lse.index_select(0, queries).view(g, c * b, 1), q_rows, k_block.transpose(1, 2),
                                   alpha=scaling)
            if key_padding is not None:
                scores.masked_fill_(_key_padding(key_padding, plan, keys)[:, None, :], -math.inf)
            probs = scores.exp_()
            grad_v.index_copy_(0, keys, torch.bmm(probs.transpose(1, 2), d_out))
            # scaling * dS = scaling * P * (dP - delta), dP = dO V^T: dK = (scaling dS)^T Q, dQ = (scaling dS) K.
            d_scores = torch.baddbmm(neg_scaled_delta.index_select(0, queries).view(g, c * b, 1), d_out,
                                     v_block.transpose(1, 2), alpha=scaling).mul_(probs)
            grad_k.index_copy_(0, keys, torch.bmm(d_scores.transpose(1, 2), q_rows))
            grad_q.index_add_(0, queries, torch.bmm(d_scores, k_block).view(g * c, b, d))
        if extra_score is None:
            return *grads, None, None, None, None, None, None
        # The extra key of row i has probability p_i = exp(score - lse_i) (0 in rows without any key):
        # d value = sum_i p_i dO_i; d score = sum_i p_i (dO_i . value - rowsum(dO_i * O_i))
        # = (d value) . value - sum_i p_i rowsum(dO_i * O_i).
        extra_prob = torch.exp(extra_score[:, None] - lse).masked_fill_(lse == -math.inf, 0.0)
        grad_extra_value = torch.bmm(extra_prob[:, None, :], grad_out).squeeze(1)
        grad_extra_score = (grad_extra_value * extra_value).sum(-1) - (extra_prob * delta).sum(-1)
        return *grads, None, grad_extra_value, grad_extra_score, None, None, None


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
    plan = plan_blocks(selected, chunk_size_for(q.device))
    key_padding = None if key_real is None or bool(key_real.all()) else ~key_real.reshape(batch * nb, block_size)
    if extra_score is not None:
        extra_value, extra_score = extra_value.reshape(-1, dim).to(q.dtype), extra_score.reshape(-1).to(q.dtype)
    return BlockSparseAttention.apply(q, k, v, key_padding, extra_value, extra_score, selected, plan, scaling)
