"""``AutoModel*`` classes whose ``from_pretrained`` takes ``attn_impl`` / ``attn_config``.

Loading is Transformers' own ``from_pretrained`` followed by :func:`patch_model`; the
parameters a method adds (Linformer projections, convolutions) are then read from the
checkpoint when it has them, and reported as newly initialised when it does not.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.auto_factory import _get_model_class
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME, cached_file
from transformers.utils import logging

from .bridge import METHOD_ATTRIBUTE, SELF_ATTENTION_CLASSES, patch_model
from .registry import resolve_options

logger = logging.get_logger(__name__)

_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
_METHOD_KEY = rf"\.{METHOD_ATTRIBUTE}\."


def _encoder_suffix(key: str) -> str:
    """``bert.encoder.layer.0...`` and ``encoder.layer.0...`` name the same parameter."""
    return key[key.index("encoder.") :] if "encoder." in key else key


def _checkpoint_files(path: str, hub_kwargs: dict[str, Any]) -> list[str]:
    for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        file = cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
        if file is not None:
            return [file]
    index = cached_file(path, SAFE_WEIGHTS_INDEX_NAME, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if index is None:
        return []
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    return [cached_file(path, shard, **hub_kwargs) for shard in shards]


def _method_tensors(path: str, hub_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tensors of method modules stored in a checkpoint, keyed by their encoder suffix."""
    tensors = {}
    for file in _checkpoint_files(path, hub_kwargs):
        if file.endswith(".safetensors"):
            with safe_open(file, framework="pt") as f:
                tensors.update({k: f.get_tensor(k) for k in f.keys() if f".{METHOD_ATTRIBUTE}." in k})
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            tensors.update({k: v for k, v in state.items() if f".{METHOD_ATTRIBUTE}." in k})
    return {_encoder_suffix(k): v for k, v in tensors.items()}


def load_method_parameters(model: PreTrainedModel, path: str, hub_kwargs: dict[str, Any]) -> None:
    """Copy the method parameters stored at ``path`` into ``model``; log those that are new."""
    wanted = {k: v for k, v in model.state_dict().items() if f".{METHOD_ATTRIBUTE}." in k}
    if not wanted:
        return
    stored = _method_tensors(path, hub_kwargs)
    new = []
    with torch.no_grad():
        for key, target in wanted.items():
            source = stored.get(_encoder_suffix(key))
            if source is None:
                new.append(key)
            elif source.shape != target.shape:
                raise ValueError(
                    f"{key}: checkpoint has shape {tuple(source.shape)} but the method "
                    f"{model.config.attn_impl!r} with {model.config.attn_config} expects {tuple(target.shape)}"
                )
            else:
                target.copy_(source)
    if new:
        logger.warning(
            f"{len(new)} parameter(s) added by attention method {model.config.attn_impl!r} are newly initialised "
            f"(not in {path}); train them before use: {new[:4]}{' ...' if len(new) > 4 else ''}"
        )


@contextlib.contextmanager
def _quiet_about_method_keys(model_class: type[PreTrainedModel]) -> Iterator[None]:
    """Transformers loads the plain model first; method keys are handled afterwards."""
    before = model_class.__dict__.get("_keys_to_ignore_on_load_unexpected", None)
    had_own = "_keys_to_ignore_on_load_unexpected" in model_class.__dict__
    model_class._keys_to_ignore_on_load_unexpected = set(model_class._keys_to_ignore_on_load_unexpected or []) | {
        _METHOD_KEY
    }
    try:
        yield
    finally:
        if had_own:
            model_class._keys_to_ignore_on_load_unexpected = before
        else:
            del model_class._keys_to_ignore_on_load_unexpected


def _chosen_method(
    config: PretrainedConfig, attn_impl: str | None, attn_config: dict[str, Any] | None
) -> tuple[str | None, dict[str, Any]]:
    """The method to use: the argument, else the one saved in the config; options merged."""
    saved = getattr(config, "attn_impl", None)
    name = attn_impl or saved
    if name is None:
        return None, {}
    if config.model_type not in SELF_ATTENTION_CLASSES:
        raise ValueError(
            f"unsupported model type {config.model_type!r}; supported: {', '.join(sorted(SELF_ATTENTION_CLASSES))}"
        )
    saved_options = (getattr(config, "attn_config", None) or {}) if name == saved else {}
    options = {**saved_options, **(attn_config or {})}
    return name, resolve_options(name, options).to_dict()


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
        """Load a checkpoint and swap its self-attention to ``attn_impl``.

        Without ``attn_impl`` the method saved in the checkpoint's config is restored (and a
        plain checkpoint loads unchanged). ``attn_config`` overrides the method's options.
        """
        path = str(pretrained_model_name_or_path)
        hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
        config = kwargs.pop("config", None) or AutoConfig.from_pretrained(path, **hub_kwargs)
        name, options = _chosen_method(config, attn_impl, attn_config)
        model_class = _get_model_class(config, cls._auto_class._model_mapping)
        with _quiet_about_method_keys(model_class):
            model = model_class.from_pretrained(path, *model_args, config=config, **kwargs)
        if name is not None:
            patch_model(model, name, options)
            load_method_parameters(model, path, hub_kwargs)
        return model

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig,
        attn_impl: str | None = None,
        attn_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """A freshly initialised model with ``attn_impl`` (or the config's saved method)."""
        name, options = _chosen_method(config, attn_impl, attn_config)
        model = cls._auto_class.from_config(config, **kwargs)
        return patch_model(model, name, options) if name is not None else model


def _auto(name: str) -> type:
    auto_class = getattr(transformers, name)
    doc = f"``transformers.{name}`` with ``attn_impl=`` / ``attn_config=`` (see :class:`_EfficientAutoModel`)."
    return type(name, (_EfficientAutoModel,), {"_auto_class": auto_class, "__doc__": doc, "__module__": __name__})


AutoModel = _auto("AutoModel")
AutoModelForMaskedLM = _auto("AutoModelForMaskedLM")
AutoModelForSequenceClassification = _auto("AutoModelForSequenceClassification")
AutoModelForMultipleChoice = _auto("AutoModelForMultipleChoice")
AutoModelForTokenClassification = _auto("AutoModelForTokenClassification")
AutoModelForQuestionAnswering = _auto("AutoModelForQuestionAnswering")
