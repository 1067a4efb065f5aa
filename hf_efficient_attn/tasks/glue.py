"""Fine-tune an efficient-attention model on a GLUE task, or on your own labelled text, with
Trainer (``scripts/finetune_glue.py``): the downstream step of the MRA paper (Zeng et al., ICML 2022,
Tables 1 and 8: MNLI after swapping the attention), with the flags and output files of
Transformers' run_glue.py, plus --attn_impl / --attn_config and --peft lora. Works under torchrun
and accelerate launch (configs/accelerate/).

Reads: --task_name alone: nyu-mll/glue from the Hub; else --dataset_name, or local csv, tsv or
json/jsonl files (--train_file, --validation_file, --test_file). With --task_name, the files have
the task's Hub columns (e.g. sst2: sentence, label; mnli: premise, hypothesis, label), labels as
ids or names. Without it, the text is sentence1 and sentence2 when both are there, else the first
one or two string columns besides label and idx; the classes are the label column's distinct
values (float labels: regression). A test file may lack the label column.
Writes: into --output_dir, as run_glue.py: the model and tokenizer, train_results.json,
trainer_state.json, eval_results.json, all_results.json, predict_results_<task>.txt with
--do_predict (predict_results.txt without a task; index<TAB>prediction), checkpoint-N/ folders,
and provenance.json (what the model was made from, for push_to_hub.py's card).

Differences from run_glue.py, each for a reason: the metrics are computed offline with
scikit-learn / scipy (evaluate.load("glue") needs the Hub); a GLUE task also reads local files in
the Hub's column layout (MNLI's mismatched sets through --validation_mismatched_file /
--test_mismatched_file), their labels checked against the task's label set; the submission file
writes labels as the GLUE server reads them (ids for CoLA, SST-2, MRPC, QQP, WNLI; names for MNLI,
QNLI, RTE) and the test set's idx; the loss is the same on any number of processes.

examples:
  python scripts/finetune_glue.py --model_name_or_path roberta-base --attn_impl mra2 \\
      --task_name mnli --max_seq_length 512 --do_train --do_eval --output_dir outputs/mnli-mra2
  python scripts/finetune_glue.py configs/train/glue-mnli-roberta-base-mra2.json   # a whole configuration
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from transformers import (
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from .. import AutoModelForSequenceClassification
from ..integration.positions import max_tokens
from .common.adapters import PeftArguments, apply_lora
from .common.args import (
    DataArguments,
    ModelArguments,
    block_length,
    check_data_file,
    check_max_seq_length,
    check_positive_flags,
    parse_arguments,
)
from .common.data import first_rows, load_raw_datasets, mean_length
from .common.driver import (
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
from .common.loss import global_mean_loss
from .common.metrics import SCORE_NAMES, SequenceClassificationMetrics
from .common.packing import SequenceLabelFlattening

if TYPE_CHECKING:  # datasets is imported where it is used: scripts answer --help and flag errors without it
    from datasets import Dataset, DatasetDict
    from transformers import Trainer

logger = logging.getLogger("hf_efficient_attn.tasks")

#: The Hub dataset ``--task_name`` reads when no local file is given.
GLUE_HUB_DATASET = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task as the Hub's ``nyu-mll/glue`` holds it."""

    text_columns: tuple[str, str | None]
    #: Class names in id order (the Hub's ClassLabel); None: regression (STS-B).
    label_names: tuple[str, ...] | None
    #: A key of :data:`.metrics.SCORE_NAMES`: the task's official metric.
    metric: str
    #: The GLUE server reads class names (True) or ids (False) in the submission file.
    submits_names: bool = False


GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(("sentence", None), ("unacceptable", "acceptable"), "matthews_correlation"),
    "sst2": GlueTask(("sentence", None), ("negative", "positive"), "accuracy"),
    "mrpc": GlueTask(("sentence1", "sentence2"), ("not_equivalent", "equivalent"), "accuracy_and_f1"),
    "stsb": GlueTask(("sentence1", "sentence2"), None, "pearson_and_spearman"),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate"), "accuracy_and_f1"),
    "mnli": GlueTask(("premise", "hypothesis"), ("entailment", "neutral", "contradiction"), "accuracy", True),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment"), "accuracy", True),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment"), "accuracy", True),
    "wnli": GlueTask(("sentence1", "sentence2"), ("not_entailment", "entailment"), "accuracy"),
}

#: Hub split names of MNLI -> the names used here (and for local files).
MNLI_SPLITS = {
    "validation_matched": "validation",
    "validation_mismatched": "validation_mismatched",
    "test_matched": "test",
    "test_mismatched": "test_mismatched",
}
#: Label value of unlabelled (test) rows, as on the Hub.
NO_LABEL = -1


@dataclass
class GlueDataArguments(DataArguments):
    """``run_glue.py``'s data flags, plus MNLI's mismatched files for local data."""

    file_extensions: ClassVar[tuple[str, ...]] = ("json", "jsonl", "csv", "tsv")
    no_flag_help: ClassVar[dict[str, str]] = {
        "pad_to_max_length": "Pad each batch to its longest example instead of every example to --max_seq_length."
    }
    #: Flags of Transformers' run_classification.py that this script does without: what it does instead.
    flag_advice: ClassVar[dict[str, str]] = {
        "text_column_names": "finetune_glue.py takes the text columns from --task_name, else from the data: sentence1 "
        "and sentence2 when both are there, else the first one or two string columns besides label and idx",
        "label_column_name": "finetune_glue.py reads the labels from the column named label",
    }

    task_name: str | None = field(
        default=None,
        metadata={
            "help": "GLUE task: "
            + ", ".join(GLUE_TASKS)
            + f". Alone it reads {GLUE_HUB_DATASET} from the Hub; with local files it sets their columns, labels "
            "and metric. Default: the text columns and the classes come from the data (Reads: above), the metric is "
            "accuracy (mse for float labels); with no --train_file: the classes the model's config records (a "
            "fine-tuned model's id2label)."
        },
    )
    train_file: str | None = field(
        default=None, metadata={"help": "A local training file (csv, tsv or json/jsonl) in the task's column layout."}
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "A local validation file (csv, tsv or json/jsonl); MNLI: the matched one."}
    )
    test_file: str | None = field(
        default=None, metadata={"help": "A local test file (csv, tsv or json/jsonl) for --do_predict; MNLI: matched."}
    )
    validation_mismatched_file: str | None = field(
        default=None, metadata={"help": "MNLI: the local mismatched validation file (reported with the suffix _mm)."}
    )
    test_mismatched_file: str | None = field(
        default=None, metadata={"help": "MNLI: the local mismatched test file (predict_results_mnli-mm.txt)."}
    )
    max_seq_length: int | None = field(
        default=128, metadata={"help": "Tokens per example after tokenisation; longer inputs are truncated."}
    )
    pad_to_max_length: bool = field(
        default=True,
        metadata={"help": "Pad every example to --max_seq_length (--padding_free packs instead)."},
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many test examples (debugging, quick runs)."}
    )

    def __post_init__(self) -> None:
        if self.task_name is not None:
            self.task_name = self.task_name.lower()
            if self.task_name not in GLUE_TASKS:
                raise ValueError(f"--task_name {self.task_name!r}: unknown; allowed: {', '.join(GLUE_TASKS)}")
        local = [self.train_file, self.validation_file, *self.local_files().values()]
        if self.task_name is not None and self.dataset_name is None and self.dataset_config_name is None and not any(local):
            self.dataset_name, self.dataset_config_name = GLUE_HUB_DATASET, self.task_name
        super().__post_init__()
        for flag in ("test_file", "validation_mismatched_file", "test_mismatched_file"):
            check_data_file(flag, getattr(self, flag), self.file_extensions)
        if (self.validation_mismatched_file or self.test_mismatched_file) and self.task_name != "mnli":
            raise ValueError("--validation_mismatched_file / --test_mismatched_file are MNLI's: add --task_name mnli")
        check_positive_flags(self, "max_predict_samples")

    def local_files(self) -> dict[str, str | None]:
        """Split name -> local file, for the splits beyond train/validation."""
        return {
            "validation_mismatched": self.validation_mismatched_file,
            "test": self.test_file,
            "test_mismatched": self.test_mismatched_file,
        }


def load_glue_splits(data_args: GlueDataArguments, cache_dir: str | None = None, token: str | None = None) -> DatasetDict:
    """The raw splits, named ``train``, ``validation``, ``test`` (and MNLI's
    ``validation_mismatched``, ``test_mismatched``) whether from the Hub or local files."""
    raw = load_raw_datasets(
        data_args.dataset_name,
        data_args.dataset_config_name,
        data_args.train_file,
        data_args.validation_file,
        validation_split_percentage=None,
        cache_dir=cache_dir,
        token=token,
        extra_files=data_args.local_files() if data_args.dataset_name is None else None,
    )
    return type(raw)({MNLI_SPLITS.get(name, name): rows for name, rows in raw.items()})  # a DatasetDict


def text_columns(task: GlueTask | None, rows: Dataset, split: str) -> tuple[str, str | None]:
    """The task's input columns (``ValueError`` naming those present when one is missing), or
    without a task ``run_glue.py``'s choice among the text (string) columns: ``sentence1`` /
    ``sentence2`` if present, else the first two other than ``label``, else the only one. Columns of
    numbers (an ``id``, an ``idx``) are never text."""
    columns = rows.column_names
    if task is not None:
        needed = [c for c in task.text_columns if c is not None]
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ValueError(f"the {split} data has no column {missing[0]!r}: this task reads {needed}; it has {list(columns)}")
        return task.text_columns
    if "sentence1" in columns and "sentence2" in columns:
        return "sentence1", "sentence2"
    inputs = [
        c for c in columns if c not in ("label", "idx") and getattr(rows.features[c], "dtype", None) in ("string", "large_string")
    ]
    if not inputs:
        kinds = ", ".join(f"{c} ({getattr(rows.features[c], 'dtype', type(rows.features[c]).__name__)})" for c in columns)
        raise ValueError(
            f"the {split} data has no text column besides label/idx: its columns are {kinds}; without --task_name the "
            "text is the first one or two string columns (or sentence1 and sentence2)"
        )
    return inputs[0], (inputs[1] if len(inputs) > 1 else None)


def label_names_of(task: GlueTask | None, train: Dataset | None, config: Any = None) -> tuple[str, ...] | None:
    """The class names in id order: the task's, else (no task) the sorted distinct training
    labels as ``run_glue.py``, else (no training data: predicting or evaluating with a fine-tuned
    model) the labels its ``config`` knows; None for regression (STS-B, float labels without a task,
    or a fine-tuned regression model)."""
    if task is not None:
        return task.label_names
    if train is None:
        known = model_label_names(config)
        if known is None:
            raise ValueError(
                "without --task_name the labels are read from the training data, or from a model fine-tuned with them "
                "(its config.json's id2label): give --train_file, or such a model as --model_name_or_path"
            )
        return known or None  # () for a regression model
    if "label" not in train.column_names:
        raise ValueError(f"the training data has no 'label' column; its columns are {train.column_names}")
    if str(getattr(train.features["label"], "dtype", "")).startswith("float"):  # float16, float32, float64
        return None
    return tuple(str(value) for value in sorted(train.unique("label")))


def model_label_names(config: Any) -> tuple[str, ...] | None:
    """The class names a fine-tuned classifier's config records (``id2label`` in id order), ``()``
    for a fine-tuned regression model, or None when it records none (Transformers' placeholder
    names ``LABEL_0``, ``LABEL_1``, ... of a model never fine-tuned with labels)."""
    if config is None:
        return None
    if getattr(config, "problem_type", None) == "regression":
        return ()
    names = tuple(str(config.id2label[i]) for i in range(config.num_labels)) if config.id2label else ()
    placeholders = tuple(f"LABEL_{i}" for i in range(len(names)))
    return names if names and names != placeholders else None


def label_id(value: Any, names: tuple[str, ...] | None, split: str, ids: bool = True) -> int | float:
    """A label as the model's target: the float itself for regression; for classes, a name of
    ``names`` or (with ``ids``, a GLUE task's labels) an id in ``0..len(names)-1``; ``-1`` marks
    an unlabelled test row. Without ``ids`` (labels read from the data) values are names only."""
    if names is None:
        if isinstance(value, str) or value is None:
            raise ValueError(f"the {split} data has a non-numeric regression label {value!r}")
        return float(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value == NO_LABEL and split.startswith("test"):
            return NO_LABEL
        if ids and 0 <= value < len(names):
            return int(value)
    if str(value) in names:
        return names.index(str(value))
    raise ValueError(
        f"the {split} data has label {value!r}; allowed: {', '.join(names)}"
        + (f" or their ids 0..{len(names) - 1}" if ids else "")
        + (" (-1 for unlabelled test rows)" if split.startswith("test") else "")
    )


def tokenize_splits(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    task: GlueTask | None,
    names: tuple[str, ...] | None,
    max_length: int,
    pad_to_max_length: bool,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    main_process_first: Any = None,
) -> DatasetDict:
    """Tokenise each split's text (pairs as ``[CLS] a [SEP] b [SEP]``), truncated to
    ``max_length``; ``labels`` as model targets where the split has a ``label`` column."""

    def prepare(split: str, rows: Dataset) -> Dataset:
        first, second = text_columns(task, rows, split)
        logger.info(f"{split}: text from column {first!r}" + (f" and {second!r}" if second else ""))

        def tokenize(batch: dict[str, list]) -> dict[str, list]:
            texts = (batch[first],) if second is None else (batch[first], batch[second])
            padding = "max_length" if pad_to_max_length else False
            encoded = tokenizer(*texts, padding=padding, max_length=max_length, truncation=True)
            if "label" in batch:
                encoded["labels"] = [label_id(value, names, split, ids=task is not None) for value in batch["label"]]
            return encoded

        return rows.map(
            tokenize,
            batched=True,
            num_proc=num_proc,
            remove_columns=rows.column_names,
            load_from_cache_file=load_from_cache_file,
            desc=f"Tokenising the {split} split",
        )

    with main_process_first or contextlib.nullcontext():
        return type(raw)({split: prepare(split, rows) for split, rows in raw.items()})  # a DatasetDict


def write_predictions(
    path: str, indices: Sequence[int], predictions: np.ndarray, names: tuple[str, ...] | None, submits_names: bool
) -> None:
    """``index<TAB>prediction`` lines under a header, the GLUE submission format: a score with
    3 decimals for regression, else the class name or id as the task's server reads it."""
    with open(path, "w") as f:
        f.write("index\tprediction\n")
        for index, value in zip(indices, predictions):
            if names is None:
                label = f"{value:3.3f}"
            else:
                label = names[int(value)] if submits_names else str(int(value))
            f.write(f"{index}\t{label}\n")


def check_labelled(raw: DatasetDict, task: GlueTask | None, training_args: TrainingArguments) -> None:
    """Before any model is loaded: every split has the task's text columns, and those that
    ``--do_train`` / ``--do_eval`` read have a ``label`` column (a test file may lack it)."""
    labelled = {"train": training_args.do_train, "validation": training_args.do_eval,
                "validation_mismatched": training_args.do_eval}  # fmt: skip
    for split, rows in raw.items():
        text_columns(task, rows, split)
        if labelled.get(split) and "label" not in rows.column_names:
            flag = "--do_train" if split == "train" else "--do_eval"
            raise ValueError(f"the {split} data has no 'label' column (its columns are {rows.column_names}); {flag} needs one")


def run_glue(
    model_args: ModelArguments,
    data_args: GlueDataArguments,
    peft_args: PeftArguments,
    training_args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> dict:
    """Tokenise, fine-tune, evaluate, predict and save as ``run_glue.py``; returns all metrics.
    ``callbacks`` are added to the Trainer's."""
    check_run(training_args, stages=("do_train", "do_eval", "do_predict"))
    config = load_config(model_args)
    check_max_seq_length(data_args.max_seq_length, max_tokens(config))
    check_padding_free(data_args.padding_free, model_args, config, sequence_head=True)
    checkpoint = start_run(training_args)

    raw = load_glue_splits(data_args, model_args.cache_dir, model_args.token)
    require_splits(raw, training_args, include_test=True)
    task = GLUE_TASKS[data_args.task_name] if data_args.task_name else None
    check_labelled(raw, task, training_args)
    names = label_names_of(task, raw.get("train"), config)
    regression = names is None

    tokenizer = load_tokenizer(model_args)
    config_kwargs: dict[str, Any] = {"num_labels": 1 if regression else len(names)}
    if regression:
        # Recorded in the saved config: Transformers' models set it only when they compute the loss
        # themselves (here global_mean_loss does), and without it the text-classification pipeline
        # squashes a score through a sigmoid and a predict-only rerun cannot tell a regression model.
        config_kwargs["problem_type"] = "regression"
    else:
        config_kwargs["id2label"] = dict(enumerate(names))
        config_kwargs["label2id"] = {name: i for i, name in enumerate(names)}
    model = load_model(model_args, AutoModelForSequenceClassification, **config_kwargs)
    max_length = block_length(data_args, tokenizer.model_max_length, max_tokens(model.config))
    if peft_args.peft == "lora":
        # BERT-style heads read the pooler, which a masked-LM checkpoint lacks (then it is newly
        # initialised, like the classifier): train and save it with the head, or a reloaded
        # adapter would meet another random pooler.
        pooler = [name for name, _ in model.named_modules() if name.rsplit(".", 1)[-1] == "pooler"]
        model = apply_lora(model, peft_args, task_type="SEQ_CLS", also_save=["pooler"] if pooler else [])

    tokenized = tokenize_splits(
        raw,
        tokenizer,
        task,
        names,
        max_length,
        data_args.pad_to_max_length and not data_args.padding_free,
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=not data_args.overwrite_cache,
        main_process_first=training_args.main_process_first(desc="tokenising"),
    )
    train_set = first_rows(tokenized["train"], data_args.max_train_samples) if training_args.do_train else None
    eval_sets = {}
    if training_args.do_eval:
        eval_sets = {
            suffix: first_rows(tokenized[split], data_args.max_eval_samples)
            for suffix, split in (("", "validation"), ("_mm", "validation_mismatched"))
            if split in tokenized
        }
    metric = task.metric if task else ("mse" if regression else "accuracy")
    if data_args.padding_free:
        collator = SequenceLabelFlattening()
    elif data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        multiple = 8 if training_args.fp16 or training_args.bf16 else None
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)
    from .common.trainer import CrashSafeTrainer  # here, not at the top: scripts answer --help without Trainer

    trainer = CrashSafeTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_sets.get(""),
        processing_class=tokenizer,
        data_collator=collator,
        compute_loss_func=global_mean_loss,
        compute_metrics=SequenceClassificationMetrics(metric, regression),
        callbacks=list(callbacks),
    )

    train_metrics = eval_metrics = None
    if train_set is not None:
        train_metrics = train_and_save(trainer, checkpoint, len(train_set))
    if eval_sets:
        others = {suffix: rows for suffix, rows in eval_sets.items() if suffix}
        eval_metrics = evaluate_and_save(trainer, len(eval_sets[""]), other_sets=others)
    if training_args.do_predict:
        predict_and_save(trainer, raw, tokenized, data_args, names, task)
    if train_metrics is not None:
        stage = f"GLUE {data_args.task_name.upper()} fine-tuning" if task else "sequence-classification fine-tuning"
        record_stage(trainer, model_args, data_args, stage, "finetune_glue.py", max_length, train_metrics, eval_metrics)

    scores = SCORE_NAMES[metric]
    main_score = "combined_score" if len(scores) > 1 else scores[0]
    line = summary_line(
        model,
        training_args.output_dir,
        train_metrics,
        mean_length(train_set),
        eval_metrics,
        f"eval_{main_score}",
        main_score.replace("_", " "),
    )
    if trainer.is_world_process_zero():
        print(line)
    return {**(train_metrics or {}), **(eval_metrics or {})}


def predict_and_save(
    trainer: Trainer,
    raw: DatasetDict,
    tokenized: DatasetDict,
    data_args: GlueDataArguments,
    names: tuple[str, ...] | None,
    task: GlueTask | None,
) -> None:
    """Predict each test split and write ``predict_results_<task>.txt`` (MNLI's mismatched set:
    ``predict_results_mnli-mm.txt``), indexed by the test set's ``idx`` column when it has one."""
    scorer = trainer.compute_metrics
    for split, suffix in (("test", ""), ("test_mismatched", "-mm")):
        if split not in tokenized:
            continue
        rows = first_rows(tokenized[split], data_args.max_predict_samples)
        if "labels" in rows.column_names:
            rows = rows.remove_columns("labels")  # test labels are -1 (or absent)
        logits = trainer.predict(rows, metric_key_prefix="predict").predictions
        source = raw[split]
        indices = source["idx"][: len(rows)] if "idx" in source.column_names else range(len(rows))
        name = f"predict_results_{data_args.task_name}{suffix}.txt" if data_args.task_name else "predict_results.txt"
        if trainer.is_world_process_zero():
            path = os.path.join(trainer.args.output_dir, name)
            # A GLUE task's server reads ids or names as its format says; local data: the names the model knows.
            write_predictions(path, indices, scorer.predictions(logits), names, task is None or task.submits_names)
            logger.info(f"wrote {path}")


#: Real labelled English text shipped with gensim (offline), written as a single-sentence task.
OFFLINE_SAMPLES = ("movie_reviews", "newsgroups")


def write_offline_sample(name: str, output_dir: str, validation_every: int = 4) -> dict[str, int]:
    """Write ``train.csv`` / ``validation.csv`` in SST-2's layout (``sentence,label``) from real
    text available offline: ``movie_reviews`` (200 sentences, label 0 negative / 1 positive as
    SST-2's ids: run with ``--task_name sst2``) or ``newsgroups`` (200 posts of 40-7000 tokens,
    label alt.atheism / sci.space: run without a task, scored by accuracy). Every
    ``validation_every``-th example of each label is held out. Returns the row counts."""
    import pandas as pd

    from .common.corpus import movie_review_sentences, newsgroup_posts

    readers = {"movie_reviews": movie_review_sentences, "newsgroups": newsgroup_posts}
    if name not in readers:
        raise ValueError(f"unknown offline sample {name!r}; allowed: {', '.join(OFFLINE_SAMPLES)}")
    if validation_every < 2:
        raise ValueError(f"validation_every must be at least 2, got {validation_every}")
    splits: dict[str, list] = {"train": [], "validation": []}
    seen: dict[Any, int] = {}
    for text, label in readers[name]():
        seen[label] = seen.get(label, 0) + 1
        splits["validation" if seen[label] % validation_every == 0 else "train"].append((text, label))
    os.makedirs(output_dir, exist_ok=True)
    for split, rows in splits.items():
        pd.DataFrame(rows, columns=["sentence", "label"]).to_csv(os.path.join(output_dir, f"{split}.csv"), index=False)
    return {split: len(rows) for split, rows in splits.items()}


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict:
    """Command line of ``scripts/finetune_glue.py``."""
    arguments = parse_arguments((ModelArguments, GlueDataArguments, PeftArguments, TrainingArguments), argv, __doc__)
    metrics = run_glue(*arguments, callbacks)
    leave_process_group()
    return metrics
