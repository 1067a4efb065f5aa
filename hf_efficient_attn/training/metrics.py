"""Evaluation metrics computed from Trainer's predictions."""

from __future__ import annotations

import numpy as np
import torch
from transformers import EvalPrediction

from .loss import IGNORE_INDEX


def predicted_tokens(logits: torch.Tensor | tuple, labels: torch.Tensor) -> torch.Tensor:
    """``preprocess_logits_for_metrics``: keep the argmax token instead of the (tokens x vocab)
    logits, so evaluation memory does not grow with the vocabulary."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def masked_token_accuracy(prediction: EvalPrediction) -> dict[str, float]:
    """Accuracy over the masked positions (labels != -100), reported as ``eval_accuracy``
    (the name ``run_mlm.py`` uses)."""
    predictions, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    counted = labels != IGNORE_INDEX
    return {"accuracy": float((predictions[counted] == labels[counted]).mean())}
