"""The training loss as Trainer's ``compute_loss_func``: one mean over every counted item of
the optimizer step, whatever the number of processes or accumulation steps.

Trainer (Transformers 5) counts the labelled items of the whole step (``num_items_in_batch``:
all accumulated micro-batches, summed over processes by ``average_tokens_across_devices``),
and, because models of this kind accept ``**kwargs``, it assumes their loss divides by that
count; it then skips the division by the accumulation steps and multiplies by the number of
processes. The encoders' heads (``BertForMaskedLM``, ``...ForSequenceClassification``) ignore
the count and return a per-batch mean, so two processes doubled the logged loss (and the
gradient), and accumulation multiplied it. Summing the per-item losses and dividing by the
count, as done here, makes every process count and accumulation setting compute the same
loss and gradient as one process with the whole batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def global_mean_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Summed loss of this micro-batch divided by ``num_items_in_batch`` (the step's item count;
    this batch's own count when None). Integer labels: cross-entropy over the last axis of the
    logits, ``-100`` ignored (masked LM, token and sequence classification); float labels:
    squared error of a single output (regression, e.g. STS-B)."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    if labels.is_floating_point():
        if logits.shape[-1] != 1:
            raise ValueError(f"float labels need a single regression output, got logits of shape {tuple(logits.shape)}")
        total = F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")
        count = labels.numel()
    else:
        total = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        count = labels.ne(IGNORE_INDEX).sum()
    if num_items_in_batch is None:
        num_items_in_batch = count
    return total / num_items_in_batch
