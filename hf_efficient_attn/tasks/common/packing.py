"""Padding-free batches for the training scripts (``--padding_free``, docs/packing.md): each batch one
row, the sequences one after another, with the keywords that tell the model where each starts."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DataCollatorWithFlattening


def flattening_collator() -> DataCollatorWithFlattening:
    """Transformers' collator for token-level examples (masked LM), with the flash-attention keywords,
    whose shapes let a compiled model unpack the row (``integration/packing.py``)."""
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)


class SequenceLabelFlattening:
    """:func:`flattening_collator` for examples with one label each (sequence classification): every
    per-token field (``input_ids``, ``token_type_ids``) flattened, the labels one per sequence.
    (``DataCollatorWithFlattening`` reads ``labels`` as per-token and drops ``token_type_ids``.)"""

    def __init__(self) -> None:
        self.flatten = flattening_collator()

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.flatten([{"input_ids": f["input_ids"]} for f in features])
        batch.pop("labels", None)  # the collator's per-token copy of input_ids
        if "token_type_ids" in features[0]:
            batch["token_type_ids"] = torch.tensor([[t for f in features for t in f["token_type_ids"]]])
        if "labels" in features[0]:
            batch["labels"] = torch.tensor([f["labels"] for f in features])
        return batch
