"""The bridge to Transformers: the registered attention and mask functions.

BERT-style models dispatch self-attention through ``ALL_ATTENTION_FUNCTIONS`` by the config's
attention implementation (``transformers_private.py``); every method name is registered there together with a
mask function, so the layer's method module (``self_attention.efficient_attn``, attached by
``patch_model``) receives a key-padding mask. Longformer has its own attention class and gets
a subclass instead (see ``longformer.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, sdpa_mask
from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

from ..methods.base import METHOD_ATTRIBUTE, AttentionMethod, AttentionShape, is_tracing
from ..registry import build_method, method_named_by, on_register, resolve_method, saved_attn_implementation
from .architectures import (
    dispatch_refusal,
    dispatches,
    dispatches_attention,
    is_causal,
    is_windowed,
    packed_pooling_refusal,
)
from .longformer import EfficientLongformerSelfAttention
from .packing import SEGMENTS_KEYWORD, attend_packed, groups_by_length, packed_segments
from .transformers_private import is_packed_bidirectional_mask, requested_attn_implementation

#: Attribute a patched model sets on its method modules for a call with ``output_attentions=True``;
#: then methods that form attention probabilities (those with a ``probabilities`` method) return them.
RETURN_PROBABILITIES = "return_probabilities"


def check_supported(config: Any, attn_impl: str) -> None:
    """``ValueError`` unless ``config``'s architecture dispatches its self-attention (``architectures.py``)
    and is not configured as a decoder."""
    refusal = dispatch_refusal(config, attn_impl)
    if refusal is not None:
        raise ValueError(refusal)


def layer_shape(config: Any, module: nn.Module, layer_idx: int) -> AttentionShape:
    """The shape of the method of attention module ``module``, the ``layer_idx``-th of its model."""
    heads = config.num_attention_heads
    head_dim = getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None) or config.hidden_size // heads
    return AttentionShape(heads, head_dim, config.max_position_embeddings, layer_idx)


def _plain_transformers_method(module: nn.Module, name: str) -> AttentionMethod:
    """The method of a layer whose model was built from a Transformers class itself (e.g.
    ``transformers.BertModel.from_pretrained(p, attn_implementation=name)``; the auto classes build
    patched models instead, ``auto.py``), built on first use with the options the config saves for
    that method and registered as a submodule, so ``.eval()`` / ``.train()`` / ``.to()`` reach it.

    Only parameter-free methods can be built here: learnable ones need ``patch_model`` so
    that their parameters exist before weights load and are saved with the model.
    """
    config = module.config
    check_supported(config, name)
    choice = resolve_method(config, name)
    method = build_method(choice, layer_shape(config, module, getattr(module, "layer_idx", None) or 0))
    if any(True for _ in method.parameters()):
        raise ValueError(
            f"attention method {name!r} with options {method.options.to_dict()} has learnable parameters; "
            "load the model through an auto class (transformers.AutoModel* or hf_efficient_attn.AutoModel*), "
            "or call hf_efficient_attn.patch_model(model, ...)"
        )
    method.to(next(module.parameters()).device).train(module.training)
    module.add_module(METHOD_ATTRIBUTE, method)
    return method


def kept(attention_mask: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = attend) from a bool or additive float one (0 = attend)."""
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def key_padding_mask_from(attention_mask: torch.Tensor | None, batch: int, seq_len: int) -> torch.Tensor | None:
    """Bool (B, N) key-padding mask (True = real) from a 4D mask that only masks keys.

    Accepts bool masks (True = attend) and additive float masks (0 = attend), of shape
    (B, 1 or H, 1 or N, N); raises ``ValueError`` for anything else (causal, custom).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4 or attention_mask.shape[-1] != seq_len:
        raise ValueError(
            f"efficient attention accepts a 4D key-padding mask (batch, 1, 1 or {seq_len}, {seq_len}); "
            f"got shape {tuple(attention_mask.shape)}"
        )
    keep = kept(attention_mask)
    first_row = keep[:, :1, :1, :]
    if keep.shape[1] * keep.shape[2] > 1 and not torch.equal(keep, first_row.expand_as(keep)):
        raise ValueError(
            "efficient attention methods only honour key-padding masks (every query sees the same keys); "
            "got a mask that differs between queries or heads (causal or custom)"
        )
    return first_row.reshape(-1, seq_len).expand(batch, seq_len)


def efficient_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` function: q, k, v (B, H, N, D) -> ((B, N, H, D), probabilities or None);
    the probabilities (B, H, N, N) only when the model asked the method for them (``output_attentions``).

    Attention-probability dropout is not applied: the approximations never form the
    probability matrix (the same choice as the official MRA/YOSO/Nystromformer code).

    A layer that attends within a sliding window (``architectures.is_windowed``) runs the model's own
    attention, SDPA, on the windowed mask (``key_padding_mask_function``). Grouped k and v heads
    (EuroBERT's, UltraBERT's) are repeated to q's, as Transformers' own functions do.
    """
    if is_windowed(module):
        if getattr(module, METHOD_ATTRIBUTE, None) is not None:
            raise ValueError("an efficient method cannot run on a sliding-window layer: it would drop the window")
        attention_mask = windowed_mask_of_packed_rows(attention_mask, query.shape[0], query.shape[2], kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise ValueError(
            f"{type(module).__name__} was called with sliding_window={kwargs['sliding_window']}, but it was not "
            "a sliding-window layer when the model was patched; an efficient method cannot honour a window"
        )
    name = method_named_by(requested_attn_implementation(module.config))  # the name dispatched under
    method = getattr(module, METHOD_ATTRIBUTE, None)
    if method is None or method.name != name:
        method = _plain_transformers_method(module, name)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each k, v head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    standard = query.shape[-1] ** -0.5
    if scaling is not None and scaling != standard:
        # ESM scales q before its rotary positions and passes scaling=1: the same q.k products, handed to
        # the method as unscaled q with the standard scaling, so that methods which split the scale
        # between q and k (Performer's and Skyformer's kernels) see what they see in every other model.
        query, scaling = query * (scaling / standard), standard
    batch, _, seq_len, _ = query.shape
    key_padding_mask = key_padding_mask_from(attention_mask, batch, seq_len)
    if SEGMENTS_KEYWORD in kwargs:  # worked out once by the patched model (patching.py)
        segments = kwargs[SEGMENTS_KEYWORD]
    else:
        segments = packed_segments(kwargs, key_padding_mask, batch, seq_len, group=groups_by_length(method))
    if segments is not None:  # several sequences in a row: each attends to itself only (packing.py)
        if getattr(method, RETURN_PROBABILITIES, False):
            raise ValueError("output_attentions=True is not supported for packed rows (several sequences in a row)")
        return attend_packed(method, segments, query, key, value, scaling).transpose(1, 2).contiguous(), None
    out = method(query, key, value, key_padding_mask, scaling)
    weights = None
    if getattr(method, RETURN_PROBABILITIES, False):  # output_attentions=True (patching.py)
        weights = method.probabilities(query, key, key_padding_mask, query.shape[-1] ** -0.5 if scaling is None else scaling)
    return out.transpose(1, 2).contiguous(), weights


def windowed_mask_of_packed_rows(
    attention_mask: torch.Tensor | None, batch: int, seq_len: int, kwargs: dict[str, Any]
) -> torch.Tensor | None:
    """The (B, 1, N, N) mask of a sliding-window layer (``attention_mask``, SDPA's windowed mask or None)
    restricted, in packed rows, to each token's own sequence: a window that would reach into the next
    sequence stops at its end, as it does for the sequence alone. Unchanged for one sequence a row."""
    if SEGMENTS_KEYWORD in kwargs:  # worked out once by the patched model (None: one sequence a row)
        segments = kwargs[SEGMENTS_KEYWORD]
    else:  # a token is real where it may attend to itself: the diagonal of the windowed mask
        real = None if attention_mask is None else kept(attention_mask)[:, 0].expand(-1, seq_len, -1).diagonal(dim1=-2, dim2=-1)
        segments = packed_segments(kwargs, real, batch, seq_len, group=False)
    if segments is None:
        return attention_mask
    sequence = segments.sequence.view(batch, 1, seq_len)
    same_sequence = sequence[..., :, None] == sequence[..., None, :]
    return same_sequence if attention_mask is None else kept(attention_mask) & same_sequence


def key_padding_mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    mask_function: Callable = bidirectional_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """``AttentionMaskInterface`` function: a (B, 1, 1, N) bool key-padding mask, or None.

    Without a registered mask function Transformers would silently pass no padding mask to
    a custom attention name. Packed rows without a padding mask (the mask Transformers builds from
    restarting ``position_ids``) need none: the attention function keeps their sequences apart itself.
    The mask of sliding-window layers (``local_size``) is SDPA's, for the model's own attention they run.
    """
    config = kwargs.get("config")
    if config is not None and not is_tracing() and not dispatches_attention(type(config)):
        # MPNet, BigBird: their masks come from here, their attention is their own
        refusal = dispatch_refusal(config, method_named_by(requested_attn_implementation(config)))
        if refusal is not None:
            raise ValueError(refusal)
    if kwargs.get("local_size") is not None:
        return sdpa_mask(batch_size, q_length, kv_length, mask_function=mask_function, attention_mask=attention_mask, **kwargs)
    packed = attention_mask is None and is_packed_bidirectional_mask(mask_function)
    if (mask_function is not bidirectional_mask_function and not packed) or q_length != kv_length:
        raise ValueError(
            "efficient attention methods support bidirectional self-attention with a key-padding mask only; "
            "causal, cross-attention and custom masks are not supported"
        )
    if attention_mask is None or (not is_tracing() and bool(attention_mask.all())):
        return None
    return attention_mask[:, None, None, -kv_length:].to(torch.bool)


def one_row_per_sequence(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
    """Forward hook (``with_kwargs``) of the encoder of a sequence-level model (``patching.py``): the
    last hidden states of packed rows become one row per sequence, so that the head, which reads
    each row's first token (BERT's pooler, RoBERTa's classifier), reads every sequence's. Where the
    hooked module pools itself (GTE, NomicBERT: models without an ``encoder``), its pooler runs
    again on those rows. A head that averages each row's tokens is refused: it would average the
    padding of the rows it gets."""
    hidden = output.last_hidden_state
    batch, seq_len, _ = hidden.shape
    if SEGMENTS_KEYWORD in kwargs:
        segments = kwargs[SEGMENTS_KEYWORD]
    elif module.config.model_type == "longformer":  # set for the call by the patched model (patching.py)
        segments = getattr(module, SEGMENTS_KEYWORD, None)
    else:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        segments = packed_segments(kwargs, key_padding_mask_from(mask, batch, seq_len), batch, seq_len)
    if segments is not None:
        refusal = packed_pooling_refusal(module.config)
        if refusal is not None:
            raise ValueError(f"packed rows: {refusal}")
        output.last_hidden_state = segments.in_order().unpack_tokens(hidden)[0]
        if getattr(output, "pooler_output", None) is not None:
            output.pooler_output = module.pooler(output.last_hidden_state)
    return output


def register_with_transformers(name: str) -> None:
    """Make ``attn_implementation=name`` work in plain Transformers, under the bare name and the
    name saved in config.json (``registry.saved_attn_implementation``)."""
    for key in (name, saved_attn_implementation(name)):
        AttentionInterface.register(key, efficient_attention_forward)
        AttentionMaskInterface.register(key, key_padding_mask_function)


def self_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a supported model, in layer order (a module shared by several
    layers, ALBERT's, once): Longformer's attention class, else every module that dispatches its
    attention (``architectures.dispatches``). ``ValueError`` for a model with none, or a causal one."""
    config = model.config
    check_supported(config, getattr(config, "attn_impl", None) or "any")
    modules = [
        m
        for m in model.modules()
        if isinstance(m, (LongformerSelfAttention, EfficientLongformerSelfAttention)) or dispatches(type(m))
    ]
    if not modules:
        raise ValueError(f"found no attention module in {type(model).__name__} that dispatches through AttentionInterface")
    causal = [type(m).__name__ for m in modules if is_causal(m)]
    if causal:
        raise ValueError(
            f"{type(model).__name__} has causal (decoder) self-attention ({causal[0]}); efficient attention methods "
            "support bidirectional encoder self-attention only"
        )
    return modules


def method_modules(model: nn.Module) -> list[AttentionMethod]:
    """The method modules of a (patched) model, in layer order; empty for an unpatched one."""
    return [m for m in model.modules() if isinstance(m, AttentionMethod)]


on_register(register_with_transformers)
