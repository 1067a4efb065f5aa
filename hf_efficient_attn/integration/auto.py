"""``AutoModel*`` classes whose ``from_pretrained`` / ``from_config`` take ``attn_impl`` / ``attn_config``.

``from_pretrained`` resolves the config as Transformers' own ``AutoModel*`` does (config keyword
arguments such as ``num_labels=`` reach the config; hub options reach both), records the method in
the config, and loads through Transformers' auto class, which builds the efficient subclass of the
architecture's class (``patching.py``; this module registers them with Transformers' auto classes on
import): the method is built before the weights load, so its parameters are read from the checkpoint
like any other weight and Transformers' own load report lists the missing ones as newly initialised.
The same registration makes plain ``transformers.AutoModel*.from_pretrained`` (and so pipelines and
sentence-transformers) load a saved variant as its method.

A checkpoint saved by Transformers' ``Mra*``, ``Yoso*`` or ``Nystromformer*`` classes (the seed papers'
released models) loads as the BERT model running the method its config records (``released.py``).

Which method runs:

- ``attn_impl=`` names it; without it, the method saved in the checkpoint's config is restored, and a
  plain checkpoint loads unchanged. ``attn_config`` updates the saved options of the same method.
- ``attn_implementation=`` (Transformers' argument) may name a method too; naming a different one than
  ``attn_impl``, or a Transformers implementation (``"sdpa"``, ``"eager"``) together with a method, is a
  ``ValueError`` (load with ``transformers.AutoModel*`` or call ``hea.unpatch_model`` for plain attention).
- ``attn_config`` without a method (neither given nor saved) is a ``ValueError``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import transformers
from transformers import AutoConfig, BertConfig, PretrainedConfig, PreTrainedModel

from ..registry import MethodChoice, method_named_by, resolve_method
from .architectures import TESTED_ARCHITECTURES
from .bridge import check_supported
from .patching import efficient_class
from .released import RELEASED_MODEL_TYPES, bert_config, check_heads, converted_state_dict, read_state_dict

#: The auto classes with ``attn_impl=`` (one ``hea.AutoModel*`` each, and the ``auto_map`` of a shared
#: variant's remote code), with Transformers' mapping of config class -> model class (``<mapping>_NAMES``:
#: config name -> class name). Ordered: a head's auto class is the first that names its class (RoBERTa's
#: pretraining class is its masked-LM class).
AUTO_CLASSES: dict[str, str] = {
    "AutoModel": "MODEL_MAPPING",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING",
    "AutoModelForPreTraining": "MODEL_FOR_PRETRAINING_MAPPING",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    "AutoModelForMultipleChoice": "MODEL_FOR_MULTIPLE_CHOICE_MAPPING",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING",
}
#: Keyword arguments that locate files, passed to both the config and the model (as Transformers' AutoModel).
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")
#: Model keyword arguments that the config must not absorb (as Transformers' AutoModel).
_MODEL_ONLY_KWARGS = ("dtype", "torch_dtype", "quantization_config")


def chosen_method(
    config: PretrainedConfig,
    attn_impl: str | None,
    attn_config: dict[str, Any] | None,
    attn_implementation: str | None = None,
) -> MethodChoice | None:
    """The method and options to load ``config`` with, or None for plain Transformers (module
    docstring; the rule itself is :func:`registry.resolve_method`)."""
    saved = getattr(config, "attn_impl", None)
    named = method_named_by(attn_implementation)
    if named is not None:
        if attn_impl not in (None, named):
            raise ValueError(
                f"attn_impl={attn_impl!r} and attn_implementation={attn_implementation!r} name different "
                "methods; give one of them"
            )
        attn_impl = named
    elif attn_implementation is not None and (attn_impl or saved):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} would run Transformers' attention, but the efficient "
            f"method {attn_impl or saved!r} is {'requested' if attn_impl else 'saved in the config'}; to load "
            "plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model"
        )
    choice = resolve_method(config, attn_impl, attn_config)
    if choice is not None:
        check_supported(config, choice.name)
    return choice


class _EfficientAutoModel:
    """Shared ``from_pretrained`` / ``from_config``; subclasses name the Transformers auto class."""

    _auto_class: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise EnvironmentError(f"use {type(self).__name__}.from_pretrained(...) or .from_config(...)")

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
        if isinstance(config, PretrainedConfig):
            config = copy.deepcopy(config)  # as Transformers' from_pretrained, the caller's config is left as it was
        else:
            config, kwargs = AutoConfig.from_pretrained(config or path, return_unused_kwargs=True, **hub_kwargs, **kwargs)
        model_class = cls._auto_class
        if config.model_type in RELEASED_MODEL_TYPES:  # a paper's release: a BERT model with its method (released.py)
            model_type, config = config.model_type, bert_config(config)  # its fields checked before any weight is read
            state_dict = converted_state_dict(read_state_dict(path, **hub_kwargs), model_type)
            check_heads(state_dict, cls._auto_class.__name__, model_type)
            path, kwargs["state_dict"] = None, state_dict
            model_class = getattr(transformers, AUTO_CLASSES[cls._auto_class.__name__])[BertConfig]  # its efficient class
        choice = chosen_method(config, attn_impl, attn_config, attn_implementation)
        if choice is not None:  # the model patches itself with it while it is built (patching.py)
            config.attn_impl, config.attn_config = choice.name, choice.attn_config
            model_kwargs["method_choice"] = choice
            attn_implementation = choice.name
        if attn_implementation is not None:
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
        choice = chosen_method(config, attn_impl, attn_config, attn_implementation)
        if choice is not None:  # the model patches itself with it while it is built (patching.py)
            config = copy.deepcopy(config)  # as Transformers' from_config, the caller's config is left as it was
            config.attn_impl, config.attn_config = choice.name, choice.attn_config
            kwargs["method_choice"] = choice
            attn_implementation = choice.name
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        return cls._auto_class.from_config(config, **kwargs)


def _auto(name: str) -> type:
    auto_class = getattr(transformers, name)
    _register_efficient_classes(auto_class, getattr(transformers, AUTO_CLASSES[name]))
    doc = f"``transformers.{name}`` with ``attn_impl=`` / ``attn_config=`` (see the module docstring)."
    attributes = {"_auto_class": auto_class, "__doc__": doc, "__module__": __name__}
    return type(name, (_EfficientAutoModel,), attributes)


def _register_efficient_classes(auto_class: type, mapping: Any) -> None:
    """Make Transformers' own ``auto_class`` build the efficient subclass (``patching.py``) of every
    tested architecture (``architectures.py``), through its public ``register``: then plain
    ``transformers.AutoModel*.from_pretrained``, pipelines, sentence-transformers and PEFT load a saved
    variant as its method. A config that names no method builds a model that runs exactly as the
    Transformers class it subclasses."""
    for model_type in TESTED_ARCHITECTURES:
        config_class = transformers.CONFIG_MAPPING[model_type]
        if config_class in mapping:
            auto_class.register(config_class, efficient_class(mapping[config_class]), exist_ok=True)


AutoModel = _auto("AutoModel")
AutoModelForMaskedLM = _auto("AutoModelForMaskedLM")
AutoModelForPreTraining = _auto("AutoModelForPreTraining")
AutoModelForSequenceClassification = _auto("AutoModelForSequenceClassification")
AutoModelForMultipleChoice = _auto("AutoModelForMultipleChoice")
AutoModelForTokenClassification = _auto("AutoModelForTokenClassification")
AutoModelForQuestionAnswering = _auto("AutoModelForQuestionAnswering")
