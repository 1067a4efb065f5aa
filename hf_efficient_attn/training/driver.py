"""What every training script does around ``Trainer``: logging, finding the checkpoint to
resume from, loading the tokenizer and the model with its attention method, training and
evaluating with the examples' output files, and the closing summary line."""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any

import datasets
import transformers
from datasets import Dataset
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from ..cpu_allocator import keep_freed_memory
from .args import ModelArguments

logger = logging.getLogger("hf_efficient_attn.training")


def setup_logging(training_args: TrainingArguments) -> None:
    """Transformers' examples' logging: info on the main process, warnings elsewhere."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.warning(
        f"process rank {training_args.process_index} of {training_args.world_size}, device {training_args.device}, "
        f"bf16 {training_args.bf16}, fp16 {training_args.fp16}"
    )


def check_precision(training_args: TrainingArguments) -> None:
    """``--fp16`` on a CPU is refused: Trainer accepts it there but runs in fp32 (Accelerate has
    no fp16 autocast on CPU; measured with Transformers 5.23 / Accelerate 1.15), so the flag
    would be silently ignored. ``--bf16`` does autocast on CPU."""
    if training_args.fp16 and training_args.device.type == "cpu":
        raise ValueError(
            "--fp16 needs a GPU: on CPU Trainer silently trains in fp32; use --bf16 (CPU autocast) or no flag"
        )


def checkpoint_to_resume(training_args: TrainingArguments) -> str | None:
    """``--resume_from_checkpoint`` if given, else the last ``checkpoint-*`` in ``output_dir``
    (as ``run_glue.py``: rerunning a stopped command continues it)."""
    if not training_args.do_train:
        return None
    if training_args.resume_from_checkpoint is not None:
        if not os.path.isdir(training_args.resume_from_checkpoint):
            raise ValueError(f"--resume_from_checkpoint {training_args.resume_from_checkpoint!r}: no such folder")
        return training_args.resume_from_checkpoint
    if not os.path.isdir(training_args.output_dir):
        return None
    last = get_last_checkpoint(training_args.output_dir)
    if last is not None:
        logger.info(f"found {last}: resuming from it (use another --output_dir to start afresh)")
    return last


def start_run(training_args: TrainingArguments) -> str | None:
    """What every training script does first, as Transformers' examples do: logging, the
    precision check, the checkpoint to resume from (returned) and the seed; on CPU also glibc's
    malloc set to keep freed memory (:func:`keep_freed_memory`: at long lengths it spares every
    step hundreds of thousands of page faults)."""
    setup_logging(training_args)
    check_precision(training_args)
    if training_args.device.type == "cpu" and keep_freed_memory():
        logger.info("glibc malloc keeps freed memory for reuse (set MALLOC_MMAP_THRESHOLD_ to choose otherwise)")
    checkpoint = checkpoint_to_resume(training_args)
    transformers.set_seed(training_args.seed)
    return checkpoint


def require_splits(raw: Any, training_args: TrainingArguments, include_test: bool = False) -> None:
    """``ValueError`` unless ``raw`` has the split each requested ``--do_*`` stage reads."""
    stages = {"do_train": "train", "do_eval": "validation", **({"do_predict": "test"} if include_test else {})}
    for flag, split in stages.items():
        if getattr(training_args, flag) and split not in raw:
            raise ValueError(f"--{flag} needs a {split} split: give --{split}_file or a dataset that has one")


def load_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path,
        use_fast=model_args.use_fast_tokenizer,
        **model_args.hub_kwargs(),
    )


def load_model(model_args: ModelArguments, auto_class: type, **config_kwargs: Any) -> PreTrainedModel:
    """``auto_class`` (an ``hea.AutoModel*``) from ``--model_name_or_path`` with ``--attn_impl`` /
    ``--attn_config`` (or the method saved in the checkpoint); ``config_kwargs`` override the
    config (e.g. ``num_labels``)."""
    hub_kwargs = model_args.hub_kwargs()
    config = AutoConfig.from_pretrained(
        model_args.config_name or model_args.model_name_or_path, **config_kwargs, **hub_kwargs
    )
    return auto_class.from_pretrained(
        model_args.model_name_or_path,
        config=config,
        attn_impl=model_args.attn_impl,
        attn_config=model_args.attn_options or None,
        **hub_kwargs,
    )


def train_and_save(trainer: Trainer, checkpoint: str | None, num_samples: int) -> dict[str, float]:
    """Train (resuming from ``checkpoint``), save the model and tokenizer, and write
    ``train_results.json`` and ``trainer_state.json`` as the examples do."""
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": num_samples}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def evaluate_and_save(
    trainer: Trainer,
    num_samples: int,
    with_perplexity: bool = False,
    other_sets: dict[str, Dataset] | None = None,
) -> dict[str, float]:
    """Evaluate and write ``eval_results.json`` (and ``all_results.json``); with
    ``with_perplexity``, add ``perplexity`` = exp(eval_loss) as ``run_mlm.py`` does.
    ``other_sets`` maps a suffix to another evaluation set whose metrics are added with that
    suffix (``run_glue.py``'s MNLI mismatched set: ``{"_mm": dataset}`` gives ``eval_accuracy_mm``)."""
    metrics = {**trainer.evaluate(), "eval_samples": num_samples}
    if with_perplexity:
        try:
            metrics["perplexity"] = math.exp(metrics["eval_loss"])
        except OverflowError:
            metrics["perplexity"] = float("inf")
    for suffix, dataset in (other_sets or {}).items():
        other = {**trainer.evaluate(eval_dataset=dataset), "eval_samples": len(dataset)}
        metrics.update({f"{key}{suffix}": value for key, value in other.items()})
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def summary_line(
    model: PreTrainedModel,
    train_metrics: dict[str, float] | None,
    tokens_per_example: float | None,
    eval_metrics: dict[str, float] | None,
    metric: str = "eval_accuracy",
    metric_label: str = "accuracy",
) -> str:
    """One closing line: method, training throughput in tokens/s and the main eval metric
    (``eval_metrics[metric]``, printed as ``metric_label``), eval loss and perplexity."""
    method = getattr(model.config, "attn_impl", None) or "exact (no attn_impl)"
    parts = [f"attention {method}"]
    if train_metrics and tokens_per_example:
        rate = train_metrics["train_samples_per_second"] * tokens_per_example
        parts.append(f"train {rate:,.0f} tokens/s ({train_metrics['train_runtime']:.1f} s)")
    if eval_metrics:
        parts.append(f"eval {metric_label} {eval_metrics[metric]:.4f}")
        parts.append(f"eval_loss {eval_metrics['eval_loss']:.4f}")
        if "perplexity" in eval_metrics:
            parts.append(f"perplexity {eval_metrics['perplexity']:.2f}")
    return "summary: " + ", ".join(parts)
