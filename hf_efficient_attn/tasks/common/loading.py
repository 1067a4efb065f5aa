"""Loading a checkpoint into a model with another head, without Transformers' LOAD REPORT table
when the differences are the expected ones (a new head, another head left out, the attention
method's own new parameters): one line says what was initialised and why; any other difference
keeps the full report. Transformers' "seem corrupted" warning about a tied pair that is missing
because it belongs to the new head (an MLM head's bias) is held back with it."""

from __future__ import annotations

import logging
import re
from typing import Any

from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from ...methods.base import METHOD_ATTRIBUTE

#: The logger that Transformers' ``from_pretrained`` reports the loaded keys on.
_LOADING_LOGGER = "transformers.modeling_utils"
#: The phrases of the warnings a load holds back: the key report, and a tied pair missing from the checkpoint.
LOAD_REPORT, MISSING_TIED_PAIR = "LOAD REPORT", "seem corrupted"


class HeldBackLoadReport(logging.Filter):
    """Within the block, holds back the warnings of Transformers' loading logger about the loaded keys
    (its LOAD REPORT table, its missing-tied-pair warning); :meth:`release` emits those a load's expected
    differences do not explain."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.logger = hf_logging.get_logger(_LOADING_LOGGER)

    def filter(self, record: logging.LogRecord) -> bool:
        if any(phrase in record.getMessage() for phrase in (LOAD_REPORT, MISSING_TIED_PAIR)):
            self.records.append(record)
            return False
        return True

    def __enter__(self) -> HeldBackLoadReport:
        self.logger.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeFilter(self)

    def release(self, model: PreTrainedModel, info: dict[str, Any]) -> None:
        """Emit the held warnings of the load of ``model`` (``info``: its ``output_loading_info``) that
        :func:`expected_differences` does not explain."""
        for record in self.records:
            if not explained(record, model, info):
                self.logger.handle(record)
        self.records.clear()


def _head_of(model: PreTrainedModel, key: str) -> str | None:
    """The top-level module ``key`` belongs to when it is no part of the encoder's body (a head, or
    the pooler, which only a head uses); ``None`` for a body weight."""
    prefix = model.base_model_prefix + "."
    inner = key.removeprefix(prefix)
    body = {name for name, _ in model.base_model.named_children()} - {"pooler"}
    first = inner.split(".")[0]
    if first in body:
        return None
    return first


def _method_parameter(key: str) -> str | None:
    """The name of the attention method's own parameter ``key`` is (Linformer's ``e_proj``), else ``None``."""
    marker = f".{METHOD_ATTRIBUTE}."
    return key.split(marker, 1)[1] if marker in key else None


def expected_differences(model: PreTrainedModel, info: dict[str, Any]) -> str | None:
    """One line naming the new and the unused heads of a load (``output_loading_info``) and the
    attention method's new parameters (a checkpoint saved without the method has none), or ``None``
    when a difference touches the rest of the encoder's body or a shape (the full report is due)."""
    if info.get("mismatched_keys") or info.get("error_msgs"):
        return None
    method_new = sorted({name for name in map(_method_parameter, info["missing_keys"]) if name})
    new = {_head_of(model, key) for key in info["missing_keys"] if not _method_parameter(key)}
    unused = {_head_of(model, key) for key in info["unexpected_keys"]}
    if None in new or None in unused:
        return None
    parts = []
    if new:
        parts.append(f"initialised new {', '.join(sorted(new))} (not in the checkpoint: trained from here)")
    if method_new:
        method = getattr(model.config, "attn_impl", None)
        parts.append(f"initialised {method}'s own parameters {', '.join(method_new)} (not in the checkpoint: trained from here)")
    if unused:
        parts.append(f"left out the checkpoint's {', '.join(sorted(unused))} (no part of this model)")
    return "; ".join(parts) or None


def explained(record: logging.LogRecord, model: PreTrainedModel, info: dict[str, Any]) -> bool:
    """Whether a held-back warning of a load says only what :func:`expected_differences` says: the
    LOAD REPORT table of expected differences, or a tied pair missing because both are new head tensors."""
    message = record.getMessage()
    if LOAD_REPORT in message:
        return expected_differences(model, info) is not None
    tied = re.search(r"tie (\S+) to (\S+),", message)
    new_head = {key for key in info["missing_keys"] if _head_of(model, key) is not None}
    return tied is not None and set(tied.groups()) <= new_head


def load_with_new_head(auto_class: type, name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """``auto_class.from_pretrained(name_or_path, **kwargs)``; when the checkpoint's differences
    from the model are only heads (a task head to train, another task's head), one line on the
    ``hf_efficient_attn.tasks`` logger says so instead of Transformers' LOAD REPORT table."""
    held = HeldBackLoadReport()
    with held:
        model, info = auto_class.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    line = expected_differences(model, info)
    if line is not None and held.records:
        logging.getLogger("hf_efficient_attn.tasks").info(f"{type(model).__name__} from {name_or_path}: {line}")
    held.release(model, info)
    return model
