"""Fine-tune an efficient-attention model on WikiHop with Trainer (``scripts/finetune_wikihop.py``):
the multi-hop reading task of the Longformer paper (Beltagy et al. 2020, section 6) that the MRA
paper (Zeng et al., ICML 2022) fine-tunes its 4096-token MRA-2 RoBERTa on (Table 8: batch 32, lr
5e-5, 15 epochs). The question and candidates come first, wrapped in new marker tokens whose
embeddings start at the mean of the existing ones, then the documents, in chunks of
--max_seq_length tokens; each candidate gets one score, summed over the chunks. Flags: those of
Transformers' examples and every TrainingArguments flag, plus --attn_impl / --attn_config and
--max_chunks. Works under torchrun and accelerate launch (configs/accelerate/).

Reads: qangaroo JSON files (--train_file, --validation_file: WikiHop's train.json and dev.json, a
JSON array, or JSON lines, of objects with id, query, answer, candidates and supports), or a Hub
dataset in that schema (--dataset_name community-datasets/qangaroo --dataset_config_name wikihop).
Writes: into --output_dir: the model and tokenizer, train_results.json, trainer_state.json,
eval_results.json (eval_accuracy), all_results.json, predictions.json (each example's id -> its
predicted candidate, the official WikiHop evaluation's input), checkpoint-N/ folders, and
provenance.json (what the model was made from, for push_to_hub.py's card).

examples:
  python scripts/finetune_wikihop.py --model_name_or_path outputs/mlm-roberta-base-4096-mra2 \\
      --train_file qangaroo_v1.1/wikihop/train.json --validation_file qangaroo_v1.1/wikihop/dev.json \\
      --max_seq_length 4096 --do_train --do_eval --output_dir outputs/wikihop
  python scripts/finetune_wikihop.py configs/train/wikihop-roberta-base-4096-mra2.json   # a whole configuration
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from transformers import EvalPrediction, TrainerCallback, TrainingArguments

from ...integration.positions import max_tokens
from ..common.args import (
    DataArguments,
    ModelArguments,
    block_length,
    check_max_seq_length,
    check_positive_flags,
    parse_arguments,
)
from ..common.data import first_rows, mean_length
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
from .data import (
    ChunkCollator,
    ChunkEncoder,
    PackedChunkCollator,
    add_markers,
    encode_splits,
    fit_embeddings_to,
    load_qangaroo,
)
from .heads import AutoModelForCandidateScoring

logger = logging.getLogger("hf_efficient_attn.tasks")

PREDICTIONS_FILE = "predictions.json"


@dataclass
class WikiHopDataArguments(DataArguments):
    """The data flags of Transformers' examples for qangaroo JSON files or a Hub dataset, plus
    how long inputs are chunked."""

    file_extensions: ClassVar[tuple[str, ...]] = ("json", "jsonl")

    train_file: str | None = field(
        default=None, metadata={"help": "A qangaroo JSON file of training examples (WikiHop's train.json)."}
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "A qangaroo JSON file of evaluation examples (WikiHop's dev.json)."}
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per chunk (question, candidates and a slice of the documents). Default: the "
            "tokenizer's model_max_length, capped by the model's position table."
        },
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={
            "help": "Pad every chunk to --max_seq_length (--padding_free packs the chunks instead). Default: pad "
            "each batch to its longest chunk."
        },
    )
    max_chunks: int | None = field(
        default=None,
        metadata={
            "help": "Keep at most this many chunks of --max_seq_length tokens per example (the first ones). "
            "Default: every chunk, so every document is read."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_flags(self, "max_chunks")
        if self.pad_to_max_length and self.padding_free:
            raise ValueError("--pad_to_max_length and --padding_free: packed chunks have no padding; give one of them")


class CandidateAccuracy:
    """``compute_metrics``: the share of examples whose best-scoring candidate is the answer.
    ``candidate_counts`` are the evaluation examples' numbers of candidates (Trainer pads the
    scores of batches with fewer candidates); ``predicted`` keeps the last evaluation's predicted
    candidate indices, for ``predictions.json``."""

    def __init__(self, candidate_counts: Sequence[int]):
        self.candidate_counts = list(candidate_counts)
        self.predicted: list[int] = []

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        scores = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        if len(scores) != len(self.candidate_counts):
            raise ValueError(f"{len(scores)} predictions for {len(self.candidate_counts)} evaluation examples")
        self.predicted = [int(np.argmax(row[:count])) for row, count in zip(scores, self.candidate_counts)]
        return {"accuracy": float(np.mean(np.asarray(self.predicted) == np.asarray(prediction.label_ids)))}


def write_predictions(path: str, ids: Sequence[str], candidates: Sequence[Sequence[str]], predicted: Sequence[int]) -> dict:
    """``{id: predicted candidate}`` as JSON (the official WikiHop evaluation's input)."""
    predictions = {example_id: options[index] for example_id, options, index in zip(ids, candidates, predicted)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(predictions, f, indent=1)
    return predictions


def run_wikihop(
    model_args: ModelArguments,
    data_args: WikiHopDataArguments,
    training_args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> dict:
    """Tokenise, train, evaluate and save; returns all metrics. ``callbacks`` are added to the
    Trainer's."""
    if training_args.do_predict:
        raise ValueError(
            "--do_predict is not supported: WikiHop's test answers are hidden; use --do_eval on a file instead: it "
            f"writes {PREDICTIONS_FILE} for its examples"
        )
    check_run(training_args)
    config = load_config(model_args)
    model_limit = max_tokens(config)
    check_max_seq_length(data_args.max_seq_length, model_limit)
    check_padding_free(data_args.padding_free, model_args, config)
    checkpoint = start_run(training_args)

    raw = load_qangaroo(
        data_args.dataset_name,
        data_args.dataset_config_name,
        data_args.train_file,
        data_args.validation_file,
        cache_dir=model_args.cache_dir,
        token=model_args.token,
    )
    require_splits(raw, training_args)
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    wanted = {"train": training_args.do_train, "validation": training_args.do_eval}
    raw = type(raw)({split: first_rows(raw[split], limits[split]) for split in raw if wanted[split]})

    tokenizer = load_tokenizer(model_args)
    added = add_markers(tokenizer)
    max_length = block_length(data_args, tokenizer.model_max_length, model_limit)
    encoded = encode_splits(
        raw,
        ChunkEncoder(tokenizer, max_length, data_args.max_chunks),
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=not data_args.overwrite_cache,
        main_process_first=training_args.main_process_first(desc="tokenising"),
    )
    model = load_model(model_args, AutoModelForCandidateScoring)
    grown = fit_embeddings_to(model, tokenizer)
    if added or grown:
        logger.info(f"added {added} marker tokens to the tokenizer and {grown} embedding rows (at the mean) to the model")
    train_set, eval_set = encoded.get("train"), encoded.get("validation")
    accuracy = CandidateAccuracy([len(c) for c in raw["validation"]["candidates"]]) if eval_set is not None else None
    if data_args.padding_free:
        collator = PackedChunkCollator()
    else:
        collator = ChunkCollator(tokenizer.pad_token_id, max_length if data_args.pad_to_max_length else None)
    from ..common.trainer import CrashSafeTrainer  # here, not at the top: scripts answer --help without Trainer

    trainer = CrashSafeTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=collator,
        compute_loss_func=global_mean_loss,
        compute_metrics=accuracy,
        callbacks=list(callbacks),
    )

    train_metrics = eval_metrics = None
    if train_set is not None:
        train_metrics = train_and_save(trainer, checkpoint, len(train_set))
    if eval_set is not None:
        eval_metrics = evaluate_and_save(trainer, len(eval_set))
        if trainer.is_world_process_zero():
            path = os.path.join(training_args.output_dir, PREDICTIONS_FILE)
            write_predictions(path, raw["validation"]["id"], raw["validation"]["candidates"], accuracy.predicted)
            logger.info(f"wrote {path}")
    if train_metrics is not None:
        record_stage(trainer, model_args, data_args, "WikiHop fine-tuning", "finetune_wikihop.py", max_length,
                     train_metrics, eval_metrics)  # fmt: skip
    line = summary_line(
        model, training_args.output_dir, train_metrics, mean_length(train_set), eval_metrics, metric_label="accuracy"
    )
    if trainer.is_world_process_zero():
        print(line)
    return {**(train_metrics or {}), **(eval_metrics or {})}


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict:
    """Command line of ``scripts/finetune_wikihop.py``."""
    arguments = parse_arguments((ModelArguments, WikiHopDataArguments, TrainingArguments), argv, __doc__)
    metrics = run_wikihop(*arguments, callbacks)
    leave_process_group()
    return metrics
