"""One stage of a method comparison (``compare.py``): the head warm-up or one method's continued
masked-LM training, run in a process of its own so that its peak memory and time per step are its
own. It writes, into its folder, what ``pretrain_mlm.py`` writes, plus its ``results.csv`` (every
evaluation with its training seconds and peak memory), the weights it started from and, last, a
done marker."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState, ProgressCallback

from ... import AutoModelForMaskedLM
from ...utils.cli_errors import INTERRUPTED_STATUS, USER_ERRORS, one_line
from ...utils.files import write_json
from ..common.args import ModelArguments
from ..common.driver import load_model, load_tokenizer, start_run, train_and_save
from .compare_report import write_rows
from .pretrain import MLMDataArguments, masked_datasets, mlm_trainer

logger = logging.getLogger("hf_efficient_attn.tasks")

#: Written into a stage's folder when it has finished, last: a folder without it is resumed.
DONE_MARKER = "comparison_done.json"
#: The step-0 weights of a method, one SHA-256 per tensor (the same-start check).
START_WEIGHTS = "start_weights.json"


@dataclass
class Stage:
    """What one stage's process trains: ``attn_impl`` from ``model_args.model_name_or_path`` into
    ``training_args.output_dir``; with ``head_only``, only the MLM head."""

    name: str
    model_args: ModelArguments
    data_args: MLMDataArguments
    training_args: TrainingArguments
    seq_len: int
    head_only: bool = False

    @property
    def folder(self) -> str:
        return self.training_args.output_dir


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process so far: allocated GPU memory on CUDA, else the resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class StepTimer(TrainerCallback, ExportableState):
    """Adds ``train_seconds`` (optimisation steps only: no evaluation, saving or data loading) and
    ``peak_memory_mb`` to every evaluation entry of the log history. Both are saved in each
    checkpoint's trainer state, so a resumed run counts on from where the checkpoint stopped."""

    def __init__(self, seconds: float = 0.0, peak_mb: float = 0.0):
        self.seconds = seconds
        self.peak_mb = peak_mb
        self._began: float | None = None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"seconds": self.seconds, "peak_mb": self.peak_mb}}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = state.stateful_callbacks.get(type(self).__name__)  # restored from the checkpoint
        if isinstance(saved, dict):
            self.seconds = saved["attributes"]["seconds"]
            self.peak_mb = saved["attributes"]["peak_mb"]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds += time.perf_counter() - self._began

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and "eval_loss" in logs:
            self.peak_mb = max(self.peak_mb, peak_memory_mb(args.device))
            # Trainer appended a copy of `logs` to the history just before this call.
            state.log_history[-1].update(train_seconds=self.seconds, peak_memory_mb=self.peak_mb)


class StartWeights(TrainerCallback):
    """Writes :data:`START_WEIGHTS` (a SHA-256 per tensor of the model) when training begins at
    step 0: what the method really started from."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.global_step == 0:
            write_json(os.path.join(self.folder, START_WEIGHTS), tensor_hashes(model.state_dict()))


def tensor_hashes(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """SHA-256 of each tensor's bytes."""
    return {
        name: hashlib.sha256(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
        for name, tensor in state_dict.items()
    }


def freeze_all_but_the_head(model: torch.nn.Module) -> None:
    """Train only what is outside the encoder (the MLM head's transform and bias); the decoder's
    weight, tied to the word embeddings, stays frozen with the encoder."""
    encoder = {id(parameter) for parameter in model.base_model.parameters()}
    for parameter in model.parameters():  # tied parameters appear once, as the encoder's
        parameter.requires_grad_(id(parameter) not in encoder)


class TrainingBar(ProgressCallback):
    """Trainer's progress bar of the training steps alone: no bar per evaluation and no printed logs (a
    comparison writes every evaluation into results.csv and says the last in its line per method)."""

    def on_prediction_step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_log(self, *args: Any, **kwargs: Any) -> None:
        pass


def shows_everything(training_args: TrainingArguments) -> bool:
    """Whether the runs print all that Trainer and the libraries print (``--log_level info`` or
    ``debug``); else a method's run shows its training progress bar and warnings only."""
    return training_args.get_process_log_level() <= logging.INFO


def run_stage(stage: Stage) -> None:
    """Train one stage (resuming from its last complete checkpoint), save the model, then write its
    ``results.csv`` (methods) and the done marker."""
    checkpoint = start_run(stage.training_args)
    quiet = not shows_everything(stage.training_args)
    if quiet:
        logger.setLevel(logging.WARNING)  # what the data are, the parent has said
        transformers.utils.logging.disable_progress_bar()  # loading the weights, saving them at every checkpoint
    tokenizer = load_tokenizer(stage.model_args)
    train_set, eval_set = masked_datasets(stage.model_args, stage.data_args, stage.training_args, tokenizer,
                                          stage.seq_len)  # fmt: skip
    model = load_model(stage.model_args, AutoModelForMaskedLM)
    if stage.head_only:
        freeze_all_but_the_head(model)
        callbacks = []
    else:
        callbacks = [StepTimer(), StartWeights(stage.folder)]
    trainer = mlm_trainer(model, stage.training_args, tokenizer, train_set, eval_set, callbacks, stage.data_args.padding_free)
    if quiet and trainer.pop_callback(ProgressCallback) is not None:  # none with --disable_tqdm
        trainer.add_callback(TrainingBar)
    train_and_save(trainer, checkpoint, len(train_set), show_metrics=not quiet)
    if not stage.head_only:
        write_rows(os.path.join(stage.folder, "results.csv"), evaluation_rows(stage.name, trainer.state.log_history))
    write_json(os.path.join(stage.folder, DONE_MARKER), {"stage": stage.name, "steps": trainer.state.global_step})


def evaluation_rows(method: str, log_history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluation of the log history, in step order."""
    return [
        {"method": method, "step": entry["step"], "seconds": entry["train_seconds"], "eval_loss": entry["eval_loss"],
         "eval_accuracy": entry["eval_accuracy"], "peak_memory_mb": entry["peak_memory_mb"]}
        for entry in sorted(log_history, key=lambda entry: entry["step"]) if "eval_loss" in entry
    ]  # fmt: skip


def _stage_process(sender: Any, stage: Stage) -> None:
    """Sends None when the stage has finished, its one-line message after a user error (which the
    parent raises as its own); a crash sends nothing. Ctrl-C ends it quietly with exit status
    :data:`INTERRUPTED_STATUS`: the parent, interrupted too, says so in one line."""
    try:
        run_stage(stage)
    except KeyboardInterrupt:
        raise SystemExit(INTERRUPTED_STATUS) from None  # multiprocessing prints no traceback for SystemExit
    except USER_ERRORS as err:
        sender.send(f"{stage.name}: {one_line(err)}")
    else:
        sender.send(None)


def method_process_context() -> multiprocessing.context.BaseContext:
    """Where the stages' processes come from: a fresh process each (never a fork of the parent, whose
    CUDA state and freed memory would be the stage's), forked from a fork server that has imported
    this module once (Python's ``forkserver``, with this module preloaded: a stage starts in a fraction
    of a second instead of importing torch, Transformers and datasets again, seconds each); ``spawn``
    where there is no fork server (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # before the server starts; a no-op once it runs
    return context


def run_in_own_process(stage: Stage) -> None:
    """:func:`run_stage` in a process of its own (:func:`method_process_context`); its user error is
    raised here as ``ValueError``, its interruption as ``KeyboardInterrupt``."""
    context = method_process_context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_stage_process, args=(sender, stage), name=f"compare-{stage.name}")
    process.start()
    sender.close()  # the child's copy stays open: recv() ends when the child sends or dies
    try:
        error = receiver.recv()
    except EOFError:  # died without a word: its exit status tells below
        error = None
    finally:  # after Ctrl-C too, which reaches the child as well: its checkpoints are then as it left them
        process.join()
    if error is not None:
        raise ValueError(error)
    if process.exitcode == INTERRUPTED_STATUS:
        raise KeyboardInterrupt
    if process.exitcode != 0:
        raise RuntimeError(
            f"{stage.name} stopped (exit status {process.exitcode}; see its messages above); rerun the same command to resume it"
        )


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def is_done(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, DONE_MARKER))
