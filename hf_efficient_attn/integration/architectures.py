"""Which encoders a method can run in, found from the model itself, and the facts about positions
that stretching and the length check need (docs/architectures.md: the table of tested architectures).

A model is supported when Transformers runs its self-attention through ``AttentionInterface``: its
class declares ``_supports_attention_backend`` and its attention modules look up the function to call
by ``config._attn_implementation`` (``ALL_ATTENTION_FUNCTIONS``), so that the bridge receives q, k, v
as the model made them (rotary positions applied, its own scaling). Longformer, with an attention
class of its own, is the one architecture supported by name (``longformer.py``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import transformers
from torch import nn

#: The architectures the tests run every method in (docs/architectures.md); their Transformers classes
#: are registered with the auto classes on import (``auto.py``), so that plain Transformers reloads a
#: saved variant of them as itself. Any other encoder that dispatches its attention is patched too.
TESTED_ARCHITECTURES: tuple[str, ...] = (
    "bert",
    "roberta",
    "xlm-roberta",
    "electra",
    "camembert",
    "longformer",
    "distilbert",
    "albert",
    "xlm-roberta-xl",
    "ernie",
    "roberta-prelayernorm",
    "data2vec-text",
    "modernbert",
    "gte",
    "nomic_bert",
    "eurobert",
    "jina_embeddings_v3",
    "ultrabert",
    "esm",
)
#: Encoders whose learned position ids start after the padding index (RoBERTa's ``pad_token_id + 1``;
#: ESM's absolute positions too, ESM-1b's).
OFFSET_POSITION_MODELS = frozenset(
    {"roberta", "xlm-roberta", "camembert", "longformer", "xlm-roberta-xl", "roberta-prelayernorm", "data2vec-text", "esm"}
)
#: The lookup an attention module's forward makes when it dispatches (Transformers' own test of a
#: model's modelling code, ``PreTrainedModel._can_set_attn_implementation``, reads the source so too).
_DISPATCH = "ALL_ATTENTION_FUNCTIONS.get_interface("


def has_rotary_positions(config: Any) -> bool:
    """Whether the model places tokens by rotating q and k (RoPE) rather than by a learned table."""
    return getattr(config, "rope_parameters", None) is not None or getattr(config, "position_embedding_type", None) == "rotary"


def position_offset(config: Any) -> int:
    """The first position id of a sequence: ``pad_token_id + 1`` for learned tables of the RoBERTa family."""
    if has_rotary_positions(config) or config.model_type not in OFFSET_POSITION_MODELS:
        return 0
    return config.pad_token_id + 1


def max_tokens(config: Any) -> int:
    """The longest input the model's positions allow (its table, or the length its rotary positions
    were trained to)."""
    return config.max_position_embeddings - position_offset(config)


def _model_class(auto_class: type, config_class: type) -> type | None:
    """The class ``auto_class`` builds for this config class's architecture (None if it has none)."""
    mapping = auto_class._model_mapping
    return mapping[config_class] if config_class in mapping else None


def is_decoder_only(config: Any) -> bool:
    """A decoder architecture: Transformers gives it a causal-LM head and no masked-LM one (GPT-2, Llama)."""
    return (
        _model_class(transformers.AutoModelForMaskedLM, type(config)) is None
        and _model_class(transformers.AutoModelForCausalLM, type(config)) is not None
    )


@functools.cache
def dispatches_attention(config_class: type) -> bool:
    """Whether the base model of this config class runs its attention through ``AttentionInterface``
    (looked up once a class: the mask function asks on every call)."""
    return getattr(_model_class(transformers.AutoModel, config_class), "_supports_attention_backend", False)


def dispatch_refusal(config: Any, attn_impl: str) -> str | None:
    """Why method ``attn_impl`` cannot run in models of ``config``'s architecture, or None if it can."""
    if config.model_type == "longformer":
        return None
    if not dispatches_attention(type(config)):
        return (
            f"attention method {attn_impl!r}: model type {config.model_type!r} computes its attention itself, "
            "not through Transformers' AttentionInterface (as DeBERTa's disentangled "
            "attention, MPNet's relative bias and BigBird's block-sparse attention do), so no method can replace "
            f"it; supported: encoders that dispatch, e.g. {', '.join(TESTED_ARCHITECTURES)}"
        )
    if is_decoder_only(config):
        what = f"{config.model_type!r} is a decoder"
    elif getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        what = "this model is configured as a decoder (is_decoder / add_cross_attention)"
    else:
        return None
    return f"attention method {attn_impl!r} supports bidirectional encoder self-attention only; {what}"


@functools.cache
def dispatches(module_class: type) -> bool:
    """Whether modules of this class call the attention function their config names."""
    forward = getattr(module_class, "forward", None)
    try:
        source = inspect.getsource(inspect.unwrap(forward))
    except (OSError, TypeError):  # no source (a builtin, a compiled extension): not Transformers' dispatch
        return False
    return _DISPATCH in source


def is_windowed(module: nn.Module) -> bool:
    """Whether an attention module attends within a sliding window (ModernBERT's and UltraBERT's local
    layers): it keeps the model's own attention, already linear in the length."""
    return getattr(module, "sliding_window", None) is not None


def is_causal(module: nn.Module) -> bool:
    return bool(getattr(module, "is_causal", False))


#: The ``config.classifier_pooling`` values (ModernBERT's, EuroBERT's, UltraBERT's) of heads that read
#: each row's first token, which packed rows can serve (``one_row_per_sequence``).
FIRST_TOKEN_POOLING = ("cls", "bos")


def packed_pooling_refusal(config: Any) -> str | None:
    """Why a sequence classifier of ``config`` cannot take packed rows (its head averages each row's
    tokens), or None."""
    pooling = getattr(config, "classifier_pooling", "cls")
    if pooling in FIRST_TOKEN_POOLING:
        return None
    return (
        f"classifier_pooling={pooling!r} averages each row's tokens, not each sequence's; use one sequence a row, "
        f"or a head that reads the first token (classifier_pooling {' or '.join(map(repr, FIRST_TOKEN_POOLING))})"
    )
