"""Name -> method registry, option resolution and the functional entry point."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .methods.base import AttentionMethod, AttentionShape, MethodOptions

_METHODS: dict[str, type[AttentionMethod]] = {}
#: Called with the name of every method registered, including those registered before the
#: listener (the bridge registers each name with Transformers this way).
_LISTENERS: list[Callable[[str], None]] = []
#: Seed of the initialisation of learnable methods in :func:`efficient_attention`.
FUNCTIONAL_INIT_SEED = 0


def register_method(cls: type[AttentionMethod]) -> type[AttentionMethod]:
    """Class decorator: make ``cls`` available under ``cls.name`` (also to Transformers'
    ``attn_implementation=``, even when registered after ``import hf_efficient_attn``)."""
    _METHODS[cls.name] = cls
    for listener in _LISTENERS:
        listener(cls.name)
    return cls


def on_register(listener: Callable[[str], None]) -> None:
    """Call ``listener(name)`` for every registered method, now and in the future."""
    _LISTENERS.append(listener)
    for name in list_methods():
        listener(name)


def list_methods() -> list[str]:
    """Sorted names of every registered method."""
    return sorted(_METHODS)


def get_method_class(name: str) -> type[AttentionMethod]:
    if not isinstance(name, str) or name not in _METHODS:
        raise ValueError(f"unknown attention method {name!r}; known methods: {', '.join(list_methods())}")
    return _METHODS[name]


def method_options(name: str) -> dict[str, Any]:
    """Option names of method ``name`` with their defaults."""
    return get_method_class(name).options_cls().to_dict()


def resolve_options(
    name: str, overrides: dict[str, Any] | None = None, base: dict[str, Any] | None = None
) -> MethodOptions:
    """Defaults of ``name`` updated by ``base`` (e.g. saved options), then by ``overrides``;
    validated; unknown keys or a non-dict raise ``ValueError``."""
    options_cls = get_method_class(name).options_cls
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(
            f"attn_config must be a dict of option names to values (or None), got {type(overrides).__name__} "
            f"{overrides!r}; the options of {name!r} are: {method_options(name)}"
        )
    overrides = {**(base or {}), **(overrides or {})}
    known = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; its options are: {known}")
    return options_cls(**overrides)  # validates on construction


def build_method(name: str, attn_config: dict[str, Any] | None, shape: AttentionShape) -> AttentionMethod:
    """A method module for one attention layer."""
    return get_method_class(name)(resolve_options(name, attn_config), shape)


def efficient_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    /,
    method: str = "mra2",
    key_padding_mask: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """Attention of unscaled q, k, v (B, H, N, D) by ``method``; returns (B, H, N, D).

    q, k, v are positional, so every option name is free (Linformer's ``k=``). A fresh method
    module is built for the call, in eval mode, so sampling methods are reproducible for a given
    ``seed``, and learnable methods (Linformer) use their initialisation drawn with a fixed seed
    (identical calls give identical outputs; the global RNG is left untouched).
    """
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim), got q of shape {tuple(q.shape)}")
    shape = AttentionShape(num_heads=q.shape[1], head_dim=q.shape[-1], max_seq_len=q.shape[2])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FUNCTIONAL_INIT_SEED)
        module = build_method(method, options, shape)
    module = module.to(q.device).eval()
    return module(q, k, v, key_padding_mask, q.shape[-1] ** -0.5)
