"""Which method at which length: compare attention methods on your checkpoint, your length and your
text by continued masked-LM training of one checkpoint with each method (``scripts/compare_methods.py``).
Flags: --methods, --attn_config (a JSON object keyed by method name), --head_warmup_steps, those of
pretrain_mlm.py and every TrainingArguments flag.

The comparison follows the MRA paper's (Zeng et al., "Multi Resolution Analysis (MRA) for
Approximate Self-Attention", ICML 2022, Tables 3 and 4: a stretched checkpoint trained on with
each method, masked-token accuracy compared with exact attention's). Every method starts from the
same weights and sees the same batches with the same masks (the pretraining pipeline of
pretrain_mlm.py: same seed, deterministic masks); only the attention differs. A checkpoint whose MLM
head is new (a sentence encoder stretched by convert_to_long.py) first gets its head trained
with exact attention, the rest frozen, and every method starts from that warmed checkpoint, so
that the comparison measures the attention, not the head. Each method trains in its own process,
so that its peak memory and its time per step are its own (a process's heap keeps what an earlier
method grew it to). Rerunning the same command skips finished methods and resumes an interrupted one.

Reads: the data of pretrain_mlm.py (--dataset_name, or .txt / .json / .jsonl / .csv files).
Default: without --dataset_name, --train_file and --validation_file, the real English Wikipedia
articles of gensim's test data, written to --output_dir/data/ (the last 8 held out for validation).
Writes: into --output_dir: results.csv (every evaluation of every method), comparison.png and
summary.md (the final numbers against softmax's, and a recommendation), comparison.json (the
settings every method shares), and a folder per method (and head_warmup/) with the model and
tokenizer, train_results.json, trainer_state.json and checkpoint-N/ folders as pretrain_mlm.py
writes them, its results.csv and a done marker.

examples:
  python scripts/convert_to_long.py --model_name_or_path roberta-base --max_length 2048 \\
      --output_dir outputs/roberta-base-2048
  python scripts/compare_methods.py --model_name_or_path outputs/roberta-base-2048 \\
      --methods softmax,mra2,linformer --max_seq_length 2048 --max_steps 300 --eval_steps 50 \\
      --per_device_train_batch_size 4 --output_dir outputs/compare-2048
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig, TrainingArguments

from ...integration.positions import max_tokens
from ...registry import list_methods, resolve_options
from ...utils.files import write_json
from ..common.args import ModelArguments, block_length, parse_arguments, parse_method_configs, parse_method_names
from ..common.data import unused_split_percentage, write_wikipedia_jsonl
from ..common.driver import last_complete_checkpoint, load_config, load_tokenizer, setup_logging
from ..common.provenance import read_provenance
from .compare_report import (
    REFERENCE,
    check_plotting,
    method_line,
    plot_comparison,
    read_rows,
    summary_markdown,
    write_rows,
)
from .compare_stage import START_WEIGHTS, Stage, is_done, read_json, run_in_own_process
from .pretrain import MLMDataArguments, check_mlm_run, masked_datasets

#: The methods compared by default: exact attention (the reference) and the approximations of the
#: MRA paper's Table 4 that this project implements.
DEFAULT_METHODS = ("softmax", "mra2", "mra2_s", "nystromformer", "linformer", "skeinformer", "yoso", "performer")
#: Folder of the warmed checkpoint (not a method name).
WARMUP_FOLDER = "head_warmup"
#: The settings every method must share; a rerun with other values is refused.
SETTINGS_FILE = "comparison.json"
#: TrainingArguments flags whose value the comparison decides for every run itself, and why; given
#: another value than Trainer's default, they are refused rather than silently overridden.
DECIDED_FLAGS = {
    "num_train_epochs": "every method trains --max_steps steps",
    **dict.fromkeys(
        ("eval_strategy", "save_strategy", "save_steps", "eval_on_start"),
        "every method evaluates at step 0, then evaluates and saves a checkpoint every --eval_steps steps; give "
        "--eval_steps N to choose how often",
    ),
}


@dataclass
class ComparisonModelArguments(ModelArguments):
    """The model flags, with ``--attn_config`` holding options per method; ``--attn_impl`` is hidden
    from ``--help`` and refused (the methods are ``--methods``)."""

    attn_impl: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})
    attn_config: str | None = field(
        default=None,
        metadata={
            "help": "Options per method: a JSON object keyed by method name, e.g. "
            '\'{"mra2": {"block_per_row": 8}, "linformer": {"k": 128}}\'. Methods left out take their defaults.'
        },
    )

    def __post_init__(self) -> None:
        if self.attn_impl is not None:
            raise ValueError("--attn_impl does not apply to a comparison: list the methods in --methods")
        super().__post_init__()


@dataclass
class ComparisonDataArguments(MLMDataArguments):
    """``pretrain_mlm.py``'s data flags; without any, the bundled real English Wikipedia articles
    (gensim's test data) are used, the last 8 held out."""

    data_required = False


@dataclass
class ComparisonArguments:
    """What is compared, and the head warm-up."""

    methods: str = field(
        default=",".join(DEFAULT_METHODS),
        metadata={"help": f"Comma-separated methods, {REFERENCE} (the reference) among them; any of "
                  + ", ".join(list_methods())},
    )  # fmt: skip
    head_warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "Steps training only the MLM head (exact attention, the rest frozen) before the comparison. "
            "Default: 100 when the checkpoint's MLM head is new (a checkpoint without one, or one convert_to_long "
            "added and nothing trained since), else 0."
        },
    )
    head_warmup_learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the head warm-up."})

    def __post_init__(self) -> None:
        if self.head_warmup_steps is not None and (
            isinstance(self.head_warmup_steps, bool) or not isinstance(self.head_warmup_steps, int)
            or self.head_warmup_steps < 0
        ):  # fmt: skip
            raise ValueError(f"--head_warmup_steps must be 0 or a positive integer, got {self.head_warmup_steps!r}")
        if not self.head_warmup_learning_rate > 0:
            raise ValueError(f"--head_warmup_learning_rate must be positive, got {self.head_warmup_learning_rate}")
        parse_methods(self.methods)

    @property
    def method_list(self) -> list[str]:
        return parse_methods(self.methods)


def parse_methods(text: str) -> list[str]:
    """``--methods`` as a list (:func:`.args.parse_method_names`), the reference among them."""
    names = parse_method_names(text, list_methods(), DEFAULT_METHODS)
    if REFERENCE not in names:
        raise ValueError(f"--methods must include {REFERENCE}, the reference the others are measured against")
    return names


def method_options(methods: Sequence[str], attn_config: str | None) -> dict[str, dict[str, Any]]:
    """Every method's full options: defaults updated by ``--attn_config[method]``
    (:func:`.args.parse_method_configs` checks the keys and options)."""
    given = parse_method_configs(attn_config, methods)
    return {name: resolve_options(name, given.get(name)).to_dict() for name in methods}


def head_is_new(model_path: str, config: PretrainedConfig) -> bool:
    """True when the checkpoint has no trained MLM head: its architecture has none (a ``BertModel``),
    or ``convert_to_long`` added one (recorded in ``provenance.json``) and no masked-LM stage came after."""
    if not any(name.endswith(("ForMaskedLM", "ForPreTraining")) for name in config.architectures or []):
        return True
    stages = (read_provenance(model_path) or {}).get("stages", [])
    added = [i for i, stage in enumerate(stages) if stage.get("new_head_tensors")]
    trained = [i for i, stage in enumerate(stages) if stage.get("stage") == "masked-LM pretraining"]
    return bool(added) and (not trained or trained[-1] < added[-1])


def check_settings(output_dir: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``ValueError`` when ``output_dir`` holds a comparison made with other ``settings`` (its methods
    would not be comparable); returns them, to be recorded (:func:`record_settings`) once the data
    are read."""
    settings = json.loads(json.dumps(settings))  # as the record holds them: enums as their names, tuples as lists
    path = os.path.join(output_dir, SETTINGS_FILE)
    if os.path.isfile(path):
        recorded = read_json(path)
        changed = sorted(key for key in settings if recorded.get(key) != settings[key])
        if changed:
            key = changed[0]
            raise ValueError(
                f"--output_dir {output_dir!r} holds a comparison made with {key} = {recorded.get(key)!r}, not "
                f"{settings[key]!r}; rerun it with the same settings, or give another --output_dir"
            )
    return settings


def record_settings(output_dir: str, settings: dict[str, Any]) -> None:
    """Write ``settings`` into :data:`SETTINGS_FILE`, for :func:`check_settings` on a rerun."""
    os.makedirs(output_dir, exist_ok=True)
    write_json(os.path.join(output_dir, SETTINGS_FILE), settings)


def check_decided_flags(training_args: TrainingArguments) -> None:
    """``ValueError`` for a flag of :data:`DECIDED_FLAGS` given another value than its default (read from
    ``TrainingArguments``' fields): the comparison would silently override it."""
    defaults = {field.name: field.default for field in dataclasses.fields(TrainingArguments)}
    for flag in DECIDED_FLAGS:
        if getattr(training_args, flag) != defaults[flag]:
            raise ValueError(f"--{flag} does not apply to a comparison: {DECIDED_FLAGS[flag]}")


def stage_arguments(training_args: TrainingArguments, folder: str, **changes: Any) -> TrainingArguments:
    return dataclasses.replace(training_args, output_dir=folder, **changes)


def run_comparison(
    model_args: ComparisonModelArguments,
    data_args: ComparisonDataArguments,
    compare_args: ComparisonArguments,
    training_args: TrainingArguments,
) -> list[dict[str, Any]]:
    """Warm up the head if it is new, train each method (skipping finished ones), write
    ``results.csv``, ``comparison.png`` and ``summary.md`` into ``--output_dir``; returns the rows."""
    methods = compare_args.method_list
    options = method_options(methods, model_args.attn_config)
    training_args.do_train = training_args.do_eval = True  # what a comparison does, asked for or not
    check_mlm_run(training_args)
    if training_args.world_size > 1:
        raise ValueError("run the comparison as one process (each method gets its own), not under torchrun")
    if training_args.max_steps <= 0:
        raise ValueError("give --max_steps N: every method trains the same number of steps")
    if training_args.resume_from_checkpoint is not None:
        raise ValueError(
            "--resume_from_checkpoint does not apply to a comparison (every method would start from that one "
            "checkpoint): rerun the same command, and each method resumes from its own last complete checkpoint"
        )
    check_decided_flags(training_args)
    # Trainer takes a fraction of max_steps too; default: 10 evaluations.
    eval_steps = training_args.eval_steps or max(1, training_args.max_steps // 10)
    config = load_config(model_args)
    check_plotting()
    setup_logging(training_args)
    output_dir = training_args.output_dir
    if data_args.dataset_name is None and data_args.train_file is None and data_args.validation_file is None:
        if data_args.validation_split_percentage is not None:
            raise unused_split_percentage("the default data hold out their last 8 articles")
        data_dir = os.path.join(output_dir, "data")
        if not os.path.isfile(os.path.join(data_dir, "validation.jsonl")):
            write_wikipedia_jsonl(data_dir)
        data_args.train_file = os.path.join(data_dir, "train.jsonl")
        data_args.validation_file = os.path.join(data_dir, "validation.jsonl")

    tokenizer = load_tokenizer(model_args)
    seq_len = block_length(data_args, tokenizer.model_max_length, max_tokens(config))
    warmup_steps = compare_args.head_warmup_steps
    if warmup_steps is None:
        warmup_steps = 100 if head_is_new(model_args.model_name_or_path, config) else 0
    settings = check_settings(output_dir, {
        "model_name_or_path": model_args.model_name_or_path, "max_seq_length": seq_len,
        "data": [data_args.dataset_name, data_args.train_file, data_args.validation_file],
        "dataset_config_name": data_args.dataset_config_name, "text_column_name": data_args.text_column_name,
        "validation_split_percentage": data_args.split_percentage,
        "max_train_samples": data_args.max_train_samples, "max_eval_samples": data_args.max_eval_samples,
        "max_steps": training_args.max_steps,
        "batch": [training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps],
        "learning_rate": training_args.learning_rate, "seed": training_args.seed, "eval_steps": eval_steps,
        "head_warmup": [warmup_steps, compare_args.head_warmup_learning_rate],
        # the optimiser and its schedule
        "optim": training_args.optim, "optim_args": training_args.optim_args,
        "weight_decay": training_args.weight_decay, "adam_beta1": training_args.adam_beta1,
        "adam_beta2": training_args.adam_beta2, "adam_epsilon": training_args.adam_epsilon,
        "max_grad_norm": training_args.max_grad_norm, "lr_scheduler_type": training_args.lr_scheduler_type,
        "lr_scheduler_kwargs": training_args.lr_scheduler_kwargs, "warmup_steps": training_args.warmup_steps,
        # what the masks and examples are made from (pretrain.masked_datasets)
        "data_seed": training_args.data_seed, "eval_mask_seed": data_args.eval_mask_seed,
        "mlm_probability": data_args.mlm_probability, "line_by_line": data_args.line_by_line,
    })  # fmt: skip
    # The data are checked here, before any process starts (and tokenised once: the others read the cache).
    train_set, eval_set = masked_datasets(model_args, data_args, training_args, tokenizer, seq_len)
    record_settings(output_dir, settings)
    batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    setup = (
        f"{training_args.max_steps} steps of {batch} x {seq_len} tokens ({len(train_set)} training blocks), learning "
        f"rate {training_args.learning_rate:g}, seed {training_args.seed}; evaluated every {eval_steps:g} steps on "
        f"{len(eval_set)} held-out blocks with fixed masks"
    )

    start = model_args.model_name_or_path
    if warmup_steps > 0:
        start = os.path.join(output_dir, WARMUP_FOLDER)
        warmup = Stage(
            WARMUP_FOLDER,
            plain_model_args(model_args, model_args.model_name_or_path, REFERENCE, {}),
            data_args,
            stage_arguments(training_args, start, max_steps=warmup_steps, learning_rate=compare_args.
                            head_warmup_learning_rate, do_eval=False, eval_strategy="no", save_strategy="steps",
                            save_steps=eval_steps, save_total_limit=1),
            seq_len,
            head_only=True,
        )  # fmt: skip
        run_or_skip(warmup, f"MLM head warm-up ({warmup_steps} steps, {REFERENCE} attention, the rest frozen)")

    for method in methods:
        folder = os.path.join(output_dir, method)
        check_method_folder(folder, method, options[method])
        stage = Stage(
            method,
            plain_model_args(model_args, start, method, options[method]),
            data_args,
            # Evaluated at step 0 unless resumed (the resumed history has that evaluation).
            stage_arguments(training_args, folder, eval_strategy="steps", eval_steps=eval_steps,
                            eval_on_start=last_complete_checkpoint(folder)[0] is None,
                            save_strategy="steps", save_steps=eval_steps,
                            save_total_limit=training_args.save_total_limit or 1),
            seq_len,
        )  # fmt: skip
        run_or_skip(stage, f"{method} {options[method]}")
        print(method_line(read_rows(os.path.join(folder, "results.csv"))), flush=True)

    check_same_start(output_dir, methods)
    rows = [row for method in methods for row in read_rows(os.path.join(output_dir, method, "results.csv"))]
    write_rows(os.path.join(output_dir, "results.csv"), rows)
    plot_comparison(rows, os.path.join(output_dir, "comparison.png"), seq_len)
    with open(os.path.join(output_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(rows, seq_len, model_args.model_name_or_path, warmup_steps, setup))
    print(f"wrote results.csv, comparison.png and summary.md to {output_dir}", flush=True)
    return rows


def plain_model_args(model_args: ComparisonModelArguments, path: str, attn_impl: str, options: dict[str, Any]) -> ModelArguments:
    """The model flags of one stage: ``path`` loaded with ``attn_impl`` and its ``options``."""
    shared = {f.name: getattr(model_args, f.name) for f in dataclasses.fields(ModelArguments) if f.init}
    return ModelArguments(**{**shared, "model_name_or_path": path, "attn_impl": attn_impl,
                             "attn_config": json.dumps(options)})  # fmt: skip


def check_method_folder(folder: str, method: str, options: dict[str, Any]) -> None:
    """Record the method's options in ``folder/method.json``, or ``ValueError`` when the folder
    holds a run of another method or of the method with other options."""
    path = os.path.join(folder, "method.json")
    recorded = {"attn_impl": method, "attn_config": options}
    if os.path.isfile(path) and read_json(path) != recorded:
        held = read_json(path)
        raise ValueError(
            f"{folder!r} holds a {held['attn_impl']} run with options {held['attn_config']}, not {method} with {options}; "
            "rerun with the same --attn_config, or give another --output_dir"
        )
    os.makedirs(folder, exist_ok=True)
    write_json(path, recorded)


def run_or_skip(stage: Stage, description: str) -> None:
    """Run the stage in its own process unless it has finished before; after Ctrl-C, the
    ``KeyboardInterrupt`` says what rerunning does (:func:`rerun_advice`)."""
    if is_done(stage.folder):
        print(f"{stage.name}: finished before, skipped ({stage.folder})", flush=True)
        return
    print(f"{stage.name}: training {description} in {stage.folder}", flush=True)
    try:
        run_in_own_process(stage)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(rerun_advice(stage)) from None


def rerun_advice(stage: Stage) -> str:
    """What rerunning the same command does after ``stage`` was interrupted: it skips the finished
    stages and resumes this one from its last complete checkpoint, or starts it again."""
    last = last_complete_checkpoint(stage.folder)[0] if os.path.isdir(stage.folder) else None
    rerun = f"rerun the same command: finished methods are skipped and {stage.name}"
    if last is None:
        return f"{rerun} starts again ({stage.folder} holds no complete checkpoint yet)"
    return f"{rerun} resumes from {last}, its last complete checkpoint"


def check_same_start(output_dir: str, methods: Sequence[str]) -> None:
    """``RuntimeError`` unless every method began with the reference's weights (the tensors they
    share: a method may add its own, such as Linformer's projections)."""
    reference = read_json(os.path.join(output_dir, REFERENCE, START_WEIGHTS))
    for method in methods:
        weights = read_json(os.path.join(output_dir, method, START_WEIGHTS))
        differ = sorted(name for name in weights.keys() & reference.keys() if weights[name] != reference[name])
        if differ:
            raise RuntimeError(f"{method} did not start from {REFERENCE}'s weights: {', '.join(differ[:3])} differ")


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line of ``scripts/compare_methods.py``."""
    types = (ComparisonModelArguments, ComparisonDataArguments, ComparisonArguments, TrainingArguments)
    return run_comparison(*parse_arguments(types, argv, __doc__))
