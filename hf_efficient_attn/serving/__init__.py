"""Serving a variant outside PyTorch: ONNX export validated with ONNX Runtime (:mod:`.onnx`)."""

from .onnx import export_folder, export_onnx, validate

__all__ = ["export_folder", "export_onnx", "validate"]
