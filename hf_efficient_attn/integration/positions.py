"""Longer inputs: the position table stretched by copying (the Longformer recipe), and the
longest input a model's table allows (patched models check it on every call, ``patching.py``)."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from .bridge import method_modules

#: Models whose position ids start after the padding index (RoBERTa's offset of pad_token_id + 1).
OFFSET_POSITION_MODELS = {"roberta", "xlm-roberta", "camembert", "longformer"}


def position_offset(config: Any) -> int:
    return config.pad_token_id + 1 if config.model_type in OFFSET_POSITION_MODELS else 0


def max_tokens(config: Any) -> int:
    """The longest input the position table allows."""
    return config.max_position_embeddings - position_offset(config)


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


def extend_position_embeddings(model: PreTrainedModel, max_length: int = 4096) -> PreTrainedModel:
    """Stretch the position table to ``max_length`` tokens, in place, by repeating the
    pretrained table (Beltagy et al. 2020, section 5: "copy the 512 position embeddings
    multiple times"). Special leading rows (RoBERTa's padding offset) are kept once."""
    max_length = check_max_length(max_length)
    config = model.config
    offset = position_offset(config)
    for method in (m for m in method_modules(model) if m.length_bound):
        if method.shape.max_seq_len < max_length + offset:
            raise ValueError(
                f"{method.name}'s parameters are sized by the position table when the model is patched; "
                f"extend the position embeddings first, then patch (or load) the model with attn_impl={method.name!r}"
            )
    old = _embeddings(model).position_embeddings
    old_len = old.num_embeddings - offset
    if max_length <= old_len:
        raise ValueError(f"max_length must exceed the current {old_len} positions, got {max_length}")
    new = nn.Embedding(max_length + offset, old.embedding_dim, padding_idx=old.padding_idx)
    new.to(device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        new.weight[:offset] = old.weight[:offset]
        repeats = -(-max_length // old_len)
        new.weight[offset:] = old.weight[offset:].repeat(repeats, 1)[:max_length]
    embeddings = _embeddings(model)
    embeddings.position_embeddings = new
    total = max_length + offset
    embeddings.position_ids = torch.arange(total, device=old.weight.device).expand(1, -1)
    if hasattr(embeddings, "token_type_ids"):
        embeddings.token_type_ids = torch.zeros(1, total, dtype=torch.long, device=old.weight.device)
    config.max_position_embeddings = total
    for method in (m for m in method_modules(model) if not m.length_bound):
        method.set_max_seq_len(total)  # eval draws tied to positions cover the new ones, as a reload draws them
    return model
