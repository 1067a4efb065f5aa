"""Patching a model: ``patch_model`` / ``unpatch_model`` and the efficient model classes.

A patched model is an instance of an *efficient subclass* of its Transformers class (same name,
defined in this module, built on demand), which

- builds the method modules in ``__init__`` when ``config.attn_impl`` names a method, so that
  ``from_pretrained`` loads the method's parameters (Linformer's projections) as ordinary weights
  and Transformers reports the missing ones as newly initialised, like any new head;
- initialises method parameters missing from a checkpoint in ``initialize_weights``;
- keeps ``config.attn_impl`` true to what runs: ``set_attn_implementation("sdpa")`` unpatches,
  ``set_attn_implementation("yoso")`` re-patches.

``patch_model`` on an already-built model swaps its class to the efficient subclass (as
BetterTransformer swaps layers) and ``unpatch_model`` swaps it back.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
import transformers
from torch import nn
from transformers import PreTrainedModel
from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

from ..methods.base import METHOD_ATTRIBUTE, is_tracing
from ..registry import (
    MethodChoice,
    build_method,
    get_method_class,
    list_methods,
    method_named_by,
    resolve_method,
    saved_attn_implementation,
)
from .architectures import is_windowed, max_tokens, position_offset
from .bridge import (
    RETURN_PROBABILITIES,
    check_supported,
    layer_shape,
    method_modules,
    one_row_per_sequence,
    self_attention_modules,
)
from .longformer import EfficientLongformerSelfAttention
from .packing import SEGMENTS_KEYWORD, Segments, groups_by_length, packed_segments, shift_packed_positions
from .transformers_private import (
    force_eager_attention,
    initialized_from_checkpoint,
    register_output_capture,
    requested_attn_implementation,
)

logger = logging.getLogger(__name__)

_EFFICIENT_CLASSES: dict[type, type] = {}
#: Attribute of a patched model: the attention implementation to restore when it is unpatched.
_RESTORE_ATTRIBUTE = "_hea_restore_attn_implementation"
#: Attribute of a patched sequence-level model: the handle of its encoder's packed-row hook.
_SEQUENCE_HOOK_ATTRIBUTE = "_hea_sequence_hook"


class EfficientModelMixin:
    """What the efficient subclasses add to a Transformers model class (see module docstring)."""

    def __init__(self, config: Any, *args: Any, method_choice: MethodChoice | None = None, **kwargs: Any) -> None:
        """``method_choice``: the choice ``hea.AutoModel*`` resolved (so it is not resolved again);
        without it (plain Transformers) the method named by ``attn_implementation`` or saved in the
        config is resolved here."""
        # What the caller or config.json asked for (Transformers replaces None by its default below).
        requested = requested_attn_implementation(config)
        super().__init__(config, *args, **kwargs)
        if method_choice is not None:
            patch_model(self, method_choice)
            return
        method = method_named_by(requested)
        if method is None and requested is not None and getattr(config, "attn_impl", None) is not None:
            logger.warning(
                f"attn_implementation={requested!r} runs Transformers' attention: the method "
                f"{config.attn_impl!r} saved in the config is not used (and not saved again)"
            )
            del config.attn_impl, config.attn_config
        if method is not None or getattr(config, "attn_impl", None) is not None:
            patch_model(self, method)
        else:  # nothing to run: a plain Transformers model, as unpatch_model leaves one
            _set_class(self, transformers_class(type(self)))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        parameters = inspect.signature(cls.forward).parameters.values()
        #: Whether the model's forward passes on keywords it does not name (``**kwargs``).
        cls._forward_passes_keywords = any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Input checks here rather than in ``forward``, whose signature Trainer inspects.
        if not is_patched(self):
            return super().__call__(*args, **kwargs)
        kwargs = self._packed_positions(kwargs)
        self._check_length(args, kwargs)
        kwargs, segments = self._packed_segments(args, kwargs)
        # Attributes of submodules for this call only: what Longformer's layers cannot take as keywords,
        # and the request for attention probabilities.
        call_attributes = []
        if segments is not None and self.config.model_type == "longformer":
            receivers = [*self_attention_modules(self), self.base_model]  # its layers and sequence hook
            call_attributes += [(module, SEGMENTS_KEYWORD, segments, None) for module in receivers]
        if kwargs.get("output_attentions") or self.config.output_attentions:
            refusal = attentions_refusal(self.config.model_type, self.config.attn_impl)
            if refusal is not None:
                raise ValueError(f"{refusal}; call the model with output_attentions=False")
            call_attributes += [(method, RETURN_PROBABILITIES, True, False) for method in method_modules(self)]
        for module, name, value, _ in call_attributes:
            setattr(module, name, value)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            for module, name, _, reset in call_attributes:
                setattr(module, name, reset)

    def _packed_positions(self, kwargs: dict) -> dict:
        """Packed rows (``packing.py``): the ``position_ids`` of a model whose positions start at
        ``pad_token_id + 1`` (RoBERTa family, Longformer) started at 0 are shifted to its first position."""
        offset = position_offset(self.config)
        if offset and kwargs.get("position_ids") is not None:
            shifted = shift_packed_positions(kwargs["position_ids"], kwargs.get("attention_mask"), offset)
            kwargs = {**kwargs, "position_ids": shifted}
        return kwargs

    def _packed_segments(self, args: tuple, kwargs: dict) -> tuple[dict, Segments | None]:
        """The sequences of packed rows, worked out once for all layers (``packing.py``) and handed to
        them as a keyword. Longformer's layers see no keywords (its forward drops them): the
        sequences reach them as an attribute (``__call__``). The layers work it out themselves when
        the forward passes on no keywords it does not name (no ``**kwargs``, e.g. WikiHop's candidate
        scorer), and inside the graph of a model compiled with ``model.compile()``."""
        longformer = self.config.model_type == "longformer"
        if not longformer and (self._compiled_call_impl is not None or not self._forward_passes_keywords):
            return kwargs, None
        tokens = _input_tokens(args, kwargs)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        if tokens is None or (mask is not None and mask.dim() != 2):
            return kwargs, None  # the layers work it out from the keywords (a custom 4D mask among them)
        batch, seq_len = tokens.shape[:2]
        segments = packed_segments(
            kwargs,
            None if mask is None else mask.bool(),
            batch,
            seq_len,
            group=groups_by_length(method_modules(self)[0]),
        )
        return (kwargs if longformer else {**kwargs, SEGMENTS_KEYWORD: segments}), segments

    def _check_length(self, args: tuple, kwargs: dict) -> None:
        """The positions an input uses must lie in the position table: ``position_ids`` when given
        (packed sequences may be longer than the table), else the input's length. Traced models check
        the length only (reading position values is a host sync)."""
        position_ids = kwargs.get("position_ids")
        if position_ids is not None:
            rows = self.config.max_position_embeddings
            if not is_tracing() and position_ids.numel() and int(position_ids.max()) >= rows:
                raise ValueError(
                    f"position_ids reach {int(position_ids.max())}, beyond the position table ({rows} rows); "
                    f"call hf_efficient_attn.extend_position_embeddings(model, max_length=...) first"
                )
            return
        tokens = _input_tokens(args, kwargs)
        limit = max_tokens(self.config)
        if tokens is not None and tokens.shape[1] > limit:
            raise ValueError(
                f"input of {tokens.shape[1]} tokens exceeds the position table ({limit} tokens allowed); "
                f"call hf_efficient_attn.extend_position_embeddings(model, max_length={tokens.shape[1]}) first"
            )

    @classmethod
    def is_custom_code(cls) -> bool:
        """As the Transformers class this one subclasses (Transformers takes a class defined outside its
        package for remote code): its checkpoint conversions apply, so a checkpoint in the architecture's
        original layout (GTE's, NomicBERT's fused projections under the masked-LM model's prefix) loads
        into the base model, and so does its initialisation."""
        return transformers_class(cls).is_custom_code()

    def initialize_weights(self) -> None:
        """Transformers' initialisation, then the method modules' own: every method parameter or
        buffer that the checkpoint did not provide takes the value a freshly built method has
        (:func:`registry.build_method` draws reproducibly), so a reload never re-draws them at random.
        (Overriding ``_init_weights`` would not do: Transformers dispatches the modules of an inner
        model, e.g. ``BertForSequenceClassification.bert``, to that inner model's ``_init_weights``.)"""
        super().initialize_weights()
        with torch.no_grad():
            for method in method_modules(self):
                fresh = build_method(MethodChoice(method.name, method.options), method.shape)
                fresh_tensors = dict([*fresh.named_parameters(), *fresh.named_buffers()])
                for name, tensor in [*method.named_parameters(), *method.named_buffers()]:
                    if not initialized_from_checkpoint(tensor):
                        tensor.copy_(fresh_tensors[name])

    def set_attn_implementation(self, attn_implementation: str | dict, **kwargs: Any) -> None:
        """A method name re-patches (default options for a new method), anything else unpatches."""
        method = method_named_by(attn_implementation)
        if method is not None:
            patch_model(self, method)
        elif is_patched(self):
            unpatch_model(self, restore=attn_implementation)
        else:
            super().set_attn_implementation(attn_implementation, **kwargs)


def _input_tokens(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A model call's ``input_ids`` (keyword or first argument), else its ``inputs_embeds``."""
    tokens = kwargs.get("input_ids", args[0] if args else None)
    return kwargs.get("inputs_embeds") if tokens is None else tokens


def attentions_refusal(model_type: str, attn_impl: str) -> str | None:
    """Why a model of ``model_type`` patched with ``attn_impl`` cannot return attention
    probabilities (``output_attentions=True``), or None when it can (``softmax`` outside Longformer)."""
    if model_type == "longformer":
        return (
            "output_attentions=True is not supported for Longformer models with an efficient method: Longformer "
            "returns its attentions in its sliding-window layout (each token's window and global tokens), which "
            f"a method over the whole sequence ({attn_impl!r} here) does not produce"
        )
    if not hasattr(get_method_class(attn_impl), "probabilities"):
        return (
            f"output_attentions=True is not supported: attention method {attn_impl!r} never forms the attention "
            "probabilities (only 'softmax' returns them)"
        )
    return None


def efficient_class(model_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
    """The efficient subclass of ``model_class`` (itself if it already is one)."""
    if issubclass(model_class, EfficientModelMixin):
        return model_class
    if model_class not in _EFFICIENT_CLASSES:
        name = model_class.__name__
        doc = f"``transformers.{name}`` with an efficient attention method (``hf_efficient_attn.integration.patching``)."
        cls = type(name, (EfficientModelMixin, model_class), {"__module__": __name__, "__doc__": doc})
        _EFFICIENT_CLASSES[model_class] = cls
        globals()[name] = cls  # importable by name, so patched models pickle
    return _EFFICIENT_CLASSES[model_class]


def __getattr__(name: str) -> type:
    """``hf_efficient_attn.integration.patching.<TransformersClass>``: built on first use (unpickling)."""
    model_class = getattr(transformers, name, None)
    if isinstance(model_class, type) and issubclass(model_class, PreTrainedModel):
        return efficient_class(model_class)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def transformers_class(model_class: type) -> type:
    """The class ``model_class`` is the efficient subclass of (itself if it is none)."""
    return next(c for c in model_class.__mro__ if not issubclass(c, EfficientModelMixin))


def transformers_base_model_class(config: Any) -> type[PreTrainedModel]:
    """Transformers' own base model class of ``config``'s architecture (``transformers.AutoModel``
    builds this package's subclass of it once the package is imported, ``auto.py``)."""
    return transformers_class(transformers.MODEL_MAPPING[type(config)])


def takes_pooling_layer_keyword(model_class: type) -> bool:
    """Whether the base model class builds a pooler on request (``add_pooling_layer``: BERT's); those
    of ELECTRA, ModernBERT and others have no pooler and refuse the keyword."""
    return "add_pooling_layer" in inspect.signature(model_class.__init__).parameters


def _set_class(model: PreTrainedModel, cls: type) -> None:
    """Swap ``model``'s class, and do for it what ``PreTrainedModel.__init__`` does for the class it
    builds: register its recordable outputs, without which Transformers returns no hidden states or
    attentions for a class never built in this process."""
    model.__class__ = cls
    register_output_capture(model)


def _dispatch(model: PreTrainedModel, attn_implementation: str | dict) -> None:
    """Transformers' own ``set_attn_implementation`` (not the efficient override). Longformer's
    attention class is swapped instead, and its mask creation dispatches on the config's attention
    implementation, which must stay Transformers' "eager" (Longformer's only one)."""
    if model.config.model_type == "longformer":
        force_eager_attention(model.config)
    else:
        PreTrainedModel.set_attn_implementation(model, attn_implementation)


def is_patched(model: nn.Module) -> bool:
    """True once :func:`patch_model` has run on ``model`` (and :func:`unpatch_model` has not)."""
    return hasattr(model, _RESTORE_ATTRIBUTE)


def patch_model(
    model: PreTrainedModel, attn_impl: str | MethodChoice | None = None, attn_config: dict[str, Any] | None = None
) -> PreTrainedModel:
    """Replace the self-attention of ``model`` by method ``attn_impl``, in place; returns ``model``.

    Each layer gets its own method module (``<self-attention>.efficient_attn``), and the choice is
    recorded in the config (``config.attn_impl`` / ``config.attn_config``, so ``save_pretrained``
    writes it, and ``config.attn_implementation``: why each, :func:`registry.resolve_method`).
    Without ``attn_impl`` the method named by ``config.attn_impl`` is used (``attn_config`` then
    updates its saved options); with neither, ``ValueError``. ``attn_impl`` may be a resolved
    :class:`registry.MethodChoice` (then without ``attn_config``), used as it is. Patching a patched
    model replaces its method (the old method's parameters are dropped). Undo with :func:`unpatch_model`.
    """
    config = model.config
    if attn_impl is None and getattr(config, "attn_impl", None) is None:
        raise ValueError(
            f"patch_model needs attn_impl (the model's config names no method); known methods: {', '.join(list_methods())}"
        )
    if isinstance(attn_impl, MethodChoice):
        if attn_config is not None:
            raise ValueError("patch_model takes attn_config with a method name, not with a resolved MethodChoice")
        choice = attn_impl
    else:
        choice = resolve_method(config, attn_impl, attn_config)
    attn_impl = choice.name
    check_supported(config, attn_impl)
    refusal = attentions_refusal(config.model_type, attn_impl)
    if getattr(config, "output_attentions", False) and refusal is not None:
        raise ValueError(f"{refusal}; the config asks for output_attentions=True: set it to False")
    if is_patched(model):
        unpatch_model(model)
    restore = requested_attn_implementation(config)
    restore = None if method_named_by(restore) else restore  # built as a method: unpatching restores the default

    # Sliding-window layers (ModernBERT's, UltraBERT's local ones) keep the model's own attention (bridge.py).
    modules = [(index, module) for index, module in enumerate(self_attention_modules(model)) if not is_windowed(module)]
    for layer_idx, module in modules:
        if isinstance(module, LongformerSelfAttention):
            module.__class__ = EfficientLongformerSelfAttention  # same parameters, same state-dict keys
        method = build_method(choice, layer_shape(config, module, layer_idx))
        param = next(module.parameters())
        method.to(device=param.device, dtype=param.dtype).train(module.training)
        setattr(module, METHOD_ATTRIBUTE, method)
        if module is not modules[0][1]:
            method.share_from(modules[0][1])
    _set_class(model, efficient_class(type(model)))
    setattr(model, _RESTORE_ATTRIBUTE, restore)
    if type(model).__name__.endswith("ForSequenceClassification"):
        # The head reads each row's first token: packed rows reach it one row per sequence (bridge.py).
        # Longformer's encoder works on rows padded to its attention window, its model on the input's.
        encoder = (
            model.base_model if config.model_type == "longformer" else getattr(model.base_model, "encoder", model.base_model)
        )
        hook = encoder.register_forward_hook(one_row_per_sequence, with_kwargs=True)
        setattr(model, _SEQUENCE_HOOK_ATTRIBUTE, hook)
    config.attn_impl, config.attn_config = attn_impl, choice.attn_config
    # Saved to config.json, where plain Transformers reads it as the attention to run (registry.py).
    config.attn_implementation = saved_attn_implementation(attn_impl)
    _dispatch(model, attn_impl)
    return model


def unpatch_model(model: PreTrainedModel, restore: str | dict | None = None) -> PreTrainedModel:
    """Undo :func:`patch_model`, in place: the method modules (and their parameters) are removed,
    the class and ``config`` are plain Transformers again, and attention runs through ``restore``
    (default: the implementation the model had before it was patched)."""
    if not is_patched(model):
        raise ValueError(f"{type(model).__name__} is not patched with an efficient attention method")
    for module in self_attention_modules(model):
        if hasattr(module, METHOD_ATTRIBUTE):
            delattr(module, METHOD_ATTRIBUTE)
        if isinstance(module, EfficientLongformerSelfAttention):
            module.__class__ = LongformerSelfAttention
    if hasattr(model, _SEQUENCE_HOOK_ATTRIBUTE):
        getattr(model, _SEQUENCE_HOOK_ATTRIBUTE).remove()
        delattr(model, _SEQUENCE_HOOK_ATTRIBUTE)
    restore = restore or getattr(model, _RESTORE_ATTRIBUTE, None) or "sdpa"
    del model.config.attn_impl, model.config.attn_config, model.config.attn_implementation
    delattr(model, _RESTORE_ATTRIBUTE)
    _set_class(model, transformers_class(type(model)))
    _dispatch(model, restore)
    return model


def modules_to_save(model: nn.Module) -> list[str]:
    """Entries for PEFT's ``modules_to_save`` that keep the method's own parameters (Linformer's
    projections, convolutions) trainable and saved with an adapter; empty for parameter-free methods."""
    methods = method_modules(model)
    return [METHOD_ATTRIBUTE] if any(any(True for _ in m.parameters()) for m in methods) else []
