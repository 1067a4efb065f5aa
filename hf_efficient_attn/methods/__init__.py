"""Attention methods; importing this package registers every method."""

from . import informer, linformer, mra, nystromformer, performer, skeinformer, skyformer, softmax, yoso  # noqa: F401
