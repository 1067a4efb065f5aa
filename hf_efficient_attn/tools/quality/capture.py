"""Real query/key/value projections of every self-attention layer of a pretrained encoder."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import nn

from ...integration.bridge import self_attention_modules
from ...integration.positions import extend_position_embeddings, max_tokens
from ...tasks.common.corpus import wikipedia_articles


def tokenize_windows(tokenizer: Any, texts: Sequence[str], seq_len: int) -> tuple[torch.Tensor, list[int]]:
    """Input ids (B, seq_len) of the texts that fill ``seq_len`` tokens (no padding), truncated;
    and the indices of the texts used."""
    ids, used = [], []
    for index, text in enumerate(texts):
        # Truncation keeps the special tokens: [CLS] first seq_len - 2 word pieces [SEP].
        encoded = tokenizer(text, truncation=True, max_length=seq_len)["input_ids"]
        if len(encoded) == seq_len:
            ids.append(encoded)
            used.append(index)
    if not ids:
        raise ValueError(f"no text has {seq_len} tokens or more; pass longer texts (e.g. wikipedia_articles(2000))")
    return torch.tensor(ids), used


def capture_qkv(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    seq_len: int,
    *,
    batch_size: int = 1,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Real (q, k, v) of every self-attention layer, each (B, H, seq_len, D), float32.

    ``model`` runs with its own (exact) attention in eval mode on the first ``seq_len`` tokens
    of each text long enough to fill them (shorter texts are skipped, so there is no padding).
    If ``seq_len`` exceeds the position table, a copy of the model with the table tiled to
    ``seq_len`` (Longformer recipe) is used instead; ``model`` itself is not changed.
    """
    if seq_len > max_tokens(model.config):
        model = extend_position_embeddings(copy.deepcopy(model), max_length=seq_len)
    input_ids, _ = tokenize_windows(tokenizer, texts, seq_len)
    modules = self_attention_modules(model)
    num_heads = model.config.num_attention_heads
    captured: list[dict[str, list[torch.Tensor]]] = [{"query": [], "key": [], "value": []} for _ in modules]

    def hook_for(layer: int, name: str):
        def hook(_module, _inputs, output):
            batch, length, width = output.shape
            heads = output.detach().float().view(batch, length, num_heads, width // num_heads).transpose(1, 2)
            captured[layer][name].append(heads.contiguous())

        return hook

    handles = [
        getattr(module, name).register_forward_hook(hook_for(layer, name))
        for layer, module in enumerate(modules)
        for name in ("query", "key", "value")
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(input_ids), batch_size):
                chunk = input_ids[start : start + batch_size]
                model(input_ids=chunk, attention_mask=torch.ones_like(chunk))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [tuple(torch.cat(layer[name]) for name in ("query", "key", "value")) for layer in captured]


def long_articles(tokenizer: Any, seq_len: int, count: int) -> list[tuple[str, str]]:
    """The first ``count`` Wikipedia articles (title, text) with at least ``seq_len`` tokens."""
    chosen = []
    for title, text in wikipedia_articles(min_words=seq_len // 2, with_titles=True):
        if len(tokenizer(text, truncation=True, max_length=seq_len)["input_ids"]) == seq_len:
            chosen.append((title, text))
            if len(chosen) == count:
                break
    if len(chosen) < count:
        raise ValueError(f"only {len(chosen)} articles have {seq_len} tokens; lower --num_texts or --seq_lens")
    return chosen
