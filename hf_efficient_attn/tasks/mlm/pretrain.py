"""Continue masked-language-model pretraining with an efficient attention, with Trainer
(``scripts/pretrain_mlm.py``): the recovery step of the MRA paper (Zeng et al., ICML 2022, section
5.2) after stretching a checkpoint with convert_to_long.py, with the flags and output files of
Transformers' run_mlm.py, plus --attn_impl / --attn_config. Works under torchrun and accelerate
launch (configs/accelerate/).

Reads: --dataset_name from the Hub, or local files (--train_file, --validation_file): .txt, one
text per line, or .json/.jsonl/.csv with the text in a string column (--text_column_name). Without
a validation split, the first --validation_split_percentage % of the training rows. The texts are
concatenated and cut into blocks of --max_seq_length tokens (--line_by_line: one example per line).
Writes: into --output_dir, as run_mlm.py: the model and tokenizer, train_results.json,
trainer_state.json, eval_results.json (eval_accuracy: masked-token accuracy; perplexity),
all_results.json, checkpoint-N/ folders, and provenance.json (what the model was made from, for
push_to_hub.py's card); a sentence-transformers checkpoint stays one (modules.json and its module
folders).

Differences from run_mlm.py, each for a reason: the masks are a function of (seed, epoch,
example), so a resumed run trains on the masks of an uninterrupted one, and the validation masks
are fixed (--eval_mask_seed); the loss is the same on any number of processes; a missing text
column or a --max_seq_length beyond the position table is an error instead of a silent fallback.

examples:
  python scripts/pretrain_mlm.py --model_name_or_path outputs/roberta-base-4096-mra2 \\
      --train_file train.txt --validation_file valid.txt --max_seq_length 4096 \\
      --do_train --do_eval --output_dir outputs/mlm
  python scripts/pretrain_mlm.py configs/train/roberta-base-4096-mra2.json   # a whole configuration
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainingArguments,
)

from ... import AutoModelForMaskedLM
from ...integration.positions import max_tokens
from ..common.args import DataArguments, ModelArguments, block_length, check_max_seq_length, parse_arguments
from ..common.data import (
    first_rows,
    load_raw_datasets,
    mean_length,
    text_column,
    tokenize_in_blocks,
    tokenize_lines,
    unused_split_percentage,
)
from ..common.driver import (
    check_padding_free,
    check_run,
    evaluate_and_save,
    leave_process_group,
    load_config,
    load_model,
    load_tokenizer,
    record_stage,
    require_splits,
    start_run,
    summary_line,
    train_and_save,
)
from ..common.loss import global_mean_loss
from ..common.masking import DeterministicallyMaskedDataset, MaskingEpochCallback
from ..common.metrics import masked_token_accuracy, predicted_tokens
from ..common.packing import flattening_collator
from ..common.sentence_pipeline import copy_pipeline

if TYPE_CHECKING:
    from transformers import Trainer

logger = logging.getLogger("hf_efficient_attn.tasks")

#: The percentage of the training rows held out for validation when the data have no validation split
#: and --validation_split_percentage is not given (run_mlm.py's default).
VALIDATION_SPLIT_PERCENTAGE = 5


@dataclass
class MLMDataArguments(DataArguments):
    """``run_mlm.py``'s data flags, plus the text column and the validation masking seed."""

    validation_split_percentage: int | None = field(
        default=None,
        metadata={
            "help": "Percent of the training rows (the first ones) held out for validation when the data have no "
            "validation split; refused when they have one (--validation_file, or a Hub dataset's). Default: "
            f"{VALIDATION_SPLIT_PERCENTAGE}."
        },
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Fraction of tokens to mask."})
    line_by_line: bool = field(
        default=False,
        metadata={"help": "One example per non-empty line (truncated), instead of full blocks of concatenated text."},
    )
    text_column_name: str | None = field(
        default=None, metadata={"help": "The column of a json/jsonl/csv file that holds the text. Default: text."}
    )
    eval_mask_seed: int = field(
        default=0,
        metadata={"help": "Seed of the validation masks (fixed, independent of --seed, so runs are comparable)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be between 0 and 1, got {self.mlm_probability}")
        if self.validation_split_percentage is not None and self.validation_file is not None:
            raise unused_split_percentage(self.validation_file)

    @property
    def split_percentage(self) -> int:
        """The percentage of the training rows carved out for validation from data without a validation split."""
        if self.validation_split_percentage is None:
            return VALIDATION_SPLIT_PERCENTAGE
        return self.validation_split_percentage


def masked_datasets(
    model_args: ModelArguments,
    data_args: MLMDataArguments,
    training_args: TrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
) -> tuple[DeterministicallyMaskedDataset | None, DeterministicallyMaskedDataset | None]:
    """The training and validation sets of the ``--do_*`` stages asked for (None otherwise): text
    tokenised into blocks of ``seq_len`` tokens (or lines), masked deterministically (training masks
    from ``--data_seed``/``--seed``, validation masks from ``--eval_mask_seed``)."""
    if tokenizer.mask_token is None:
        raise ValueError(f"the tokenizer of {model_args.model_name_or_path} has no mask token; MLM needs one")
    raw = load_raw_datasets(
        data_args.dataset_name,
        data_args.dataset_config_name,
        data_args.train_file,
        data_args.validation_file,
        data_args.validation_split_percentage,
        cache_dir=model_args.cache_dir,
        token=model_args.token,
        validation_needed=training_args.do_eval,
        default_split_percentage=VALIDATION_SPLIT_PERCENTAGE,
    )
    require_splits(raw, training_args)
    column = text_column(raw["train" if training_args.do_train else "validation"], data_args.text_column_name)
    prepare = tokenize_lines if data_args.line_by_line else tokenize_in_blocks
    tokenized = prepare(
        raw,
        tokenizer,
        column,
        seq_len,
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=not data_args.overwrite_cache,
        main_process_first=training_args.main_process_first(desc="tokenising"),
    )
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)
    mask_seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    train_set = eval_set = None
    if training_args.do_train:
        train_examples = first_rows(tokenized["train"], data_args.max_train_samples)
        train_set = DeterministicallyMaskedDataset(train_examples, masker, mask_seed)
    if training_args.do_eval:
        eval_examples = first_rows(tokenized["validation"], data_args.max_eval_samples)
        eval_set = DeterministicallyMaskedDataset(eval_examples, masker, data_args.eval_mask_seed)
    return train_set, eval_set


def mlm_trainer(
    model: PreTrainedModel,
    training_args: TrainingArguments,
    tokenizer: PreTrainedTokenizerBase,
    train_set: DeterministicallyMaskedDataset | None,
    eval_set: DeterministicallyMaskedDataset | None,
    callbacks: Sequence[TrainerCallback] = (),
    padding_free: bool = False,
) -> Trainer:
    """The crash-safe Trainer of masked-LM training: the step's global mean loss, masked-token
    accuracy on ``eval_set``, and the masks' epoch kept in step with training; ``padding_free``
    packs each batch into one row (``--padding_free``)."""
    from ..common.trainer import CrashSafeTrainer  # here, not at the top: scripts answer --help without Trainer

    # Padded: input_ids with the pad token and labels with -100 (blocks need none; lines do).
    collator = flattening_collator() if padding_free else DataCollatorForTokenClassification(tokenizer)
    return CrashSafeTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=collator,
        compute_loss_func=global_mean_loss,
        compute_metrics=masked_token_accuracy if eval_set is not None else None,
        preprocess_logits_for_metrics=predicted_tokens if eval_set is not None else None,
        callbacks=[*([MaskingEpochCallback(train_set)] if train_set is not None else []), *callbacks],
    )


def check_mlm_run(training_args: TrainingArguments) -> None:
    """:func:`~.driver.check_run`, and no persistent data-loader workers (their copies of the
    training set would keep epoch 0's masks)."""
    check_run(training_args)
    if training_args.dataloader_persistent_workers and training_args.dataloader_num_workers > 0:
        raise ValueError(
            "--dataloader_persistent_workers keeps each worker's copy of the training set, so the masks would not "
            "change between epochs; leave it off"
        )


def run_mlm(
    model_args: ModelArguments,
    data_args: MLMDataArguments,
    training_args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> dict:
    """Tokenise, train, evaluate and save as ``run_mlm.py``; returns all metrics. ``callbacks`` are
    added to the Trainer's."""
    check_mlm_run(training_args)
    config = load_config(model_args)
    check_padding_free(data_args.padding_free, model_args, config)
    model_limit = max_tokens(config)
    check_max_seq_length(data_args.max_seq_length, model_limit)
    checkpoint = start_run(training_args)

    tokenizer = load_tokenizer(model_args)
    seq_len = block_length(data_args, tokenizer.model_max_length, model_limit)
    train_set, eval_set = masked_datasets(model_args, data_args, training_args, tokenizer, seq_len)
    model = load_model(model_args, AutoModelForMaskedLM)
    trainer = mlm_trainer(model, training_args, tokenizer, train_set, eval_set, callbacks, data_args.padding_free)

    train_metrics = eval_metrics = None
    if train_set is not None:
        train_metrics = train_and_save(trainer, checkpoint, len(train_set))
    if eval_set is not None:
        eval_metrics = evaluate_and_save(trainer, len(eval_set), with_perplexity=True)
    if train_metrics is not None:
        record_stage(trainer, model_args, data_args, "masked-LM pretraining", "pretrain_mlm.py", seq_len,
                     train_metrics, eval_metrics)  # fmt: skip
        if trainer.is_world_process_zero():  # the same encoder, trained on: a sentence encoder stays one
            copy_pipeline(model_args.model_name_or_path, training_args.output_dir, **model_args.hub_kwargs())
    tokens_per_example = mean_length(train_set.examples) if train_set is not None else None
    line = summary_line(
        model, training_args.output_dir, train_metrics, tokens_per_example, eval_metrics, metric_label="masked-token accuracy"
    )
    if trainer.is_world_process_zero():
        print(line)
    return {**(train_metrics or {}), **(eval_metrics or {})}


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict:
    """Command line of ``scripts/pretrain_mlm.py``."""
    metrics = run_mlm(*parse_arguments((ModelArguments, MLMDataArguments, TrainingArguments), argv, __doc__), callbacks)
    leave_process_group()
    return metrics
