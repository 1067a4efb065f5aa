"""Longer inputs: learned position tables stretched by copying (the Longformer recipe), rotary
positions by raising their limit (optionally with a RoPE scaling); the longest input a model allows is
``architectures.max_tokens`` (patched models check it on every call, ``patching.py``)."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from .architectures import has_rotary_positions, max_tokens, position_offset
from .bridge import method_modules

#: The RoPE scalings ``extend_position_embeddings`` offers: Transformers' rope types
#: (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``) that need no parameter but the factor, the new length
#: over the old (kept as ``original_max_position_embeddings``). Both change the outputs at every length;
#: without one, an input that fit before gives the same outputs after. Not "dynamic": Transformers' dynamic
#: NTK scales only past ``max_position_embeddings``, which stretching raises to the new length.
ROPE_SCALINGS = ("linear", "yarn")

__all__ = ["ROPE_SCALINGS", "check_max_length", "extend_position_embeddings", "max_tokens", "position_offset"]


def check_max_length(max_length: Any) -> int:
    """``max_length`` as an ``int``; ``ValueError`` unless it is a positive integer (bools,
    floats and strings are refused rather than truncated or parsed)."""
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length <= 0:
        raise ValueError(f"max_length must be a positive integer (a number of tokens), got {max_length!r}")
    return int(max_length)


def _embeddings(model: PreTrainedModel) -> nn.Module:
    embeddings = getattr(model.base_model, "embeddings", None)
    if embeddings is None or not hasattr(embeddings, "position_embeddings"):
        raise ValueError(f"{type(model).__name__} has no learned absolute position embeddings to extend")
    return embeddings


def extend_position_embeddings(
    model: PreTrainedModel, max_length: int = 4096, rope_scaling: str | None = None
) -> PreTrainedModel:
    """Let ``model`` take inputs of up to ``max_length`` tokens, in place.

    A learned position table is stretched by repeating the pretrained one (Beltagy et al. 2020,
    section 5: "copy the 512 position embeddings multiple times"; special leading rows, RoBERTa's
    padding offset, kept once). Rotary positions need no table: their limit is raised, and
    ``rope_scaling`` (one of :data:`ROPE_SCALINGS`, rotary models only) rescales them by the new length
    over the old (the new config's ``rope_parameters`` records it)."""
    max_length = check_max_length(max_length)
    config = model.config
    rotary = has_rotary_positions(config)
    if rope_scaling is not None and (not rotary or rope_scaling not in ROPE_SCALINGS):
        allowed = f"one of {', '.join(ROPE_SCALINGS)}" if rotary else "None: this model's positions are a learned table"
        raise ValueError(f"rope_scaling must be {allowed}, got {rope_scaling!r}")
    offset = position_offset(config)
    old_len = max_tokens(config)
    if max_length <= old_len:
        raise ValueError(f"max_length must exceed the current {old_len} positions, got {max_length}")
    for method in (m for m in method_modules(model) if m.length_bound):
        if method.shape.max_seq_len < max_length + offset:
            raise ValueError(
                f"{method.name}'s parameters are sized by the position table when the model is patched; "
                f"extend the position embeddings first, then patch (or load) the model with attn_impl={method.name!r}"
            )
    if rotary:
        if rope_scaling is not None:
            _scale_rotary_positions(model, rope_scaling, max_length / old_len, old_len)
    else:
        _copy_position_table(model, max_length, offset)
    config.max_position_embeddings = max_length + offset
    for method in (m for m in method_modules(model) if not m.length_bound):
        method.set_max_seq_len(max_length + offset)  # eval draws tied to positions cover the new ones, as a reload draws them
    return model


def _copy_position_table(model: PreTrainedModel, max_length: int, offset: int) -> None:
    embeddings = _embeddings(model)
    old = embeddings.position_embeddings
    old_len = old.num_embeddings - offset
    new = nn.Embedding(max_length + offset, old.embedding_dim, padding_idx=old.padding_idx)
    new.to(device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        new.weight[:offset] = old.weight[:offset]
        repeats = -(-max_length // old_len)
        new.weight[offset:] = old.weight[offset:].repeat(repeats, 1)[:max_length]
    embeddings.position_embeddings = new
    total = max_length + offset
    for name in ("position_ids", "token_type_ids"):  # buffers as long as the table
        buffer = getattr(embeddings, name, None)
        if isinstance(buffer, torch.Tensor):
            fill = torch.arange(total) if name == "position_ids" else torch.zeros(total, dtype=buffer.dtype)
            setattr(embeddings, name, fill.to(buffer.device).expand(1, -1))


def _scale_rotary_positions(model: PreTrainedModel, rope_scaling: str, factor: float, old_len: int) -> None:
    """Record the scaling in ``config.rope_parameters`` (per layer type where the model keeps one per
    type, ModernBERT's and UltraBERT's) and rebuild the rotary modules from it."""
    config = model.config
    parameters = getattr(config, "rope_parameters", None)
    if parameters is None:  # ESM's rotary module takes no rope parameters
        raise ValueError(f"rope_scaling: {config.model_type}'s rotary positions take no RoPE scaling in Transformers")
    scaled = {"rope_type": rope_scaling, "factor": factor, "original_max_position_embeddings": old_len}
    if all(isinstance(value, dict) for value in parameters.values()):
        config.rope_parameters = {layer_type: {**value, **scaled} for layer_type, value in parameters.items()}
    else:
        config.rope_parameters = {**parameters, **scaled}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding"):
                buffer = next(child.buffers())
                setattr(parent, name, type(child)(config).to(buffer.device))
