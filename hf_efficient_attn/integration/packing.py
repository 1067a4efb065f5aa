"""Packed rows kept apart: several sequences in one row (``transformers.DataCollatorWithFlattening``)
each attend only to themselves.

The sequences of the packed rows are gathered into a padded batch, one sequence per row
(:meth:`Segments.unpack`), the method runs on it, and each output goes back to its token
(:meth:`Segments.repack`). Every method is padding invariant (its contract), so each sequence gets
what it would get alone; only the attention sees that batch, embeddings and feed-forward layers run
on the packed tokens. (Methods cannot take a block-diagonal mask instead: their approximations mix
keys before any mask applies, e.g. Nystromformer's landmarks are means over the whole row.)

Where the sequences start is read from the keywords the collator returns, in this order:
``cu_seq_lens_q`` with ``max_length_q`` (``return_flash_attn_kwargs=True``), ``seq_idx``
(``return_seq_idx=True``), or ``position_ids`` that restart (its default). Under ``torch.compile``
and ``torch.export`` only the first gives the batch a shape known when tracing (the number of
sequences is ``len(cu_seq_lens_q) - 1``, the longest ``max_length_q``); the others are checked to
hold one sequence per row instead (an error at run time, never a silent mix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..methods.base import is_tracing

#: The keywords of DataCollatorWithFlattening that say where packed sequences start.
PACKING_KEYWORDS = ("cu_seq_lens_q", "seq_idx")

#: What a traced model with packed rows needs (the message of every packed-input error under tracing).
TRACED_PACKING = (
    "under torch.compile / torch.export, packed rows need cu_seq_lens_q and max_length_q "
    "(DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
)


@dataclass
class Segments:
    """Where each token of the packed rows sits in the unpacked batch of ``count`` sequences of
    at most ``length`` tokens."""

    token_to_slot: torch.Tensor  # (B*N,) slot = sequence * length + offset in the sequence
    slot_to_token: torch.Tensor  # (count*length,) the token in each slot (0 for an empty slot)
    real: torch.Tensor  # (count, length) bool: slots holding real (not padded) tokens
    count: int
    length: int

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) packed -> (count, H, length, D), one sequence per row."""
        return self.unpack_tokens(x.transpose(1, 2)).transpose(1, 2)

    def unpack_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, ...) packed -> (count, length, ...), one sequence per row."""
        rows = x.reshape(-1, *x.shape[2:]).index_select(0, self.slot_to_token)
        return rows.view(self.count, self.length, *x.shape[2:])

    def repack(self, out: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
        """(count, H, length, D) -> (B, H, N, D), each token's output back in its place."""
        _, heads, _, dim = out.shape
        slots = out.transpose(1, 2).reshape(self.count * self.length, heads, dim)
        return slots.index_select(0, self.token_to_slot).view(batch, seq_len, heads, dim).transpose(1, 2)


def sequence_starts(kwargs: dict[str, Any], batch: int, seq_len: int) -> torch.Tensor | None:
    """(B, N) bool, True at the first token of every sequence (every row's first token included), from
    the packing keywords (module docstring); None when none is given."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        flat = torch.zeros(batch * seq_len, dtype=torch.bool, device=cu_seq_lens.device)
        flat[cu_seq_lens[:-1].long()] = True
        starts = flat.view(batch, seq_len)
    else:
        runs = kwargs.get("seq_idx")
        step = 0
        if runs is None:
            runs, step = kwargs.get("position_ids"), 1
        if runs is None:
            return None
        runs = runs.expand(batch, seq_len)
        starts = torch.ones(batch, seq_len, dtype=torch.bool, device=runs.device)
        starts[:, 1:] = runs[:, 1:] != runs[:, :-1] + step
    starts[:, 0] = True
    return starts


def sequence_start_index(starts: torch.Tensor) -> torch.Tensor:
    """For each token, the index (along the last dimension) of its sequence's first token, from
    :func:`sequence_starts`' flags."""
    index = torch.arange(starts.shape[-1], device=starts.device).expand_as(starts)
    return torch.where(starts, index, 0).cummax(-1).values


def packed_segments(
    kwargs: dict[str, Any], key_padding_mask: torch.Tensor | None, batch: int, seq_len: int
) -> Segments | None:
    """The sequences of packed rows, or None when every row holds one sequence (or nothing says)."""
    starts = sequence_starts(kwargs, batch, seq_len)
    if starts is None:
        return None
    if key_padding_mask is not None:  # a padded token never starts a sequence: it joins the one before
        starts = starts & key_padding_mask
        starts[:, 0] = True
    traced_shape = kwargs.get("cu_seq_lens_q") is not None and kwargs.get("max_length_q") is not None
    if is_tracing() and not traced_shape:
        # No shape for the unpacked batch is known when tracing: a packed row fails loudly at run time.
        torch._assert_async(starts[:, 1:].logical_not().all(), TRACED_PACKING)
        return None
    flat = starts.flatten()
    sequence = flat.long().cumsum(0) - 1  # each token's sequence
    positions = torch.arange(flat.numel(), device=flat.device)
    offset = positions - sequence_start_index(flat)
    if traced_shape:
        count, length = kwargs["cu_seq_lens_q"].shape[0] - 1, int(kwargs["max_length_q"])
    else:
        count = int(sequence[-1]) + 1
        if count == batch:
            return None
        length = int(offset.max()) + 1
    token_to_slot = sequence * length + offset
    slot_to_token = torch.zeros(count * length, dtype=torch.long, device=flat.device)
    slot_to_token.scatter_(0, token_to_slot, positions)
    real_tokens = torch.ones_like(flat) if key_padding_mask is None else key_padding_mask.flatten()
    real = torch.zeros(count * length, dtype=torch.bool, device=flat.device).scatter_(0, token_to_slot, real_tokens)
    return Segments(token_to_slot, slot_to_token, real.view(count, length), count, length)


def shift_packed_positions(
    position_ids: torch.Tensor, attention_mask: torch.Tensor | None, offset: int
) -> torch.Tensor:
    """Positions of a RoBERTa-family model (which start at ``offset`` = ``pad_token_id + 1``) from
    packed ``position_ids``: sequences that start at 0 (the collator's default ``position_ids_start``)
    are shifted by ``offset``; those that start at ``offset`` are kept, and so are padded tokens at
    the padding position ``offset - 1``. ``ValueError`` for a sequence of real tokens (``attention_mask``)
    that starts elsewhere (checked when not tracing)."""
    batch, seq_len = position_ids.shape
    starts = sequence_starts({"position_ids": position_ids}, batch, seq_len)
    start_value = position_ids.gather(1, sequence_start_index(starts))
    shifted = position_ids + offset * (start_value == 0)
    if not is_tracing():
        real = torch.ones_like(starts) if attention_mask is None else attention_mask.bool()
        allowed = (start_value == 0) | (start_value == offset) | (start_value == offset - 1)  # a padded run
        bad = start_value[real & (~allowed | (shifted < offset))]
        if bad.numel():
            raise ValueError(
                f"position_ids: a sequence starts at {int(bad[0])}; this model's positions start at {offset} "
                f"(pad_token_id + 1): use DataCollatorWithFlattening(position_ids_start={offset}), or 0 (shifted here)"
            )
    return shifted
