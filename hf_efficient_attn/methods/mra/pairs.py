"""Block-sparse softmax attention over a fixed-length list of (query block, key block) pairs.

The same attention as :mod:`.gather` (MRA-2's exact part, Alg. 2 at resolution 1, with the
low-resolution part as one extra key per query block), formulated with static shapes only: each
(batch, head) lists ``max_pairs`` pairs (its selected pairs first, then padding of the list), every
pair's scores are one batched matmul, and the softmax of a query row over its pairs is a segment
reduction (``scatter_reduce`` amax for the row maximum, ``index_add`` for the sums). A few dozen
operators per call whatever the selection, no value read on the host and no data-dependent shape:

- on CUDA it is one launch per step (:mod:`.gather` groups query blocks by their number of
  selected blocks and launches a few kernels per group: launch-bound there, docs/gpu.md);
- exported programs (``torch.export``, ONNX) and compiled graphs trace it as it is.

Training keeps only the output and the per-row log-sum-exp and recomputes the pairs' scores in the
backward (flash attention's scheme), like :mod:`.gather`. The pairs of at most
``PAIR_SLICE_ELEMENTS`` gathered elements are processed at once (slices of whole heads; traced
graphs take all heads at once, a slice count would tie the graph to the shape)."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ..base import is_tracing

#: Gathered query/key/value elements per slice of heads (2**26: 256 MiB per gathered tensor in fp32).
PAIR_SLICE_ELEMENTS = 2**26


def row_major_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sum of ``x`` (..., r, c) over its last two dimensions in row-major order,
    flattened to (..., r * c): a scan within each row plus each row's offset. On CUDA (torch 2.11) one
    scan over a long row (nb * nb entries) runs in few thread blocks (1.9 ms per call at nb = 1024,
    half of MRA-2's device time at 32k tokens) and Inductor's split scan for it fails to generate
    code; rows of nb entries scan in parallel."""
    inner = x.cumsum(-1)
    totals = inner[..., -1]
    return (inner + (totals.cumsum(-1) - totals)[..., None]).flatten(-2)


def pair_list(selected: torch.Tensor, max_pairs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(queries, keys, valid), each (S * max_pairs,): the selected pairs of ``selected`` (bool
    (S, nb, nb)) as block ids in [0, S * nb), each slice's selected pairs first (row-major), then
    pairs (0, 0) of the slice with valid False. Each slice must select at most ``max_pairs`` pairs."""
    slices, nb, _ = selected.shape
    flat = selected.flatten(1)
    # Slot of each selected pair in its slice's list; the others go to one spare slot, dropped.
    slot = torch.where(flat, row_major_cumsum(selected) - 1, max_pairs)
    pair = torch.arange(nb * nb, device=selected.device).expand(slices, -1)
    pair = flat.new_zeros(slices, max_pairs + 1, dtype=torch.long).scatter(-1, slot, pair)[:, :max_pairs]
    valid = torch.arange(max_pairs, device=selected.device) < flat.sum(-1, keepdim=True)
    # Block ids by lookup rather than pair // nb and pair % nb: the ONNX exporter cannot divide by a
    # symbolic nb.
    block = torch.arange(nb, device=selected.device)
    first_block = torch.arange(slices, device=selected.device)[:, None] * nb
    queries = first_block + block[:, None].expand(nb, nb).reshape(-1)[pair]
    keys = first_block + block.repeat(nb)[pair]
    return queries.flatten(), keys.flatten(), valid.flatten()


def _allowed(key_real: torch.Tensor | None, keys: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(pairs, 1, b) True where a pair's key may be attended: a real key of a listed pair."""
    allowed = valid[:, None]
    if key_real is not None:
        allowed = allowed & key_real.index_select(0, keys)
    return allowed[:, None, :]


def pair_forward(q, k, v, key_real, extra_value, extra_score, queries, keys, valid, scaling):
    """(out (R, b, d), lse (R, b)) of rows q (R, b, d) over the listed pairs' keys k, v (R, b, d)
    and the extra key (``extra_value`` (R, d), ``extra_score`` (R,), or None); ``key_real`` (R, b)
    marks real keys (None: all). Rows with no key at all: 0 and -inf."""
    rows, b, d = q.shape
    scores = torch.bmm(q.index_select(0, queries), k.index_select(0, keys).transpose(1, 2)).mul_(scaling)
    scores = scores.masked_fill(~_allowed(key_real, keys, valid), -math.inf)
    row_max = q.new_full((rows, b), -math.inf) if extra_score is None else extra_score[:, None].expand(rows, b)
    row_max = row_max.scatter_reduce(0, queries[:, None].expand(-1, b), scores.amax(-1), "amax")
    row_max = row_max.masked_fill(row_max == -math.inf, 0.0)
    probs = torch.exp(scores - row_max.index_select(0, queries)[:, :, None])
    total = q.new_zeros(rows, b).index_add(0, queries, probs.sum(-1))
    out = q.new_zeros(rows, b, d).index_add(0, queries, torch.bmm(probs, v.index_select(0, keys)))
    if extra_score is not None:
        extra_weight = torch.exp(extra_score[:, None] - row_max)
        total = total + extra_weight
        out = out + extra_weight[..., None] * extra_value[:, None, :]
    nonempty = total > 0
    lse = torch.where(nonempty, row_max + torch.where(nonempty, total, 1.0).log(), -math.inf)
    return out / torch.where(nonempty, total, 1.0)[..., None], lse


def pair_backward(grad_out, q, k, v, key_real, extra_value, extra_score, queries, keys, valid, out, lse, scaling):
    """Gradients of :func:`pair_forward`'s output: (dq, dk, dv, d extra_value, d extra_score), the
    last two None without an extra key. P = exp(S - lse) is recomputed per pair;
    dS = P * (dP - rowsum(dO * O)), dP = dO V^T."""
    delta = (grad_out * out).sum(-1)  # (R, b)
    q_rows, d_out = q.index_select(0, queries), grad_out.index_select(0, queries)
    k_block, v_block = k.index_select(0, keys), v.index_select(0, keys)
    # A row with lse = -inf has no allowed key: its scores become +inf here, then -inf, so P = 0.
    scores = torch.bmm(q_rows, k_block.transpose(1, 2)).mul_(scaling).sub_(lse.index_select(0, queries)[:, :, None])
    probs = scores.masked_fill_(~_allowed(key_real, keys, valid), -math.inf).exp_()
    grad_v = torch.zeros_like(v).index_add_(0, keys, torch.bmm(probs.transpose(1, 2), d_out))
    d_scores = torch.bmm(d_out, v_block.transpose(1, 2)).sub_(delta.index_select(0, queries)[:, :, None])
    d_scores = d_scores.mul_(probs).mul_(scaling)
    grad_q = torch.zeros_like(q).index_add_(0, queries, torch.bmm(d_scores, k_block))
    grad_k = torch.zeros_like(k).index_add_(0, keys, torch.bmm(d_scores.transpose(1, 2), q_rows))
    if extra_score is None:
        return grad_q, grad_k, grad_v, None, None
    # The extra key of row i has probability p_i = exp(score - lse_i) (0 in rows without any key):
    # d value = sum_i p_i dO_i; d score = (d value) . value - sum_i p_i rowsum(dO_i * O_i).
    extra_prob = torch.exp(extra_score[:, None] - lse).masked_fill(lse == -math.inf, 0.0)
    grad_extra_value = torch.bmm(extra_prob[:, None, :], grad_out)[:, 0]
    grad_extra_score = (grad_extra_value * extra_value).sum(-1) - (extra_prob * delta).sum(-1)
    return grad_q, grad_k, grad_v, grad_extra_value, grad_extra_score


def _head_slices(heads_total: int, max_pairs: int, block_elements: int) -> list[slice]:
    """Slices of the (batch * heads) dimension holding at most PAIR_SLICE_ELEMENTS gathered elements."""
    if is_tracing():
        return [slice(None)]
    step = max(1, PAIR_SLICE_ELEMENTS // max(1, max_pairs * block_elements))
    return [slice(i, i + step) for i in range(0, heads_total, step)]


def _sliced(q, k, v, key_real, extra_value, extra_score, selected):
    """The arguments viewed per (batch * head): blocks (S, nb, b, d), key_real (S, nb, b), extras
    (S, nb, d) and (S, nb), selected (S, nb, nb)."""
    batch, heads, nb, b, d = q.shape
    flat = [t.reshape(batch * heads, nb, b, d) for t in (q, k, v)]
    if key_real is not None:
        key_real = key_real.view(batch, 1, nb, b).expand(batch, heads, nb, b).reshape(batch * heads, nb, b)
    if extra_score is not None:
        extra_value, extra_score = extra_value.reshape(batch * heads, nb, d), extra_score.reshape(batch * heads, nb)
    return (*flat, key_real, extra_value, extra_score, selected.reshape(batch * heads, nb, nb))


def _rows(t: torch.Tensor | None, s: slice) -> torch.Tensor | None:
    """Slice ``s`` of a per-(batch * head) tensor with its block dimension folded into rows."""
    return None if t is None else t[s].flatten(0, 1)


def _for_each_slice(fn, selected, max_pairs, block_elements):
    """fn(slice, queries, keys, valid) for each slice of heads, with that slice's pair list."""
    results = []
    for s in _head_slices(selected.shape[0], max_pairs, block_elements):
        results.append(fn(s, *pair_list(selected[s], max_pairs)))
    return results


class PairBlockSparseAttention(torch.autograd.Function):
    """:func:`pair_attention` with a backward that recomputes the pairs' scores (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, key_real, extra_value, extra_score, selected, scaling, max_pairs):
        out, lse = _pairs_out_and_lse(q, k, v, key_real, extra_value, extra_score, selected, scaling, max_pairs)
        ctx.save_for_backward(q, k, v, key_real, extra_value, extra_score, selected, out, lse)
        ctx.scaling, ctx.max_pairs = scaling, max_pairs
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, key_real, extra_value, extra_score, selected, out, lse = ctx.saved_tensors
        shape = q.shape
        *flat, key_real, extra_value, extra_score, selected = _sliced(q, k, v, key_real, extra_value, extra_score, selected)
        grad_out, out, lse = (t.reshape(selected.shape[0], *t.shape[2:]) for t in (grad_out.contiguous(), out, lse))
        grads = [torch.empty_like(t) for t in flat]
        extra_grads = [None, None] if extra_score is None else [torch.empty_like(extra_value), torch.empty_like(extra_score)]

        def one_slice(s, queries, keys, valid):
            result = pair_backward(
                _rows(grad_out, s),
                *(_rows(t, s) for t in flat),
                _rows(key_real, s),
                _rows(extra_value, s),
                _rows(extra_score, s),
                queries,
                keys,
                valid,
                _rows(out, s),
                _rows(lse, s),
                ctx.scaling,
            )
            for target, grad in zip(grads + extra_grads, result):
                if target is not None:
                    target[s] = grad.view(target[s].shape)

        _for_each_slice(one_slice, selected, ctx.max_pairs, shape[-2] * shape[-1])
        extra_grads = [None if g is None else g.view(t.shape) for g, t in zip(extra_grads, ctx.saved_tensors[4:6])]
        return *(g.view(shape) for g in grads), None, *extra_grads, None, None, None


def _pairs_out_and_lse(q, k, v, key_real, extra_value, extra_score, selected, scaling, max_pairs):
    """Forward of :func:`pair_attention`, also returning the per-row log-sum-exp (B, H, nb, b)."""
    shape = q.shape
    *flat, key_real, extra_value, extra_score, selected = _sliced(q, k, v, key_real, extra_value, extra_score, selected)
    parts = _for_each_slice(
        lambda s, queries, keys, valid: pair_forward(
            *(_rows(t, s) for t in flat),
            _rows(key_real, s),
            _rows(extra_value, s),
            _rows(extra_score, s),
            queries,
            keys,
            valid,
            scaling,
        ),
        selected,
        max_pairs,
        shape[-2] * shape[-1],
    )
    out, lse = (torch.cat(t) if len(t) > 1 else t[0] for t in zip(*parts))
    return out.view(shape), lse.view(shape[:-1])


def pair_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    selected: torch.Tensor,
    scaling: float,
    key_real: torch.Tensor | None = None,
    extra_value: torch.Tensor | None = None,
    extra_score: torch.Tensor | None = None,
    max_pairs: int | None = None,
) -> torch.Tensor:
    """:func:`.gather.block_sparse_attention` (same arguments and result) over a list of
    ``max_pairs`` pairs per (batch, head) (None: all nb * nb); every head must select at most that many."""
    nb = q.shape[2]
    max_pairs = nb * nb if max_pairs is None else max_pairs
    return PairBlockSparseAttention.apply(q, k, v, key_real, extra_value, extra_score, selected, scaling, max_pairs)
