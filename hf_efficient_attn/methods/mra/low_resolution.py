"""MRA-2's low-resolution part (Zeng et al. 2022, Alg. 2 at resolution b, eqs. 13 and 17): per query
block, a softmax over the key blocks not attended exactly, of the block means."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ..base import is_tracing
from .selection import BlockStats

#: Elements of the (nb x nb) low-resolution tensors recomputed at once in the backward (4 MiB in
#: fp32): slices of whole heads, so that long inputs do not keep them for every head at once.
LOW_RESOLUTION_SLICE_ELEMENTS = 2**20


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
