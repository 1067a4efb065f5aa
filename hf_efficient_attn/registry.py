"""Name -> method registry, option resolution and the functional entry point."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .methods.base import AttentionMethod, AttentionShape, MethodOptions

_METHODS: dict[str, type[AttentionMethod]] = {}


def register_method(cls: type[AttentionMethod]) -> type[AttentionMethod]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    _METHODS[cls.name] = cls
    return cls


def list_methods() -> list[str]:
    """Sorted names of every registered method."""
    return sorted(_METHODS)


def get_method_class(name: str) -> type[AttentionMethod]:
    if name not in _METHODS:
        raise ValueError(f"unknown attention method {name!r}; known methods: {', '.join(list_methods())}")
    return _METHODS[name]


def method_options(name: str) -> dict[str, Any]:
    """Option names of method ``name`` with their defaults."""
    return get_method_class(name).options_cls().to_dict()


def resolve_options(name: str, overrides: dict[str, Any] | None = None) -> MethodOptions:
    """Defaults of ``name`` updated by ``overrides``, validated; unknown keys raise ``ValueError``."""
    options_cls = get_method_class(name).options_cls
    overrides = dict(overrides or {})
    known = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; its options are: {known}")
    options = options_cls(**overrides)
    options.validate()
    return options


def build_method(name: str, attn_config: dict[str, Any] | None, shape: AttentionShape) -> AttentionMethod:
    """A method module for one attention layer."""
    return get_method_class(name)(resolve_options(name, attn_config), shape)


def efficient_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    method: str = "mra2",
    key_padding_mask: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """Attention of unscaled q, k, v (B, H, N, D) by ``method``; returns (B, H, N, D).

    A fresh method module is built for the call, in eval mode, so sampling methods are
    reproducible for a given ``seed`` and learnable methods use their initialisation.
    """
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim), got q of shape {tuple(q.shape)}")
    shape = AttentionShape(num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2])
    module = build_method(method, options, shape).to(q.device).eval()
    return module(q, k, v, key_padding_mask, q.shape[-1] ** -0.5)
