"""What every training script does around ``Trainer``: checking its flags before anything is
loaded, logging, crash-safe checkpoints and finding the one to resume from, loading the tokenizer
and the model with its attention method, training and evaluating with the examples' output files,
and the closing summary line."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import transformers
import transformers.integrations
from huggingface_hub.errors import LocalEntryNotFoundError
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...integration.architectures import packed_pooling_refusal
from ...registry import resolve_method
from ...utils.cpu_allocator import keep_freed_memory
from ...utils.files import write_json
from .args import ModelArguments, not_downloadable
from .loading import load_with_new_head
from .provenance import data_description, source_record, write_provenance

if TYPE_CHECKING:  # datasets and Trainer (which imports datasets) are imported where they are used:
    # scripts answer --help and flag errors without them
    from datasets import Dataset
    from transformers import Trainer

logger = logging.getLogger("hf_efficient_attn.tasks")


def setup_logging(training_args: TrainingArguments) -> None:
    """Logging with ``--log_level`` / ``--log_level_replica`` as Trainer reads them: an explicit level
    applies to this package, Transformers and ``datasets`` alike (``--log_level info``: every line of
    Transformers' examples); the default, ``passive``, leaves the libraries at their own level
    (warnings) and shows this package's own lines (what was loaded, resumed, dropped) on the main
    process. ``--disable_tqdm`` also hides the libraries' own progress bars (loading, tokenising,
    saving), not only Trainer's."""
    from datasets.utils import logging as datasets_logging

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    level = training_args.get_process_log_level()  # passive: the libraries' current level
    passive = training_args.log_level == "passive"
    logger.setLevel(logging.INFO if passive and training_args.should_log else level)
    datasets_logging.set_verbosity(level)
    datasets_logging.disable_propagation()  # it has its own handler: through the root's too, each line showed twice
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    if training_args.disable_tqdm:
        datasets_logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
    if training_args.world_size > 1:
        logger.warning(
            f"process rank {training_args.process_index} of {training_args.world_size}, device {training_args.device}, "
            f"bf16 {training_args.bf16}, fp16 {training_args.fp16}"
        )


def check_precision(training_args: TrainingArguments) -> None:
    """``--fp16`` on a CPU is refused: Trainer accepts it there but runs in fp32 (Accelerate has
    no fp16 autocast on CPU; measured with Transformers 5.23 / Accelerate 1.15), so the flag
    would be silently ignored. ``--bf16`` does autocast on CPU."""
    if training_args.fp16 and training_args.device.type == "cpu":
        raise ValueError("--fp16 needs a GPU: on CPU Trainer silently trains in fp32; use --bf16 (CPU autocast) or no flag")


#: ``--report_to`` names whose availability check in ``transformers.integrations`` has another name.
_REPORTER_CHECKS = {"comet_ml": "comet", "azure_ml": "azureml", "flyte": "flytekit"}
#: ``--report_to`` names whose package (PyPI) has another name.
_REPORTER_PACKAGES = {"azure_ml": "azureml-core", "flyte": "flytekit"}


def check_report_to(training_args: TrainingArguments) -> None:
    """``ValueError`` for a ``--report_to`` tracker whose package is not installed (Trainer would
    fail later, for TensorBoard with advice to update PyTorch)."""
    for name in training_args.report_to or []:
        available = getattr(transformers.integrations, f"is_{_REPORTER_CHECKS.get(name, name)}_available", None)
        if available is not None and not available():
            hint = " (or pip install -e '.[train]')" if name == "tensorboard" else ""
            package = _REPORTER_PACKAGES.get(name, name)
            raise ValueError(
                f"--report_to {name} needs the {package} package: pip install {package}{hint}, or pass --report_to none"
            )


def check_run(training_args: TrainingArguments, stages: Sequence[str] = ("do_train", "do_eval")) -> None:
    """The run's own flags, checked before anything is loaded: something to do (one of ``stages``),
    an ``--output_dir`` that can be a folder, ``--fp16`` only on a GPU, ``--report_to`` trackers
    that are installed and a ``--resume_from_checkpoint`` that exists. Flags that Trainer would
    parse and the run would not honour are refused: ``--do_predict`` where ``stages`` has no
    prediction, ``--label_smoothing_factor``, ``--prediction_loss_only`` and ``--batch_eval_metrics``."""
    runs = " and/or ".join(f"--{stage}" for stage in stages)
    if training_args.do_predict and "do_predict" not in stages:
        raise ValueError(f"--do_predict: this script has no prediction stage; it runs {runs}")
    if training_args.label_smoothing_factor:
        # Trainer skips its label smoother whenever a compute_loss_func is given.
        raise ValueError(
            "--label_smoothing_factor has no effect here: the loss is the mean over the step's items "
            "(tasks/common/loss.py), which Trainer does not smooth; leave it at 0"
        )
    if training_args.prediction_loss_only:
        raise ValueError(
            "--prediction_loss_only would drop the predictions that the evaluation scores (accuracy) and writes; leave it off"
        )
    if training_args.batch_eval_metrics:
        raise ValueError(
            "--batch_eval_metrics would score each evaluation batch on its own, but these scripts score the whole "
            "evaluation set at once (accuracy over all masked tokens, Matthews correlation, F1, ...); leave it out"
        )
    if not any(getattr(training_args, stage) for stage in stages):
        raise ValueError(f"nothing to do: pass {runs}")
    output_dir = training_args.output_dir
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output_dir {output_dir!r} is a file; give a folder (new, or this run's to resume it)")
    check_precision(training_args)
    check_report_to(training_args)
    resume = training_args.resume_from_checkpoint
    if training_args.do_train and resume is not None and not os.path.isdir(resume):
        raise ValueError(f"--resume_from_checkpoint {resume!r}: no such folder")


def check_padding_free(
    padding_free: bool, model_args: ModelArguments, config: PretrainedConfig, sequence_head: bool = False
) -> None:
    """``--padding_free`` needs this package's attention (``--attn_impl`` or the method saved in
    ``config``), which keeps packed sequences apart, and for a ``sequence_head`` (a sequence
    classifier) a head that reads each sequence's first token."""
    if not padding_free:
        return
    if resolve_method(config, model_args.attn_impl) is None:
        raise ValueError(
            "--padding_free needs an attention method of this package (--attn_impl, e.g. softmax or mra2): "
            "Transformers' own attention would let the packed sequences attend to each other"
        )
    refusal = packed_pooling_refusal(config) if sequence_head else None
    if refusal is not None:
        raise ValueError(f"--padding_free: this model's {refusal}")


def from_flag(load: Callable[..., Any], model_args: ModelArguments, flag: str, **kwargs: Any) -> Any:
    """``load`` (a ``from_pretrained``) of what ``--flag`` names, falling back to ``--model_name_or_path``;
    a Hub id neither cached nor downloadable is one error naming the flag that gave it."""
    flag = flag if getattr(model_args, flag) else "model_name_or_path"
    try:
        return load(getattr(model_args, flag), **kwargs, **model_args.hub_kwargs())
    except OSError as err:
        if isinstance(err.__cause__, LocalEntryNotFoundError):  # Transformers' "couldn't connect" error
            raise not_downloadable(flag, getattr(model_args, flag)) from None
        raise


def load_config(model_args: ModelArguments, **config_kwargs: Any) -> PretrainedConfig:
    """The checkpoint's config (``--config_name`` or ``--model_name_or_path``): read first, so that a
    model that cannot be found is an error before any data or weights are loaded."""
    return from_flag(AutoConfig.from_pretrained, model_args, "config_name", **config_kwargs)


# ---- crash-safe checkpoints ---------------------------------------------------------------------

#: Written into ``checkpoint-N/`` once every process has written its files: a checkpoint without it
#: was interrupted (or written by a plain Trainer) and is never chosen to resume from.
COMPLETE_MARKER = "checkpoint_complete.json"


def mark_complete(folder: str, global_step: int) -> None:
    """Write :data:`COMPLETE_MARKER` into ``folder`` atomically (a temporary file, then a rename)."""
    write_json(os.path.join(folder, COMPLETE_MARKER), {"global_step": global_step})


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMPLETE_MARKER))


def last_complete_checkpoint(output_dir: str) -> tuple[str | None, list[str]]:
    """The complete ``checkpoint-N`` of ``output_dir`` with the highest N (None if none), and the
    incomplete ones above it, which were skipped."""
    steps = {}
    for name in os.listdir(output_dir):
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps[int(match.group(1))] = os.path.join(output_dir, name)
    skipped = []
    for step in sorted(steps, reverse=True):
        if is_complete(steps[step]):
            return steps[step], skipped
        skipped.append(steps[step])
    return None, skipped


def checkpoint_to_resume(training_args: TrainingArguments) -> str | None:
    """``--resume_from_checkpoint`` if given, else the last complete ``checkpoint-*`` in
    ``output_dir`` (as ``run_glue.py``: rerunning a stopped command continues it), saying in the log
    which one it resumes from and which incomplete ones it skipped."""
    if not training_args.do_train:
        return None
    if training_args.resume_from_checkpoint is not None:
        if not is_complete(training_args.resume_from_checkpoint):
            logger.warning(
                f"{training_args.resume_from_checkpoint} has no {COMPLETE_MARKER}: it may be incomplete (interrupted "
                "while being written); resuming from it as --resume_from_checkpoint asks"
            )
        return training_args.resume_from_checkpoint
    if not os.path.isdir(training_args.output_dir):
        return None
    last, skipped = last_complete_checkpoint(training_args.output_dir)
    for folder in skipped:
        logger.warning(f"skipped {folder}: incomplete (no {COMPLETE_MARKER}; its save was interrupted)")
    if last is not None:
        logger.warning(f"resuming from {last}, the last complete checkpoint (use another --output_dir to start afresh)")
    elif skipped:
        logger.warning("no complete checkpoint to resume from: training starts from the beginning")
    return last


def start_run(training_args: TrainingArguments) -> str | None:
    """What every training script does once its flags are checked (:func:`check_run`), as
    Transformers' examples do: logging, the checkpoint to resume from (returned) and the seed; on
    CPU also no pinned memory and glibc's malloc set to keep freed memory (:func:`keep_freed_memory`:
    at long lengths it spares every step hundreds of thousands of page faults)."""
    setup_logging(training_args)
    if training_args.device.type == "cpu":
        # Pinned memory only speeds up copies to an accelerator; on CPU torch warns at every
        # DataLoader that it is not used.
        training_args.dataloader_pin_memory = False
        if keep_freed_memory():
            logger.debug("glibc malloc keeps freed memory for reuse (set MALLOC_MMAP_THRESHOLD_ to choose otherwise)")
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
    """The tokenizer of ``--tokenizer_name`` or ``--model_name_or_path``."""
    return from_flag(AutoTokenizer.from_pretrained, model_args, "tokenizer_name")


def load_model(model_args: ModelArguments, auto_class: type, **config_kwargs: Any) -> PreTrainedModel:
    """``auto_class`` (an ``hea.AutoModel*``) from ``--model_name_or_path`` with ``--attn_impl`` /
    ``--attn_config`` (or the method saved in the checkpoint); ``config_kwargs`` override the
    config (e.g. ``num_labels``). A new task head is said in one line (:mod:`.loading`)."""
    return load_with_new_head(
        auto_class,
        model_args.model_name_or_path,
        config=load_config(model_args, **config_kwargs),
        attn_impl=model_args.attn_impl,
        attn_config=model_args.attn_options or None,
        **model_args.hub_kwargs(),
    )


def check_same_method(model: PreTrainedModel, checkpoint: str | None) -> None:
    """``ValueError`` when ``checkpoint`` (to resume from) was saved with another method or options
    than ``model`` runs: resuming would fail on the optimizer's parameter groups, or silently load
    one method's state into another."""
    path = None if checkpoint is None else os.path.join(checkpoint, "config.json")
    if path is None or not os.path.isfile(path):  # a PEFT checkpoint holds its adapter only
        return
    with open(path) as f:
        saved = json.load(f)
    config = getattr(model, "get_base_model", lambda: model)().config
    ours = (getattr(config, "attn_impl", None), getattr(config, "attn_config", None) or {})
    theirs = (saved.get("attn_impl"), saved.get("attn_config") or {})
    if ours != theirs:
        raise ValueError(
            f"{checkpoint} was saved with {_described(*theirs)}, this run asks {_described(*ours)}: rerun with that "
            "method to resume, or give another --output_dir to start afresh"
        )


def _described(attn_impl: str | None, attn_config: dict[str, Any]) -> str:
    return "exact attention" if attn_impl is None else f"--attn_impl {attn_impl} --attn_config '{json.dumps(attn_config)}'"


def train_and_save(trainer: Trainer, checkpoint: str | None, num_samples: int, show_metrics: bool = True) -> dict[str, float]:
    """Train (resuming from ``checkpoint``, made with the same method: :func:`check_same_method`),
    save the model and tokenizer, and write ``train_results.json`` and ``trainer_state.json`` as
    the examples do; ``show_metrics`` prints the training metrics as they do too."""
    check_same_method(trainer.model, checkpoint)
    try:
        result = trainer.train(resume_from_checkpoint=checkpoint)
    except KeyboardInterrupt:  # Ctrl-C: run_cli prints this advice in one line
        close_progress_bars(trainer)
        raise KeyboardInterrupt(resume_advice(trainer.args)) from None
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": num_samples}
    if show_metrics:
        trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def close_progress_bars(trainer: Trainer) -> None:
    """Close the progress bars of an interrupted run (Trainer closes them only when training ends):
    left open, a bar draws itself once more as the process exits, below the interruption's line."""
    from transformers.trainer_callback import ProgressCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ProgressCallback):
            for bar in (callback.training_bar, callback.prediction_bar):
                if bar is not None:
                    bar.close()
            callback.training_bar = callback.prediction_bar = None


def resume_advice(training_args: TrainingArguments) -> str:
    """What rerunning an interrupted training run does: resume from the last complete checkpoint of
    its ``--output_dir`` (:func:`checkpoint_to_resume`), or start again when there is none."""
    output_dir = training_args.output_dir
    last = last_complete_checkpoint(output_dir)[0] if os.path.isdir(output_dir) else None
    if last is None:
        return f"{output_dir} holds no complete checkpoint yet, so rerunning the same command starts training again"
    if training_args.resume_from_checkpoint is not None:  # the same command would resume from that one again
        return f"rerun the same command without --resume_from_checkpoint to resume from {last}, the last complete checkpoint"
    return f"rerun the same command to resume from {last}, the last complete checkpoint"


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


#: Entries of Trainer's evaluation metrics that are bookkeeping, not results.
_EVAL_BOOKKEEPING = ("_runtime", "_per_second", "epoch")


def record_stage(
    trainer: Trainer,
    model_args: ModelArguments,
    data_args: Any,
    stage: str,
    script: str,
    max_seq_length: int,
    train_metrics: dict[str, float],
    eval_metrics: dict[str, float] | None,
) -> None:
    """Write ``provenance.json`` next to the trained model (main process): the source model's
    record plus this stage (``script``, data, length, steps, batch, learning rate, evaluation)."""
    if not trainer.is_world_process_zero():
        return
    args, state = trainer.args, trainer.state
    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    entry = {
        "stage": stage,
        "script": script,
        "model": model_args.model_name_or_path,
        "attn_impl": getattr(model.config, "attn_impl", None),
        "data": data_description(data_args),
        "max_seq_length": max_seq_length,
        "train_samples": train_metrics.get("train_samples"),
        "steps": state.global_step,
        "epochs": state.epoch,
        "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
        "learning_rate": args.learning_rate,
        "eval": {k: v for k, v in (eval_metrics or {}).items() if not k.endswith(_EVAL_BOOKKEEPING)},
    }
    record = source_record(model_args.model_name_or_path, **model_args.hub_kwargs())
    write_provenance(args.output_dir, record, entry)


def summary_line(
    model: PreTrainedModel,
    output_dir: str,
    train_metrics: dict[str, float] | None,
    tokens_per_example: float | None,
    eval_metrics: dict[str, float] | None,
    metric: str = "eval_accuracy",
    metric_label: str = "accuracy",
) -> str:
    """One closing line: method, training throughput in tokens/s and the main eval metric
    (``eval_metrics[metric]``, printed as ``metric_label``), eval loss and perplexity, and the
    folder that holds the run's files."""
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
    parts.append(f"files in {output_dir}")
    return "summary: " + ", ".join(parts)


def leave_process_group() -> None:
    """End this process's part of a distributed run (torchrun, accelerate launch) once the run's
    objects are gone: the DDP wrapper's reducer holds the process group, and a gloo group destroyed
    from there (the GIL held) can deadlock with its worker threads, which need the GIL to free the
    tensors of their last collectives; a group left alive until the interpreter exits can abort the
    process there instead (SIGABRT; pytorch/pytorch#179291). Destroyed from Python, the group
    releases the GIL while it waits for its threads."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()  # the trainer and its DDP wrapper, when a cycle holds them (a callback that keeps its trainer)
        torch.distributed.destroy_process_group()
