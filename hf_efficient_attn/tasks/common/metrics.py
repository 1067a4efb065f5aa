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


#: The scores of each kind of GLUE metric, named as ``evaluate.load("glue", task)`` and
#: ``run_glue.py`` name them; ``mse`` for regression without a GLUE task (as ``run_glue.py``).
SCORE_NAMES = {
    "matthews_correlation": ("matthews_correlation",),
    "accuracy": ("accuracy",),
    "accuracy_and_f1": ("accuracy", "f1"),
    "pearson_and_spearman": ("pearson", "spearmanr"),
    "mse": ("mse",),
}


def check_metric_kind(kind: str) -> None:
    """``ValueError`` unless ``kind`` is a key of :data:`SCORE_NAMES`."""
    if kind not in SCORE_NAMES:
        raise ValueError(f"unknown metric kind {kind!r}; allowed: {', '.join(SCORE_NAMES)}")


def classification_scores(kind: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """GLUE's official scores of ``predictions`` against ``labels`` with scikit-learn / scipy
    (offline; ``evaluate.load("glue")`` needs the Hub): Matthews correlation (CoLA), accuracy
    and binary F1 of the positive class 1 (MRPC, QQP), Pearson and Spearman correlation
    (STS-B), accuracy (the others); with more than one score, ``combined_score`` is their mean
    as in ``run_glue.py``."""
    # Imported here: scipy and scikit-learn take a second to import, and MLM runs never use them.
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

    check_metric_kind(kind)
    compute = {
        "matthews_correlation": lambda: matthews_corrcoef(labels, predictions),
        "accuracy": lambda: accuracy_score(labels, predictions),
        "f1": lambda: f1_score(labels, predictions),
        "pearson": lambda: pearsonr(predictions, labels)[0],
        "spearmanr": lambda: spearmanr(predictions, labels)[0],
        "mse": lambda: mean_squared_error(labels, predictions),
    }
    scores = {name: float(compute[name]()) for name in SCORE_NAMES[kind]}
    if len(scores) > 1:
        scores["combined_score"] = float(np.mean(list(scores.values())))
    return scores


class SequenceClassificationMetrics:
    """Trainer's ``compute_metrics`` for a sequence-classification head: the argmax class (or
    the single regression output) of each example, scored by :func:`classification_scores`."""

    def __init__(self, kind: str, regression: bool):
        check_metric_kind(kind)
        self.kind = kind
        self.regression = regression

    def predictions(self, logits: np.ndarray | tuple) -> np.ndarray:
        """Class ids (argmax over the last axis) or regression values of a batch of logits."""
        logits = np.asarray(logits[0] if isinstance(logits, tuple) else logits)
        return logits[:, 0] if self.regression else logits.argmax(axis=-1)

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        return classification_scores(self.kind, self.predictions(prediction.predictions), prediction.label_ids)
