"""Every use of a private Transformers API, one named helper each.

Written for Transformers ``>=5.23,<6`` (the range setup.cfg pins): none of these has a public route
in that range, so a new Transformers release is checked here first. Upstream sources:
``PreTrainedModel`` (https://github.com/huggingface/transformers/blob/main/src/transformers/modeling_utils.py),
the output capture (.../src/transformers/utils/output_capturing.py) and the init guard
(.../src/transformers/initialization.py). ``tasks/common/trainer.py`` overrides two private
``Trainer`` methods; overrides cannot sit behind a helper and say why where they are.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY


def requested_attn_implementation(config: PretrainedConfig) -> str | dict | None:
    """``config._attn_implementation``: the attention Transformers was asked for (before a model is
    built: None for its default) or dispatches on (after); how an ``AttentionInterface`` function
    learns the name it runs under (https://huggingface.co/docs/transformers/attention_interface)."""
    return config._attn_implementation


def force_eager_attention(config: PretrainedConfig) -> None:
    """Set the attention Transformers dispatches on to "eager" without ``set_attn_implementation``,
    which Longformer refuses (its only implementation, and what its mask creation checks)."""
    config._attn_implementation = "eager"


def register_output_capture(model: PreTrainedModel) -> None:
    """Register ``model``'s recordable outputs, as ``PreTrainedModel.__init__`` does for the class it
    builds: a model whose class was swapped afterwards returns no hidden states or attentions
    without it."""
    _CAN_RECORD_REGISTRY[model] = model._can_record_outputs


def initialized_from_checkpoint(tensor: torch.Tensor) -> bool:
    """Whether Transformers read ``tensor`` from the checkpoint (the ``_is_hf_initialized`` flag its
    own guarded init functions check)."""
    return getattr(tensor, "_is_hf_initialized", False)


def build_from_config(model_class: type[PreTrainedModel], config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
    """``model_class._from_config(config, **kwargs)``: what Transformers' ``AutoModel*.from_config``
    calls (``dtype`` and ``attn_implementation`` handling), for a class no auto class maps."""
    return model_class._from_config(config, **kwargs)
