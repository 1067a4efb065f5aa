"""Loading a checkpoint into a model with another head, without Transformers' LOAD REPORT table
when the differences are the expected ones (a new head, another head left out): one line says
what was initialised and why; any other difference keeps the full report."""

from __future__ import annotations

import logging
from typing import Any

from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

#: The logger that Transformers' ``from_pretrained`` reports the loaded keys on.
_LOADING_LOGGER = "transformers.modeling_utils"


class HeldBackLoadReport(logging.Filter):
    """Within the block, holds back the warnings of Transformers' loading logger whose message
    contains one of ``phrases`` (by default its LOAD REPORT table); :meth:`release` emits them."""

    def __init__(self, *phrases: str) -> None:
        super().__init__()
        self.phrases = phrases or ("LOAD REPORT",)
        self.records: list[logging.LogRecord] = []
        self.logger = hf_logging.get_logger(_LOADING_LOGGER)

    def filter(self, record: logging.LogRecord) -> bool:
        if any(phrase in record.getMessage() for phrase in self.phrases):
            self.records.append(record)
            return False
        return True

    def __enter__(self) -> HeldBackLoadReport:
        self.logger.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeFilter(self)

    def release(self) -> None:
        for record in self.records:
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


def expected_differences(model: PreTrainedModel, info: dict[str, Any]) -> str | None:
    """One line naming the new and the unused heads of a load (``output_loading_info``), or
    ``None`` when a difference touches the encoder's body or a shape (the full report is due)."""
    if info.get("mismatched_keys") or info.get("error_msgs"):
        return None
    new = {_head_of(model, key) for key in info["missing_keys"]}
    unused = {_head_of(model, key) for key in info["unexpected_keys"]}
    if None in new or None in unused:
        return None
    parts = []
    if new:
        parts.append(f"initialised new {', '.join(sorted(new))} (not in the checkpoint: trained from here)")
    if unused:
        parts.append(f"left out the checkpoint's {', '.join(sorted(unused))} (no part of this model)")
    return "; ".join(parts) or None


def load_with_new_head(auto_class: type, name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """``auto_class.from_pretrained(name_or_path, **kwargs)``; when the checkpoint's differences
    from the model are only heads (a task head to train, another task's head), one line on the
    ``hf_efficient_attn.tasks`` logger says so instead of Transformers' LOAD REPORT table."""
    held = HeldBackLoadReport()
    with held:
        model, info = auto_class.from_pretrained(name_or_path, output_loading_info=True, **kwargs)
    line = expected_differences(model, info)
    if line is None:
        held.release()
    elif held.records:
        logging.getLogger("hf_efficient_attn.tasks").info(f"{type(model).__name__} from {name_or_path}: {line}")
    return model
