"""Attention methods; importing this package registers every method."""

from . import softmax  # noqa: F401
