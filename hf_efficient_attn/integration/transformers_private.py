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

from ..methods.base import is_tracing


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


def _factory_code(factory: Any, *args: Any) -> tuple[Any, dict[str, int]]:
    """The code of the function ``factory(*args)`` returns, and where each of its free variables sits
    in a closure (read here, outside any traced code: Dynamo traces ``__closure__`` but not code objects)."""
    code = factory(*args).__code__
    return code, {name: index for index, name in enumerate(code.co_freevars)}


def _packed_mask_codes() -> tuple:
    from transformers import masking_utils as masks

    return (
        masks.bidirectional_mask_function,
        _factory_code(masks.and_masks, masks.bidirectional_mask_function),
        _factory_code(masks.remap_positions_for_packed_sequence, masks.bidirectional_mask_function, None),
        _factory_code(masks.packed_sequence_mask_function, None)[0],
    )


_PACKED_MASK_CODES = _packed_mask_codes()


def is_packed_bidirectional_mask(mask_function: Any) -> bool:
    """Whether ``mask_function`` is what ``create_bidirectional_mask`` builds for packed rows (from
    Transformers 5.25: ``position_ids`` that restart and no ``attention_mask``): the bidirectional mask,
    its positions remapped per sequence, and'ed with the packed-sequence mask. The closures of
    ``masking_utils``' factories are read because the mask interface receives only the composed function
    (https://github.com/huggingface/transformers/blob/main/src/transformers/masking_utils.py).

    Dynamo cannot read the closure of a function made inside the traced code, so under tracing the
    composition is recognised by its name with no padding mask; the bridge then needs the packing
    keywords of the call and refuses a packed row without them (``packing.py``)."""
    if is_tracing():
        return getattr(mask_function, "__name__", None) == "and_mask"
    bidirectional, (and_code, and_slots), (remap_code, remap_slots), packed_code = _PACKED_MASK_CODES
    if getattr(mask_function, "__code__", None) is not and_code:
        return False
    kinds = set()
    for part in mask_function.__closure__[and_slots["mask_functions"]].cell_contents:
        if part.__code__ is remap_code and part.__closure__[remap_slots["mask_function"]].cell_contents is bidirectional:
            kinds.add("bidirectional")
        elif part.__code__ is packed_code:
            kinds.add("packed")
        else:
            return False
    return kinds == {"bidirectional", "packed"}
