"""Longformer: its self-attention class replaced by a subclass that calls a method module.

The subclass reuses ``query``/``key``/``value`` (state-dict keys unchanged). Every token
attends to every token through the method, so Longformer's sliding-window/global split
(``attention_window``, ``global_attention_mask``) no longer restricts attention; the
``*_global`` projections stay in the state dict but are unused. Packed rows reach it as the
``packed_segments`` attribute, which the patched model sets for one call (its layers see none of
the collator's keywords; ``patching.py``).
"""

from __future__ import annotations

import torch
from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

from .packing import Segments, attend_packed


class EfficientLongformerSelfAttention(LongformerSelfAttention):
    """``LongformerSelfAttention`` whose attention is ``self.efficient_attn``."""

    #: The sequences of packed rows in the current call, or None.
    packed_segments: Segments | None = None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        is_index_masked: torch.Tensor | None = None,
        is_index_global_attn: torch.Tensor | None = None,
        is_global_attn: bool | None = None,
        output_attentions: bool = False,  # refused by the patched model (patching.py)
    ) -> tuple[torch.Tensor]:
        batch, seq_len, _ = hidden_states.shape
        heads = (batch, seq_len, self.num_heads, self.head_dim)
        q, k, v = (proj(hidden_states).view(heads).transpose(1, 2) for proj in (self.query, self.key, self.value))
        key_padding_mask = None if is_index_masked is None else ~is_index_masked
        if self.packed_segments is not None:
            out = attend_packed(self.efficient_attn, self.packed_segments, q, k, v, self.head_dim**-0.5)
        else:
            out = self.efficient_attn(q, k, v, key_padding_mask, self.head_dim**-0.5)
        return (out.transpose(1, 2).reshape(batch, seq_len, self.embed_dim),)
