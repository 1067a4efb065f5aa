"""MRA-2's block statistics and selection (Zeng et al. 2022, section 4.1, eqs. 10-12 and 17; Alg. 1
with R = {b, 1}): masked block means, the block-level scores log mu, and the budget's block pairs. The
reference the ``triton`` backend's selection kernels are compared with, bit for bit
(docs/methods/mra.md, "Choices where the paper is vague")."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .pairs import row_major_cumsum


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


def budgets(counts: torch.Tensor, block_per_row: int) -> torch.Tensor:
    """Each sequence's budget (B,): block_per_row x its query blocks holding a real token, at most all
    its real block pairs (0 for a sequence of padding only)."""
    real_blocks = (counts > 0).sum(-1)
    return torch.minimum(real_blocks * block_per_row, real_blocks * real_blocks)


def prior_levels(blocks: int, first_n: int, diagonal_n: int, device: torch.device) -> torch.Tensor:
    """(nb, nb) int: the number of prior sets holding each pair (first rows, first columns, diagonal
    band; the official get_block_idxes adds 5e3 per set)."""
    idx = torch.arange(blocks, device=device)
    levels = (idx[:, None] < first_n).int() + (idx[None, :] < first_n).int()
    if diagonal_n > 0:
        levels += ((idx[:, None] - idx[None, :]).abs() <= diagonal_n // 2).int()
    return levels


@torch.no_grad()
def cut_levels(counts: torch.Tensor, block_per_row: int, first_n: int, diagonal_n: int) -> torch.Tensor:
    """(B,) int32: for each sequence, the prior level at which its budget runs out when pairs are taken
    level by level (eligible pairs only: both blocks hold a real token): the highest level with at least
    the budget's pairs at or above it. Every pair above it is selected, none below it (the triton
    backend's selection, by (level, score) as :func:`select_blocks`)."""
    real = counts > 0
    eligible = real[:, :, None] & real[:, None, :]
    levels = prior_levels(counts.shape[1], first_n, diagonal_n, counts.device) * eligible  # (B, nb, nb)
    at_least = torch.stack([(levels >= level).flatten(1).sum(-1) for level in (1, 2, 3)], -1)  # (B, 3)
    return (at_least >= budgets(counts, block_per_row).clamp(min=1)[:, None]).sum(-1, dtype=torch.int32)


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
        prior_sets = prior_levels(nb, first_n, diagonal_n, logits.device).to(score.dtype)
        lowest = score.masked_fill(score == -math.inf, math.inf).amin((-2, -1), keepdim=True)
        score = score + prior_sets * (1 - lowest)
    budget = budgets(counts, block_per_row)[:, None, None]  # (B, 1, 1)
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
