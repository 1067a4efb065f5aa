"""Packed rows kept apart: several sequences in one row (``transformers.DataCollatorWithFlattening``)
each attend only to themselves.

The sequences of the packed rows are gathered into padded batches, one sequence per row
(:meth:`PaddedBatches.unpack`), the method runs on each, and each output goes back to its token
(:meth:`PaddedBatches.repack`). Every method is padding invariant (its contract), so each sequence
gets what it would get alone; only the attention sees the padded batches, embeddings and
feed-forward layers run on the packed tokens. (Methods cannot take a block-diagonal mask instead:
their approximations mix keys before any mask applies, e.g. Nystromformer's landmarks are means
over the whole row.) Sequences of similar length share a batch (:func:`length_groups`), so the
attention, too, pays for little padding.

Where the sequences start is read from the keywords the collator returns, in this order:
``cu_seq_lens_q`` with ``max_length_q`` (``return_flash_attn_kwargs=True``), ``seq_idx``
(``return_seq_idx=True``), or ``position_ids`` that restart (its default). Under ``torch.compile``
and ``torch.export`` only the first gives the batch a shape known when tracing (the number of
sequences is ``len(cu_seq_lens_q) - 1``, the longest ``max_length_q``), and the sequences stay in one
batch; the others are checked to hold one sequence per row instead (an error at run time, never a
silent mix).

A patched model works this out once per forward (:func:`packed_segments`) and hands it to its
layers as the ``packed_segments`` keyword (``patching.py``); a layer called without it works it out
from the collator's keywords itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..methods.base import AttentionMethod, is_tracing

#: The keyword a patched model passes its layers: the :class:`Segments` of its input.
SEGMENTS_KEYWORD = "packed_segments"

#: What a traced model with packed rows needs (the message of every packed-input error under tracing).
TRACED_PACKING = (
    "under torch.compile / torch.export, packed rows need cu_seq_lens_q and max_length_q "
    "(DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
)

#: A sequence shares a padded batch with longer ones when this many padded slots, or an eighth of
#: the batch's length if more, are all it adds: every batch is one more call of the method (a fixed
#: cost, larger on a GPU), so short sequences of a few different lengths (GLUE's) stay together.
GROUP_PADDING_TOKENS = 64


def length_groups(lengths: list[int]) -> list[list[int]]:
    """The sequences (indices into ``lengths``) in padded batches of similar length, longest first,
    each batch in the order given: a sequence joins the batch of the longer ones before it unless
    padding it to that batch's length adds more than ``max(GROUP_PADDING_TOKENS, length / 8)``."""
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and lengths[groups[-1][0]] - lengths[index] <= max(GROUP_PADDING_TOKENS, lengths[groups[-1][0]] // 8):
            groups[-1].append(index)
        else:
            groups.append([index])
    return [sorted(group) for group in groups]


@dataclass
class PaddedBatches:
    """Where each token of the packed rows (``row_len`` tokens each) sits in padded batches of
    ``shapes`` (count, length), one sequence per row, laid out one batch after another in one run of
    slots. Tokens a model appends to the rows later (Longformer pads rows to its attention window)
    are left out, and their outputs are zero."""

    token_to_slot: torch.Tensor  # (B*N,)
    slot_to_token: torch.Tensor  # (slots,) the token in each slot (0 for an empty slot)
    real: torch.Tensor  # (slots,) bool: slots holding real (not padded) tokens
    shapes: list[tuple[int, int]]
    row_len: int

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [count * length for count, length in self.shapes]
        return [part.view(count, length, *flat.shape[1:]) for part, (count, length) in zip(flat.split(sizes), self.shapes)]

    def unpack(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, H, N, D) packed -> a (count, H, length, D) batch per shape."""
        return [part.transpose(1, 2) for part in self.unpack_tokens(x.transpose(1, 2))]

    def unpack_tokens(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, N, ...) packed -> a (count, length, ...) batch per shape."""
        return self._split(x[:, : self.row_len].reshape(-1, *x.shape[2:]).index_select(0, self.slot_to_token))

    def masks(self) -> list[torch.Tensor]:
        """The (count, length) key-padding mask of each batch (True = real token)."""
        return self._split(self.real)

    def repack(self, outs: list[torch.Tensor], batch: int, seq_len: int) -> torch.Tensor:
        """A (count, H, length, D) output per batch -> (B, H, N, D), each token's output in its place."""
        heads, dim = outs[0].shape[1], outs[0].shape[3]
        slots = torch.cat([out.transpose(1, 2).reshape(-1, heads, dim) for out in outs])
        tokens = slots.index_select(0, self.token_to_slot).view(batch, self.row_len, heads, dim)
        return torch.nn.functional.pad(tokens, (0, 0, 0, 0, 0, seq_len - self.row_len)).transpose(1, 2)


@dataclass
class Segments:
    """The sequences of packed rows: for each token (rows flattened), its sequence and its place in
    it. ``batches``: the padded batches the attention runs on."""

    sequence: torch.Tensor  # (B*N,) each token's sequence
    offset: torch.Tensor  # (B*N,) its place in the sequence
    real_tokens: torch.Tensor  # (B*N,) bool
    count: int
    length: int  # the longest sequence's
    batches: PaddedBatches

    def in_order(self) -> PaddedBatches:
        """One batch, a row per sequence in order (what a sequence-level head reads)."""
        if self.batches.shapes == [(self.count, self.length)]:
            return self.batches
        row_start = torch.arange(self.count, device=self.sequence.device) * self.length
        shapes = [(self.count, self.length)]
        return _padded_batches(self.sequence, self.offset, self.real_tokens, row_start, shapes, self.batches.row_len)


def _padded_batches(
    sequence: torch.Tensor,
    offset: torch.Tensor,
    real_tokens: torch.Tensor,
    row_start: torch.Tensor,
    shapes: list[tuple[int, int]],
    row_len: int,
) -> PaddedBatches:
    """The layout in which sequence ``s`` starts at slot ``row_start[s]``."""
    token_to_slot = row_start[sequence] + offset
    slots = sum(count * length for count, length in shapes)
    positions = torch.arange(token_to_slot.numel(), device=token_to_slot.device)
    slot_to_token = token_to_slot.new_zeros(slots).scatter_(0, token_to_slot, positions)
    real = real_tokens.new_zeros(slots).scatter_(0, token_to_slot, real_tokens)
    return PaddedBatches(token_to_slot, slot_to_token, real, shapes, row_len)


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
    kwargs: dict[str, Any], key_padding_mask: torch.Tensor | None, batch: int, seq_len: int, group: bool = True
) -> Segments | None:
    """The sequences of packed rows, or None when every row holds one sequence (or nothing says).
    ``group``: the attention's batches hold sequences of similar length (:func:`length_groups`);
    else one batch in order (sampling methods in training, which draw per row as a padded batch
    would; and always under tracing)."""
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
    offset = torch.arange(flat.numel(), device=flat.device) - sequence_start_index(flat)
    real_tokens = torch.ones_like(flat) if key_padding_mask is None else key_padding_mask.flatten()
    if is_tracing():  # one batch, of the shape the keywords give
        count, length = kwargs["cu_seq_lens_q"].shape[0] - 1, int(kwargs["max_length_q"])
        shapes = [(count, length)]
        row_start = torch.arange(count, device=flat.device) * length
    else:
        lengths = torch.bincount(sequence).tolist()  # the one value read back to the host
        count, length = len(lengths), max(lengths)
        if count == batch:
            return None
        groups = length_groups(lengths) if group else [list(range(count))]
        shapes = [(len(members), max(lengths[member] for member in members)) for members in groups]
        starts_at = [0] * count  # each batch's rows one after another, the batches one after another
        slot = 0
        for members, (_, width) in zip(groups, shapes):
            for member in members:
                starts_at[member], slot = slot, slot + width
        row_start = torch.tensor(starts_at, device=flat.device)
    batches = _padded_batches(sequence, offset, real_tokens, row_start, shapes, seq_len)
    return Segments(sequence, offset, real_tokens, count, length, batches)


def shift_packed_positions(position_ids: torch.Tensor, attention_mask: torch.Tensor | None, offset: int) -> torch.Tensor:
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


def groups_by_length(method: AttentionMethod) -> bool:
    """Whether packed sequences may run in padded batches of similar length (``packing.py``): not
    for a sampling method in training, which must draw per row as it would for a padded batch."""
    return not (method.samples and method.training)


def attend_packed(
    method: AttentionMethod,
    segments: Segments,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """(B, H, N, D) packed q, k, v -> (B, H, N, D): ``method`` on each padded batch of the sequences."""
    batches = segments.batches
    parts = zip(*(batches.unpack(t) for t in (query, key, value)), batches.masks())
    outs = [method(q, k, v, mask, scaling) for q, k, v, mask in parts]
    batch, _, seq_len, _ = query.shape
    return batches.repack(outs, batch, seq_len)
