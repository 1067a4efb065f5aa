"""Block-sparse softmax attention over a ragged list of selected (query block, key block) pairs, the
exact part of MRA-2 (Alg. 2 at resolution 1), with an optional extra key per query block through which
MRA-2 merges its low-resolution part (value: its output, score: its log-sum-exp). This is the ``gather``
backend: the forward groups query blocks by their number of key blocks (one ``bmm`` per chunk), the
backward goes key block by key block and recomputes the probabilities from the log-sum-exp; both are
custom operators, so ``torch.compile`` runs them as opaque nodes. Why it is written by hand, and how it
compiles and exports: docs/methods/mra.md ("Backends", "Compilation and export").
"""

from __future__ import annotations

import itertools
import math
import re
from typing import NamedTuple

import torch

#: Partner blocks gathered per chunk (b = 32, d = 64, fp32: 256 KiB per 32 blocks): 256 measured
#: fastest on CPU (fwd+bwd at 4096 and 16384 tokens); on CUDA bigger chunks mean fewer launches.
CHUNK_BLOCKS = {"cpu": 256, "cuda": 4096}

#: Namespace of this module's custom operators: the module's name. Remote code ships a copy of this
#: module beside a model (``hub/remote_code.py``), which can be imported next to the installed
#: package; under the same operator names its registration would silently replace the package's
#: operators (torch 2.13), with the copy's code, possibly from another version.
OP_NAMESPACE = re.sub(r"\W", "_", __name__)


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
        group = order[start : start + size]
        start += size
        if count == 0:
            empty = group
            continue
        partners = partner_of_pair[first_pair[group, None] + torch.arange(count, device=selected.device)]
        step = max(1, chunk_blocks // count)
        chunks += [Chunk(count, group[i : i + step], partners[i : i + step].reshape(-1)) for i in range(0, size, step)]
    return BlockPlan(chunks, empty)


def find_padded_keys(key_real: torch.Tensor | None, heads: int, block_size: int) -> torch.Tensor | None:
    """bool (B * H * nb, b), True for the padded keys of each key block (ids (batch, head, y)), or
    None when no key is padded (then no masking at all)."""
    if key_real is None or bool(key_real.all()):
        return None
    return ~key_real.reshape(key_real.shape[0], 1, -1, block_size).expand(-1, heads, -1, -1).reshape(-1, block_size)


class KeyMask(NamedTuple):
    """The padded keys of one chunk: key block ``blocks[i]`` (a position in the chunk's list of key
    blocks) has padded key ``keys[i]`` (its offset in the block)."""

    blocks: torch.Tensor
    keys: torch.Tensor


def chunk_key_masks(key_blocks: list[torch.Tensor], padded_keys: torch.Tensor | None) -> list[KeyMask | None]:
    """For each chunk's key block ids, its padded keys (None: none). Found for all chunks at once,
    with one host read: padding-only blocks are never selected, so the few blocks that end a
    sequence are the only ones with padded keys, and a chunk without them pays nothing."""
    if padded_keys is None or not key_blocks:
        return [None] * len(key_blocks)
    blocks = torch.cat(key_blocks)
    partial = padded_keys.any(-1).index_select(0, blocks).nonzero().squeeze(-1)
    which, key = padded_keys.index_select(0, blocks.index_select(0, partial)).nonzero(as_tuple=True)
    position = partial.index_select(0, which)  # sorted
    starts = [0, *itertools.accumulate(t.numel() for t in key_blocks)]
    bounds = torch.searchsorted(position, torch.tensor(starts, device=position.device)).tolist()
    return [
        KeyMask(position[lo:hi] - start, key[lo:hi]) if hi > lo else None for start, lo, hi in zip(starts, bounds, bounds[1:])
    ]


def _mask_keys(keyed_scores: torch.Tensor, mask: KeyMask | None) -> None:
    """Set to -inf, in place, the scores of ``mask``'s padded keys: ``keyed_scores`` is indexed
    [key block position, key offset, ...] (a view of the chunk's scores)."""
    if mask is not None:
        keyed_scores[mask.blocks, mask.keys] = -math.inf


# The custom operators' arguments: q, k, v are blocks (B, H, nb, b, d), viewed inside as (R, b, d)
# with R = B * H * nb; ``key_real`` (B, nb * b) or None; ``extra_value`` (B, H, nb, d) and
# ``extra_score`` (B, H, nb) in q's dtype, or None; ``selected`` bool (B, H, nb, nb).


@torch.library.custom_op(f"{OP_NAMESPACE}::block_sparse_forward", mutates_args=())
def block_sparse_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_real: torch.Tensor | None,
    extra_value: torch.Tensor | None,
    extra_score: torch.Tensor | None,
    selected: torch.Tensor,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax over [selected key blocks, one extra key] per query block (module docstring):
    the output as blocks (B, H, nb, b, d) and the per-row log-sum-exp (B, H, nb, b)."""
    shape = q.shape
    plan = plan_blocks(selected, chunk_size_for(q.device))
    q, k, v = (t.reshape(-1, *shape[-2:]) for t in (q, k, v))
    rows, b, d = q.shape
    key_masks = chunk_key_masks([chunk.partners for chunk in plan.chunks], find_padded_keys(key_real, shape[1], b))
    if extra_score is not None:
        extra_value, extra_score = extra_value.reshape(rows, d), extra_score.reshape(rows)
    out = q.new_empty(rows, b, d)
    lse = q.new_empty(rows, b)
    no_bias = q.new_zeros(())
    for chunk, key_mask in zip(plan.chunks, key_masks):
        g, c, queries, keys = chunk.rows.numel(), chunk.count, chunk.rows, chunk.partners
        # S^T = scaling * K Q^T, (G, c * b, b), keys on dim 1: in this orientation both bmm take
        # contiguous or cheaply transposed operands (faster on CPU); the scaling rides on the bmm.
        scores = torch.baddbmm(
            no_bias, k.index_select(0, keys).view(g, c * b, d), q.index_select(0, queries).transpose(1, 2), beta=0, alpha=scaling
        )
        _mask_keys(scores.view(g * c, b, b), key_mask)
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
    if extra_score is not None:  # the extra key alone (no key at all where its score is -inf)
        alone = extra_value.index_select(0, empty).masked_fill(extra_score.index_select(0, empty)[:, None] == -math.inf, 0.0)
        out.index_copy_(0, empty, alone[:, None, :].expand(-1, b, -1))
        lse.index_copy_(0, empty, extra_score.index_select(0, empty)[:, None].expand(-1, b))
    else:
        out.index_fill_(0, empty, 0.0)
        lse.index_fill_(0, empty, -math.inf)
    return out.view(shape), lse.view(shape[:-1])


@block_sparse_forward.register_fake
def _(q, k, v, key_real, extra_value, extra_score, selected, scaling):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1])


@torch.library.custom_op(f"{OP_NAMESPACE}::block_sparse_backward", mutates_args=())
def block_sparse_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_real: torch.Tensor | None,
    extra_value: torch.Tensor | None,
    extra_score: torch.Tensor | None,
    selected: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`block_sparse_forward`'s output: (dq, dk, dv, d extra_value,
    d extra_score); the last two are empty without an extra key."""
    shape = q.shape
    q, k, v = (t.reshape(-1, *shape[-2:]) for t in (q, k, v))
    rows, b, d = q.shape
    grad_out, out, lse = grad_out.contiguous().view(q.shape), out.view(q.shape), lse.view(rows, b)
    delta = torch.bmm(grad_out.view(-1, 1, d), out.view(-1, d, 1)).view(rows, b)  # rowsum(dO * O)
    neg_lse, neg_scaled_delta = -lse, delta * -scaling
    grads = q.new_zeros(shape), q.new_empty(shape), q.new_empty(shape)
    grad_q, grad_k, grad_v = (t.view(q.shape) for t in grads)
    # Key block-major (FlashAttention-2's dK/dV pass): each chunk holds key blocks that are
    # selected by the same number c of query blocks, so dK and dV of a key block come out of one
    # bmm each over its c * b query rows and are written once; only dQ is accumulated.
    plan = plan_blocks(selected.transpose(-1, -2), chunk_size_for(q.device))
    grad_k.index_fill_(0, plan.empty_rows, 0.0)
    grad_v.index_fill_(0, plan.empty_rows, 0.0)
    key_masks = chunk_key_masks([chunk.rows for chunk in plan.chunks], find_padded_keys(key_real, shape[1], b))
    for chunk, key_mask in zip(plan.chunks, key_masks):
        g, c, keys, queries = chunk.rows.numel(), chunk.count, chunk.rows, chunk.partners
        q_rows, d_out = (t.index_select(0, queries).view(g, c * b, d) for t in (q, grad_out))
        k_block, v_block = k.index_select(0, keys), v.index_select(0, keys)
        # P = exp(scaling * Q K^T - lse), (G, c * b, b); the scaling rides on the bmm (alpha).
        scores = torch.baddbmm(neg_lse.index_select(0, queries).view(g, c * b, 1), q_rows, k_block.transpose(1, 2), alpha=scaling)
        _mask_keys(scores.transpose(1, 2), key_mask)
        probs = scores.exp_()
        grad_v.index_copy_(0, keys, torch.bmm(probs.transpose(1, 2), d_out))
        # scaling * dS = scaling * P * (dP - delta), dP = dO V^T: dK = (scaling dS)^T Q, dQ = (scaling dS) K.
        d_scores = torch.baddbmm(
            neg_scaled_delta.index_select(0, queries).view(g, c * b, 1), d_out, v_block.transpose(1, 2), alpha=scaling
        ).mul_(probs)
        grad_k.index_copy_(0, keys, torch.bmm(d_scores.transpose(1, 2), q_rows))
        grad_q.index_add_(0, queries, torch.bmm(d_scores, k_block).view(g * c, b, d))
    if extra_score is None:
        return *grads, q.new_empty(0), q.new_empty(0)
    # The extra key of row i has probability p_i = exp(score - lse_i) (0 in rows without any key):
    # d value = sum_i p_i dO_i; d score = sum_i p_i (dO_i . value - rowsum(dO_i * O_i))
    # = (d value) . value - sum_i p_i rowsum(dO_i * O_i).
    extra_prob = torch.exp(extra_score.reshape(rows, 1) - lse).masked_fill_(lse == -math.inf, 0.0)
    grad_extra_value = torch.bmm(extra_prob[:, None, :], grad_out).view(extra_value.shape)
    grad_extra_score = (grad_extra_value * extra_value).sum(-1) - (extra_prob * delta).sum(-1).view(extra_score.shape)
    return *grads, grad_extra_value, grad_extra_score


@block_sparse_backward.register_fake
def _(grad_out, q, k, v, key_real, extra_value, extra_score, selected, out, lse, scaling):
    extra_grads = (
        (q.new_empty(0), q.new_empty(0))
        if extra_score is None
        else (torch.empty_like(extra_value), torch.empty_like(extra_score))
    )
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), *extra_grads


def _setup_context(ctx, inputs, output):
    q, k, v, key_real, extra_value, extra_score, selected, scaling = inputs
    ctx.save_for_backward(q, k, v, key_real, extra_value, extra_score, selected, *output)
    ctx.scaling = scaling


def _backward(ctx, grad_out, grad_lse):
    # The log-sum-exp stays inside block_sparse_attention: no gradient reaches it.
    q, k, v, key_real, extra_value, extra_score, selected, out, lse = ctx.saved_tensors
    grads = block_sparse_backward(grad_out, q, k, v, key_real, extra_value, extra_score, selected, out, lse, ctx.scaling)
    grad_extra = (None, None) if extra_score is None else grads[3:]
    return *grads[:3], None, *grad_extra, None, None


torch.library.register_autograd(block_sparse_forward, _backward, setup_context=_setup_context)


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
    """Exact softmax attention of q, k, v given as blocks (B, H, nb, b, D) over the key blocks
    ``selected`` (bool (B, H, nb, nb)) of each query block, plus, when given, one extra key per query
    block with value ``extra_value`` (B, H, nb, D) and score ``extra_score`` (B, H, nb).
    ``key_real`` (B, nb * b) marks real keys (None: all); every selected block must hold one. Rows
    with neither a selected block nor an extra key are 0. Returns blocks (B, H, nb, b, D)."""
    if extra_score is not None:
        extra_value, extra_score = extra_value.to(q.dtype), extra_score.to(q.dtype)
    return block_sparse_forward(q, k, v, key_real, extra_value, extra_score, selected, scaling)[0]
