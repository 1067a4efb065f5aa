"""hf_efficient_attn: efficient self-attention for Hugging Face Transformers encoders.

``import hf_efficient_attn`` registers every method with Transformers, so that
``transformers.AutoModel.from_pretrained(p, attn_implementation="mra2")`` also works for
parameter-free methods.
"""

from . import methods  # noqa: F401  (registers the methods; must come before the bridge)
from .auto import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from .bridge import patch_model
from .long import extend_position_embeddings
from .presets import load_preset
from .registry import efficient_attention, list_methods, method_options, register_method

__all__ = [
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "efficient_attention",
    "extend_position_embeddings",
    "list_methods",
    "load_preset",
    "method_options",
    "patch_model",
    "register_method",
]
