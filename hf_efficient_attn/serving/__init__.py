"""Serving a variant outside PyTorch: ONNX export validated with ONNX Runtime (:mod:`.onnx`), and texts
encoded by the export (:mod:`.encoding`)."""

from .encoding import encode
from .onnx import export_folder, export_onnx, validate

__all__ = ["encode", "export_folder", "export_onnx", "validate"]
