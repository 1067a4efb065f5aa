"""hf_efficient_attn: efficient self-attention for Hugging Face Transformers encoders."""

from . import methods  # noqa: F401  (registers the methods)
from .registry import efficient_attention, list_methods, method_options, register_method

__all__ = ["efficient_attention", "list_methods", "method_options", "register_method"]
