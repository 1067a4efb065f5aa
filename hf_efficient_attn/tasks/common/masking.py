"""Masked-language-model inputs whose masks are a function of (seed, example, epoch).

Transformers' ``DataCollatorForLanguageModeling`` masks each batch from a random state that
Trainer does not checkpoint, so a resumed run sees other masks than an uninterrupted one,
and every evaluation masks the validation set anew. Here each example is masked with a
generator seeded by ``(seed, epoch, index)``: resuming reproduces the uninterrupted run's
masks, the validation set (epoch 0, a fixed seed) is masked the same way in every run, and
which process (or how many) handles an example does not matter. The masking rule itself
(BERT's 80% [MASK] / 10% random / 10% unchanged) is the collator's ``torch_mask_tokens``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset
from transformers import DataCollatorForLanguageModeling, TrainerCallback

if TYPE_CHECKING:  # datasets is imported where it is used: scripts answer --help and flag errors without it
    from datasets import Dataset


def example_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed drawn from ``(seed, epoch, index)`` by numpy's ``SeedSequence`` (well
    mixed: neighbouring examples or epochs get unrelated masks)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


class DeterministicallyMaskedDataset(TorchDataset):
    """Tokenised examples (``input_ids``, ``special_tokens_mask``, ...) returned with MLM
    ``labels`` and masked ``input_ids``; the mask of example ``index`` depends only on
    ``(seed, epoch, index)``. Trainer's sampler picks the order; :class:`MaskingEpochCallback`
    keeps ``epoch`` in step with training."""

    def __init__(self, examples: Dataset, masker: DataCollatorForLanguageModeling, seed: int, epoch: int = 0):
        self.examples = examples
        self.masker = masker
        self.seed = seed
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.examples)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = dict(self.examples[int(index)])
        special = torch.tensor(row.pop("special_tokens_mask"), dtype=torch.bool)[None]
        input_ids = torch.tensor(row.pop("input_ids"))[None]
        # `generator` is the collator's own RNG (what its `seed=` option sets once); here, per example.
        self.masker.generator = torch.Generator().manual_seed(example_seed(self.seed, self.epoch, int(index)))
        masked, labels = self.masker.torch_mask_tokens(input_ids, special)
        return {**row, "input_ids": masked[0], "labels": labels[0]}


class MaskingEpochCallback(TrainerCallback):
    """Tells the training set which epoch begins (``state.epoch`` is the epochs done so far,
    restored from ``trainer_state.json`` when resuming), before its data loader is iterated."""

    def __init__(self, dataset: DeterministicallyMaskedDataset):
        self.dataset = dataset

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.dataset.set_epoch(int(state.epoch or 0))
