"""``AutoModel*`` classes whose ``from_pretrained`` / ``from_config`` take ``attn_impl`` / ``attn_config``.

``from_pretrained`` resolves the config as Transformers' own ``AutoModel*`` does (config keyword
arguments such as ``num_labels=`` reach the config; hub options reach both), records the method in
the config, and loads the efficient subclass of the architecture's class (``patching.py``): the
method is built before the weights load, so its parameters are read from the checkpoint like any
other weight and Transformers' own load report lists the missing ones as newly initialised.

Which method runs:

- ``attn_impl=`` names it; without it, the method saved in the checkpoint's config is restored, and a
  plain checkpoint loads unchanged. ``attn_config`` updates the saved options of the same method.
- ``attn_implementation=`` (Transformers' argument) may name a method too; naming a different one than
  ``attn_impl``, or a Transformers implementation (``"sdpa"``, ``"eager"``) together with a method, is a
  ``ValueError`` (load with ``transformers.AutoModel*`` or call ``hea.unpatch_model`` for plain attention).
- ``attn_config`` without a method (neither given nor saved) is a ``ValueError``.
"""

from __future__ import annotations

import os
from typing import Any

import transformers
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from .bridge import check_supported
from .patching import efficient_class, patch_model
from .registry import list_methods, resolve_options

#: Keyword arguments that locate files, passed to both the config and the model (as Transformers' AutoModel).
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
#: Model keyword arguments that the config must not absorb (as Transformers' AutoModel).
_MODEL_ONLY_KWARGS = ("dtype", "torch_dtype", "quantization_config")


def chosen_method(
    config: PretrainedConfig,
    attn_impl: str | None,
    attn_config: dict[str, Any] | None,
    attn_implementation: str | None = None,
) -> tuple[str | None, dict[str, Any] | None]:
    """(method, options) to load ``config`` with, or (None, None) for plain Transformers (module docstring)."""
    saved = getattr(config, "attn_impl", None)
    if attn_implementation in list_methods():
        if attn_impl not in (None, attn_implementation):
            raise ValueError(
                f"attn_impl={attn_impl!r} and attn_implementation={attn_implementation!r} name different "
                "methods; give one of them"
            )
        attn_impl = attn_implementation
    elif attn_implementation is not None and (attn_impl or saved):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} would run Transformers' attention, but the efficient "
            f"method {attn_impl or saved!r} is {'requested' if attn_impl else 'saved in the config'}; to load "
            "plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model"
        )
    name = attn_impl or saved
    if name is None:
        if attn_config is not None:
            raise ValueError(
                "attn_config was given without attn_impl, and the checkpoint's config saves no method; "
                f"name one with attn_impl= (known methods: {', '.join(list_methods())})"
            )
        return None, None
    check_supported(config, name)
    base = getattr(config, "attn_config", None) if name == saved else None
    return name, resolve_options(name, attn_config, base=base).to_dict()


class _EfficientAutoModel:
    """Shared ``from_pretrained`` / ``from_config``; subclasses name the Transformers auto class
    and its public model mapping."""

    _auto_class: type
    _mapping: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise EnvironmentError(f"use {type(self).__name__}.from_pretrained(...) or .from_config(...)")

    @classmethod
    def _model_class(cls, config: PretrainedConfig) -> type[PreTrainedModel]:
        try:
            return cls._mapping[type(config)]
        except KeyError:
            raise ValueError(
                f"{cls.__name__} has no {config.model_type!r} model; use another hf_efficient_attn.AutoModel* class"
            ) from None

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args: Any,
        attn_impl: str | None = None,
        attn_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """Load a checkpoint with its self-attention swapped to ``attn_impl`` (module docstring);
        every other keyword argument behaves as in ``transformers.AutoModel*.from_pretrained``."""
        path = str(pretrained_model_name_or_path)
        hub_kwargs = {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}
        model_kwargs = {k: kwargs.pop(k) for k in _MODEL_ONLY_KWARGS if k in kwargs}
        attn_implementation = kwargs.pop("attn_implementation", None)
        config = kwargs.pop("config", None)
        if not isinstance(config, PretrainedConfig):
            config, kwargs = AutoConfig.from_pretrained(
                config or path, return_unused_kwargs=True, **hub_kwargs, **kwargs
            )
        name, options = chosen_method(config, attn_impl, attn_config, attn_implementation)
        model_class = cls._model_class(config)
        if name is not None:
            config.attn_impl, config.attn_config = name, options
            model_class = efficient_class(model_class)
        elif attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        return model_class.from_pretrained(path, *model_args, config=config, **hub_kwargs, **model_kwargs, **kwargs)

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig,
        attn_impl: str | None = None,
        attn_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """A freshly initialised model with ``attn_impl`` (or the config's saved method)."""
        attn_implementation = kwargs.pop("attn_implementation", None)
        name, options = chosen_method(config, attn_impl, attn_config, attn_implementation)
        if name is None and attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        model = cls._auto_class.from_config(config, **kwargs)
        return patch_model(model, name, options) if name is not None else model


def _auto(name: str, mapping: str) -> type:
    auto_class = getattr(transformers, name)
    doc = f"``transformers.{name}`` with ``attn_impl=`` / ``attn_config=`` (see the module docstring)."
    attributes = {"_auto_class": auto_class, "_mapping": getattr(transformers, mapping), "__doc__": doc,
                  "__module__": __name__}
    return type(name, (_EfficientAutoModel,), attributes)


AutoModel = _auto("AutoModel", "MODEL_MAPPING")
AutoModelForMaskedLM = _auto("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING")
AutoModelForPreTraining = _auto("AutoModelForPreTraining", "MODEL_FOR_PRETRAINING_MAPPING")
AutoModelForSequenceClassification = _auto("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING")
AutoModelForMultipleChoice = _auto("AutoModelForMultipleChoice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING")
AutoModelForTokenClassification = _auto("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING")
AutoModelForQuestionAnswering = _auto("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING")
