"""The bridge to Transformers: registered attention/mask functions and ``patch_model``.

BERT-style models dispatch self-attention through ``ALL_ATTENTION_FUNCTIONS`` by
``config._attn_implementation``; every method name is registered there together with a
mask function, so the layer's method module (attached by :func:`patch_model` as
``self_attention.efficient_attn``) receives a key-padding mask. Longformer has its own
attention class and gets a subclass instead (see ``longformer.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function

from .long import install_length_check
from .longformer import EfficientLongformerSelfAttention
from .methods.base import AttentionMethod, AttentionShape
from .registry import build_method, get_method_class, list_methods, resolve_options

#: model_type -> class name of its self-attention module (adding an architecture is one line).
SELF_ATTENTION_CLASSES: dict[str, str] = {
    "bert": "BertSelfAttention",
    "roberta": "RobertaSelfAttention",
    "xlm-roberta": "XLMRobertaSelfAttention",
    "electra": "ElectraSelfAttention",
    "camembert": "CamembertSelfAttention",
    "longformer": "LongformerSelfAttention",
}

METHOD_ATTRIBUTE = "efficient_attn"


def _lazy_method(module: nn.Module) -> AttentionMethod:
    """The method of a layer loaded by plain Transformers (``attn_implementation=name``).

    Only parameter-free methods can be built here: learnable ones need ``patch_model`` so
    that their parameters exist before weights load and are saved with the model.
    """
    config = module.config
    name = config._attn_implementation
    cached = module.__dict__.get("_hea_lazy_method")
    if cached is not None and cached.name == name:
        return cached
    options = config.attn_config if getattr(config, "attn_impl", None) == name else None
    method = build_method(name, options, _layer_shape(config, getattr(module, "layer_idx", None) or 0))
    if any(True for _ in method.parameters()):
        raise ValueError(
            f"attention method {name!r} with options {method.options.to_dict()} has learnable parameters; "
            "load the model with hf_efficient_attn.AutoModel*.from_pretrained(..., attn_impl=...) or "
            "hf_efficient_attn.patch_model(model, ...) instead of attn_implementation=..."
        )
    module.__dict__["_hea_lazy_method"] = method  # not a submodule: nothing to save
    return method


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
    keep = attention_mask if attention_mask.dtype == torch.bool else attention_mask > torch.finfo(attention_mask.dtype).min / 2
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
    """``AttentionInterface`` function: q, k, v (B, H, N, D) -> ((B, N, H, D), None).

    Attention-probability dropout is not applied: the approximations never form the
    probability matrix (the same choice as the official MRA/YOSO/Nystromformer code).
    """
    method = getattr(module, METHOD_ATTRIBUTE, None) or _lazy_method(module)
    batch, _, seq_len, _ = query.shape
    out = method(query, key, value, key_padding_mask_from(attention_mask, batch, seq_len), scaling)
    return out.transpose(1, 2).contiguous(), None


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
    a custom attention name.
    """
    if mask_function is not bidirectional_mask_function or q_length != kv_length:
        raise ValueError(
            "efficient attention methods support bidirectional self-attention with a key-padding mask only; "
            "causal, cross-attention and custom masks are not supported"
        )
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask[:, None, None, -kv_length:].to(torch.bool)


def register_with_transformers(name: str) -> None:
    """Make ``attn_implementation=name`` work in plain Transformers."""
    AttentionInterface.register(name, efficient_attention_forward)
    AttentionMaskInterface.register(name, key_padding_mask_function)


def _layer_shape(config: Any, layer_idx: int) -> AttentionShape:
    heads = config.num_attention_heads
    return AttentionShape(heads, config.hidden_size // heads, config.max_position_embeddings, layer_idx)


def self_attention_modules(model: nn.Module) -> list[nn.Module]:
    model_type = model.config.model_type
    if model_type not in SELF_ATTENTION_CLASSES:
        raise ValueError(
            f"unsupported model type {model_type!r}; supported: {', '.join(sorted(SELF_ATTENTION_CLASSES))}"
        )
    class_name = SELF_ATTENTION_CLASSES[model_type]
    modules = [m for m in model.modules() if type(m).__name__ == class_name or isinstance(m, EfficientLongformerSelfAttention)]
    if not modules:
        raise ValueError(f"found no {class_name} module in {type(model).__name__}")
    return modules


def patch_model(
    model: PreTrainedModel, attn_impl: str = "mra2", attn_config: dict[str, Any] | None = None
) -> PreTrainedModel:
    """Replace the self-attention of ``model`` by method ``attn_impl``, in place.

    Each layer gets its own method module (``<self-attention>.efficient_attn``); the choice is
    recorded in ``config.attn_impl`` / ``config.attn_config`` so that ``save_pretrained``
    writes it and :mod:`hf_efficient_attn.auto` restores it.
    """
    config = model.config
    get_method_class(attn_impl)  # unknown name -> ValueError listing the known ones
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise ValueError(
            f"attention method {attn_impl!r} supports bidirectional encoder self-attention only; "
            "this model is configured as a decoder (is_decoder / add_cross_attention)"
        )
    options = resolve_options(attn_impl, attn_config)
    modules = self_attention_modules(model)
    first: AttentionMethod | None = None
    for layer_idx, module in enumerate(modules):
        if type(module).__name__ == "LongformerSelfAttention":
            module.__class__ = EfficientLongformerSelfAttention  # same parameters, same state-dict keys
        method = build_method(attn_impl, options.to_dict(), _layer_shape(config, layer_idx))
        param = next(module.parameters())
        method.to(device=param.device, dtype=param.dtype)
        if first is None:
            first = method
        else:
            method.share_from(first)
        setattr(module, METHOD_ATTRIBUTE, method)
    config.attn_impl = attn_impl
    config.attn_config = options.to_dict()
    if config.model_type != "longformer":
        model.set_attn_implementation(attn_impl)
    install_length_check(model)
    return model


for _name in list_methods():
    register_with_transformers(_name)
