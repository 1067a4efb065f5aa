"""Linformer: low-rank attention through learned sequence projections (Wang et al., "Linformer:
Self-Attention with Linear Complexity", 2020).

Keys and values are projected along the sequence axis by learnable matrices E, F of shape
(k, max_seq_len), Eq. (7) of the paper's section 4::

    head = softmax(Q (E K)^T * scaling) (F V)          # (n x k) context mapping P-bar

which costs O(n k) instead of O(n^2). The parameter-sharing levels of section 4 ("Parameter
sharing between projections") are the ``sharing`` option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import register_method
from .base import (
    METHOD_ATTRIBUTE,
    AttentionMethod,
    AttentionShape,
    MethodOptions,
    Paper,
    check_choice,
    check_int,
    is_tracing,
)

#: Sharing levels of the Linformer paper, section 4 "Parameter sharing between projections", plus "none"
#: (separate E_i, F_i for every head i, the unshared form of Eq. (7)).
SHARING_MODES = ("none", "headwise", "key-value", "layerwise")


@dataclass
class LinformerOptions(MethodOptions):
    k: int = field(
        default=256,
        metadata={
            "help": (
                "Projected dimension; section 5.1 (Fig. 3(d)) holds k = 256 for n = 512..4096, and Table 2 shows k = 256 "
                "matching RoBERTa at 512 and 1024."
            )
        },
    )
    sharing: str = field(
        default="layerwise",
        metadata={
            "help": (
                'The sharing levels of section 4: `"headwise"` (E, F per layer), `"key-value"` (E = F per layer), '
                '`"layerwise"` (one E for every layer, head, key and value: the best of section 5.2 / Table 2, and the '
                'variant of Table 3), plus `"none"` (E_i, F_i per head).'
            )
        },
    )

    def validate(self) -> None:
        check_int("k", self.k, 1)
        check_choice("sharing", self.sharing, SHARING_MODES)


def _init_projection_(param: torch.Tensor) -> None:
    """Xavier-uniform with gain 1/sqrt(2), in place, as the official fairseq Linformer initialises
    its ``compress_k`` / ``compress_v`` weights (the paper itself does not state an initialisation).
    ``nn.init`` so that Transformers' loading skips projections read from the checkpoint."""
    k, max_seq_len = param.shape[-2:]
    bound = math.sqrt(3.0 / (k + max_seq_len))  # gain * sqrt(6 / (fan_in + fan_out)), gain = 1/sqrt(2)
    nn.init.uniform_(param, -bound, bound)


class _FirstLayer:
    """The first layer's self-attention module, whose method owns the layerwise-shared E.

    Looked up at every call, so a wrapper installed later is followed (PEFT's
    ``modules_to_save`` replaces ``efficient_attn`` by a wrapper whose trainable copy holds the
    E that is trained and saved with the adapter). Not a submodule: E is saved once, in the first
    layer. A deepcopy of a whole model points the copy at the copy's first layer; a deepcopy of
    one layer's method alone (PEFT's copies) keeps pointing at the model's first layer.
    """

    def __init__(self, attention: nn.Module):
        self.attention = attention

    def method(self) -> nn.Module:
        return getattr(self.attention, METHOD_ATTRIBUTE)

    def __deepcopy__(self, memo: dict) -> "_FirstLayer":
        return _FirstLayer(memo.get(id(self.attention), self.attention))


@register_method
class Linformer(AttentionMethod):
    """softmax(Q (E K)^T * scaling) (F V) with learnable E, F: (k, max_seq_len) (Linformer, Eq. 7)."""

    name = "linformer"
    paper = Paper("Linformer: Self-Attention with Linear Complexity", "Wang et al., 2020", "2006.04768")
    cost = "O(n k d)"
    budget_option = "k"
    options_cls = LinformerOptions
    length_bound = True

    def __init__(self, options: LinformerOptions, shape: AttentionShape):
        super().__init__(options, shape)
        per_head = (shape.num_heads,) if options.sharing == "none" else ()
        proj_shape = per_head + (options.k, shape.max_seq_len)
        self.e_proj = nn.Parameter(torch.empty(proj_shape))
        # "key-value" and "layerwise" use one matrix for keys and values (E_i = F_i = E).
        self.f_proj = nn.Parameter(torch.empty(proj_shape)) if options.sharing in ("none", "headwise") else None
        self._first_layer: _FirstLayer | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for param in self.parameters(recurse=False):
            _init_projection_(param)

    def share_from(self, first_layer: nn.Module) -> None:
        """Layerwise sharing: drop this layer's E and use the first layer's, which stays the only
        registered copy."""
        if self.options.sharing != "layerwise":
            return
        first = getattr(first_layer, METHOD_ATTRIBUTE)
        if not isinstance(first, Linformer) or first.e_proj.shape != self.e_proj.shape:
            raise ValueError("linformer layerwise sharing needs a first layer with the same options and max_seq_len")
        del self.e_proj
        self._first_layer = _FirstLayer(first_layer)

    def projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(E, F) used by this layer, each (k, max_seq_len) or (heads, k, max_seq_len)."""
        owner = self if self._first_layer is None else self._first_layer.method()
        e = owner.e_proj
        return e, (e if owner.f_proj is None else owner.f_proj)

    def attend(self, q, k, v, key_padding_mask, scaling):
        seq_len = k.shape[2]
        if seq_len > self.shape.max_seq_len:
            raise ValueError(
                f"linformer: sequence length {seq_len} exceeds the maximum {self.shape.max_seq_len} "
                f"(max_seq_len, the number of columns of the projections E, F); "
                f"use inputs of at most {self.shape.max_seq_len} tokens"
            )
        # Padded keys/values arrive zeroed (base class): E K sums over real tokens only, exactly what
        # the unpadded sequence gives when padding is on the right (Transformers' default for these
        # encoders). With padding elsewhere the real tokens would meet other columns of E, F than
        # unpadded, so it is refused, in eager mode only: a traced model (torch.compile,
        # torch.export) cannot read the mask and does not check. The official code does not mask.
        checked = key_padding_mask is not None and not is_tracing()
        if checked and bool((key_padding_mask[:, 1:] & ~key_padding_mask[:, :-1]).any()):
            raise ValueError(
                "linformer: its projections E, F are tied to positions, so padding must be on the right "
                "(tokenizer.padding_side = 'right'); got a real token after a padded one"
            )
        e, f = self.projections()
        # Shorter inputs use the first n columns of E, F, as the official fairseq code does.
        e, f = e[..., :seq_len].to(k.dtype), f[..., :seq_len].to(v.dtype)
        # (k, n) or, for sharing "none", (H, k, n) broadcast against (B, H, n, D) -> (B, H, k, D):
        # the projected E_i K W_i^K and F_i V W_i^V of Eq. (7).
        k_proj, v_proj = e @ k, f @ v
        return F.scaled_dot_product_attention(q, k_proj, v_proj, scale=scaling)
