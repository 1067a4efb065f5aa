"""hf_efficient_attn: efficient self-attention for Hugging Face Transformers encoders.

``import hf_efficient_attn`` registers every method with Transformers, so that
``transformers.AutoModel.from_pretrained(p, attn_implementation="mra2")`` also works for
parameter-free methods.
"""

__version__ = "0.2.0"

from . import methods  # noqa: F401,E402  (registers the methods; must come before the bridge)
from .integration.auto import (  # noqa: E402
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from .integration.patching import modules_to_save, patch_model, unpatch_model  # noqa: E402
from .integration.positions import extend_position_embeddings  # noqa: E402
from .presets import load_preset  # noqa: E402
from .registry import efficient_attention, list_methods, method_options, register_method  # noqa: E402

__all__ = [
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForPreTraining",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "__version__",
    "efficient_attention",
    "extend_position_embeddings",
    "list_methods",
    "load_preset",
    "method_options",
    "modules_to_save",
    "patch_model",
    "register_method",
    "unpatch_model",
]
