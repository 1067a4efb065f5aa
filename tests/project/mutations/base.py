"""What a mutation is, and the path prefixes the lists use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """Replace ``original`` (a substring found exactly once in ``path``) by ``replacement``; the
    pytest node ids or ``file::-k expression`` in ``tests`` must then fail."""

    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    bug: str
    slow: bool = False


P = "hf_efficient_attn/"
T = "tests/"
