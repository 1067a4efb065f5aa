"""Which test checks the effect of each flag of each script and each keyword of the public Python API,
and how they are found.

A flag is listed by the script that parses it. The flags are found, not typed: each script's
``main(["--help"])`` runs with ``HfArgumentParser`` recording the dataclasses it was given; every
field of the project's own dataclasses is a flag to cover, and of Transformers' ``TrainingArguments``
those the package reads itself (``training_args.<name>`` in its source); the rest of
TrainingArguments goes to Trainer untouched and is Transformers' to test.

``FLAG_TESTS[script][flag]`` names a test (``tests/<file>.py::<test name>``) that fails when the flag
is ignored or wired to the wrong place; ``tests/project/test_flag_table.py`` checks that every flag has one
and that each named test exists.

A flag that several scripts read (:func:`shared_flags`: a field of one dataclass, such as
``DataArguments.max_eval_samples`` or a ``TrainingArguments`` field, parsed by several scripts) is
handled by shared code that each script calls in its own way, so its effect is tested in every one
of them: for each such script, the named test is parametrized over ``script`` and that script is
among its values (:func:`covered_scripts`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
from typing import Callable

import paths

REPO = str(paths.REPO)

#: Each script and the module whose ``main`` parses its flags.
SCRIPT_MAINS = {
    "benchmark": "hf_efficient_attn.tools.benchmark.cli",
    "compare_methods": "hf_efficient_attn.tasks.mlm.compare",
    "convert_checkpoint": "hf_efficient_attn.tasks.convert_released",
    "convert_to_long": "hf_efficient_attn.tasks.convert",
    "demo": "hf_efficient_attn.tools.demo",
    "encode_onnx": "hf_efficient_attn.serving.encode_cli",
    "export_onnx": "hf_efficient_attn.serving.cli",
    "finetune_glue": "hf_efficient_attn.tasks.glue",
    "finetune_wikihop": "hf_efficient_attn.tasks.wikihop.finetune",
    "mutation_check": "scripts/mutation_check.py",
    "prepare_glue_sample": "scripts/prepare_glue_sample.py",
    "prepare_wikihop": "scripts/prepare_wikihop.py",
    "prepare_wikipedia": "scripts/prepare_wikipedia.py",
    "pretrain_mlm": "hf_efficient_attn.tasks.mlm.pretrain",
    "push_to_hub": "hf_efficient_attn.hub.cli",
    "quality": "hf_efficient_attn.tools.quality.cli",
    "quickstart": "hf_efficient_attn.tools.quickstart",
}


def script_main(script: str) -> Callable:
    """The ``main`` of ``script`` (a module of the package, or a file under scripts/)."""
    target = SCRIPT_MAINS[script]
    if target.endswith(".py"):
        path = os.path.join(REPO, target)
        spec = importlib.util.spec_from_file_location(f"_script_{script}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while being built
        spec.loader.exec_module(module)
        return module.main
    return importlib.import_module(target).main


def parsed_dataclasses(script: str) -> list[type]:
    """The dataclasses ``script`` parses, recorded from its ``--help``."""
    from hf_efficient_attn.tasks.common import args

    recorded: list[type] = []

    class RecordingParser(args.HfArgumentParser):
        def __init__(self, dataclass_types, **kwargs):
            recorded.extend(dataclass_types)
            super().__init__(dataclass_types, **kwargs)

    original, args.HfArgumentParser = args.HfArgumentParser, RecordingParser
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        script_main(script)(["--help"])
    except SystemExit:
        pass
    finally:
        sys.stdout.close()
        sys.stdout, args.HfArgumentParser = stdout, original
    return recorded


def training_flags_read() -> set[str]:
    """The TrainingArguments fields the package reads itself (``training_args.<name>``, and the flags a
    comparison decides for each run itself, which it reads by name)."""
    from transformers import TrainingArguments

    from hf_efficient_attn.tasks.mlm.compare import DECIDED_FLAGS

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    read = set(DECIDED_FLAGS)
    for root, _, files in os.walk(os.path.join(REPO, "hf_efficient_attn")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    read |= set(re.findall(r"training_args\.(\w+)", f.read()))
    return read & fields


def script_flags(script: str) -> list[str]:
    """The flags of ``script`` whose effect needs a test (see the module docstring)."""
    from transformers import TrainingArguments

    flags = []
    for cls in parsed_dataclasses(script):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        if issubclass(cls, TrainingArguments):
            names = [name for name in names if name in training_flags_read()]
        flags += [name for name in names if name not in flags]
    return flags


def field_owner(cls: type, name: str) -> type:
    """The base-most dataclass of ``cls`` that declares the field ``name`` (a subclass may redeclare it
    with its own help or default: still the same flag, read by the same code)."""
    return next(c for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c) and name in c.__dict__.get("__annotations__", {}))


def shared_flags() -> dict[tuple[str, str], list[str]]:
    """(owning dataclass, flag) -> the scripts that parse that field, for the fields parsed by several."""
    parsers: dict[tuple[str, str], list[str]] = {}
    for script in SCRIPT_MAINS:
        flags = set(script_flags(script))
        for cls in parsed_dataclasses(script):
            for field in dataclasses.fields(cls):
                if field.name in flags:
                    key = (field_owner(cls, field.name).__qualname__, field.name)
                    parsers.setdefault(key, [])
                    if script not in parsers[key]:
                        parsers[key].append(script)
    return {key: scripts for key, scripts in parsers.items() if len(scripts) > 1}


def covered_scripts(test: str) -> list[str]:
    """The values of the ``script`` parameter of ``test`` (``tests/<file>.py::<name>``), from its
    ``pytest.mark.parametrize`` marks (a parameter set of several names: the ``script`` column)."""
    path, _, name = test.partition("::")
    module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
    scripts = []
    for mark in getattr(getattr(module, name), "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if "script" in names:
            column = names.index("script")
            for value in values:
                value = getattr(value, "values", value)  # pytest.param(...)
                scripts.append(value[column] if len(names) > 1 else value)
    return scripts


#: Test files, by name.
TEST_API_KEYWORDS = "tests/project/test_api_keywords.py::"
TEST_ARCHITECTURES = "tests/integration/test_architectures.py::"
TEST_AUTO = "tests/integration/test_auto.py::"
TEST_BRIDGE = "tests/integration/test_bridge.py::"
TEST_FLAGS_BENCH_QUALITY = "tests/project/test_flags_bench_quality.py::"
TEST_FLAGS_DATA = "tests/project/test_flags_data.py::"
TEST_FLAGS_MODEL_TRAINING = "tests/project/test_flags_model_training.py::"
TEST_FLAGS_TOOLS = "tests/project/test_flags_tools.py::"
TEST_FUNCTIONAL = "tests/methods/test_functional.py::"
TEST_GLUE = "tests/tasks/test_glue.py::"
TEST_GLUE_TASKS = "tests/tasks/test_glue_tasks.py::"
TEST_HUB_CARD = "tests/hub/test_hub_card.py::"
TEST_HUB_FOLDER = "tests/hub/test_hub_folder.py::"
TEST_HUB_UPLOAD = "tests/hub/test_hub_upload.py::"
TEST_ONNX_ENCODE = "tests/serving/test_onnx_encode.py::"
TEST_ONNX_EXPORT = "tests/serving/test_onnx_export.py::"
TEST_PACKING = "tests/integration/test_packing.py::"
TEST_PATCHING = "tests/integration/test_patching.py::"
TEST_PRESETS = "tests/project/test_presets.py::"
TEST_PROVENANCE = "tests/tasks/test_provenance.py::"
TEST_RELEASED = "tests/integration/test_released_checkpoints.py::"
TEST_WIKIHOP_CLI = "tests/tasks/test_wikihop_cli.py::"

#: The model flags (ModelArguments) of the training scripts and convert_to_long, read by shared code.
MODEL_FLAG_TESTS = {
    "model_name_or_path": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
    "attn_config": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
    "config_name": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
    "tokenizer_name": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
    "cache_dir": TEST_FLAGS_MODEL_TRAINING + "test_revision_cache_dir_and_token_reach_config_tokenizer_and_weights",
    "use_fast_tokenizer": TEST_FLAGS_MODEL_TRAINING + "test_use_fast_tokenizer_false_is_refused_as_transformers_5_ignores_it",
    "model_revision": TEST_FLAGS_MODEL_TRAINING + "test_revision_cache_dir_and_token_reach_config_tokenizer_and_weights",
    "token": TEST_FLAGS_MODEL_TRAINING + "test_revision_cache_dir_and_token_reach_config_tokenizer_and_weights",
    "trust_remote_code": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
}
#: The TrainingArguments flags the four training scripts share, read by shared code.
TRAINING_FLAG_TESTS = {
    "output_dir": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "per_device_train_batch_size": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "num_train_epochs": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "max_steps": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "learning_rate": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "gradient_accumulation_steps": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "bf16": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "fp16": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    "report_to": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    "eval_steps": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "save_total_limit": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "dataloader_num_workers": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "dataloader_pin_memory": TEST_FLAGS_MODEL_TRAINING + "test_pin_memory_is_turned_off_on_cpu_only",
    "seed": TEST_FLAGS_MODEL_TRAINING + "test_seed_draws_what_it_seeds",
    "data_seed": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "log_level": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "disable_tqdm": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    "label_smoothing_factor": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    "prediction_loss_only": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    "batch_eval_metrics": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    **{
        flag: TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer"
        for flag in (
            "eval_strategy",
            "save_strategy",
            "save_steps",
            "eval_on_start",
            "optim",
            "optim_args",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "max_grad_norm",
            "lr_scheduler_type",
            "lr_scheduler_kwargs",
            "warmup_steps",
        )
    },  # fmt: skip
}
#: The data flags (DataArguments) of the four training scripts, read by shared code.
DATA_FLAG_TESTS = {
    "dataset_name": TEST_FLAGS_DATA + "test_dataset_name_and_config_are_what_is_loaded",
    "dataset_config_name": TEST_FLAGS_DATA + "test_dataset_name_and_config_are_what_is_loaded",
    "train_file": TEST_FLAGS_DATA + "test_each_file_is_the_split_it_names",
    "validation_file": TEST_FLAGS_DATA + "test_each_file_is_the_split_it_names",
    "max_seq_length": TEST_FLAGS_DATA + "test_sample_caps_and_max_seq_length_shape_each_set",
    "max_train_samples": TEST_FLAGS_DATA + "test_sample_caps_and_max_seq_length_shape_each_set",
    "max_eval_samples": TEST_FLAGS_DATA + "test_sample_caps_and_max_seq_length_shape_each_set",
    "preprocessing_num_workers": TEST_FLAGS_DATA + "test_tokenisation_gets_the_workers_and_cache_flags",
    "overwrite_cache": TEST_FLAGS_DATA + "test_tokenisation_gets_the_workers_and_cache_flags",
    "padding_free": TEST_FLAGS_DATA + "test_padding_free_packs_each_batch",
}
#: The masked-LM data flags (MLMDataArguments) of pretrain_mlm and compare_methods.
MLM_DATA_FLAG_TESTS = {
    flag: TEST_FLAGS_DATA + "test_masked_lm_data_flags_shape_the_masked_sets"
    for flag in ("validation_split_percentage", "mlm_probability", "line_by_line", "text_column_name", "eval_mask_seed")
}

FLAG_TESTS: dict[str, dict[str, str]] = {
    "benchmark": {
        "model": TEST_FLAGS_BENCH_QUALITY + "test_model_benchmark_flags_reach_each_step",
        "compile": TEST_FLAGS_BENCH_QUALITY + "test_compile_benchmark_flags_and_table",
        "train": TEST_FLAGS_BENCH_QUALITY + "test_compile_benchmark_flags_and_table",
        "onnx": TEST_FLAGS_BENCH_QUALITY + "test_onnx_benchmark_flags_and_table",
        "int8": TEST_FLAGS_BENCH_QUALITY + "test_onnx_benchmark_flags_and_table",
        "mixed_lengths": TEST_PACKING + "test_benchmark_mixed_lengths_flag",
        "methods": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "attn_config": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "seq_lens": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "batch": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "heads": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "head_dim": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "layers": TEST_FLAGS_BENCH_QUALITY + "test_model_benchmark_flags_reach_each_step",
        "arch": TEST_FLAGS_BENCH_QUALITY + "test_model_benchmark_flags_reach_each_step",
        "vocab_size": TEST_FLAGS_BENCH_QUALITY + "test_model_benchmark_flags_reach_each_step",
        "device": TEST_FLAGS_BENCH_QUALITY + "test_device_cuda_reaches_the_steps_and_their_timing",
        "dtype": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "repeats": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "warmup": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "rounds": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "threads": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "forward_only": TEST_FLAGS_BENCH_QUALITY + "test_forward_only_measures_no_backward",
        "competing_process": TEST_FLAGS_BENCH_QUALITY + "test_competing_process_times_each_call_again_beside_a_busy_process",
        "glibc_malloc": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
        "output_dir": TEST_FLAGS_BENCH_QUALITY + "test_attention_benchmark_flags_reach_each_call",
    },
    "compare_methods": {
        **MODEL_FLAG_TESTS,
        **TRAINING_FLAG_TESTS,
        **DATA_FLAG_TESTS,
        **MLM_DATA_FLAG_TESTS,
        "attn_impl": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        # the schedule every method's run follows: refused
        **{
            flag: TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading"
            for flag in ("num_train_epochs", "eval_strategy", "save_strategy", "save_steps", "eval_on_start")
        },
        "methods": TEST_FLAGS_DATA + "test_comparison_stages_follow_methods_and_head_warmup_flags",
        "head_warmup_steps": TEST_FLAGS_DATA + "test_comparison_stages_follow_methods_and_head_warmup_flags",
        "head_warmup_learning_rate": TEST_FLAGS_DATA + "test_comparison_stages_follow_methods_and_head_warmup_flags",
        "dataloader_persistent_workers": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        "do_train": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
        "do_eval": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
        "do_predict": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        "resume_from_checkpoint": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
    },
    "convert_checkpoint": {
        "model_name_or_path": TEST_RELEASED + "test_convert_script_writes_a_variant_that_reloads_as_itself",
        "output_dir": TEST_RELEASED + "test_convert_script_writes_a_variant_that_reloads_as_itself",
        "base_model": TEST_RELEASED + "test_convert_script_writes_a_variant_that_reloads_as_itself",
        "auto_class": TEST_RELEASED + "test_convert_script_flags_choose_the_class_and_the_method",
        "attn_impl": TEST_RELEASED + "test_convert_script_flags_choose_the_class_and_the_method",
        "attn_config": TEST_RELEASED + "test_convert_script_flags_choose_the_class_and_the_method",
    },
    "convert_to_long": {
        **MODEL_FLAG_TESTS,
        "attn_impl": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
        "output_dir": TEST_FLAGS_TOOLS + "test_convert_flags_length_seed_base_model_and_output_dir",
        "max_length": TEST_FLAGS_TOOLS + "test_convert_flags_length_seed_base_model_and_output_dir",
        "seed": TEST_FLAGS_TOOLS + "test_convert_flags_length_seed_base_model_and_output_dir",
        "base_model": TEST_FLAGS_TOOLS + "test_convert_flags_length_seed_base_model_and_output_dir",
        "rope_scaling": TEST_ARCHITECTURES + "test_convert_to_long_stretches_rotary_positions_with_or_without_a_scaling",
    },
    "demo": {
        "attn_impl": TEST_FLAGS_TOOLS + "test_method_flags_choose_the_method_each_tool_runs",
        "attn_config": TEST_FLAGS_TOOLS + "test_method_flags_choose_the_method_each_tool_runs",
        "num_articles": TEST_FLAGS_TOOLS + "test_demo_flags_reach_the_models_and_the_text",
        "long_length": TEST_FLAGS_TOOLS + "test_demo_flags_reach_the_models_and_the_text",
    },
    "export_onnx": {
        "model_dir": TEST_FLAGS_TOOLS + "test_export_flags_reach_the_export_and_the_checks",
        "output_dir": TEST_FLAGS_TOOLS + "test_export_flags_reach_the_export_and_the_checks",
        "export_length": TEST_FLAGS_TOOLS + "test_export_flags_reach_the_export_and_the_checks",
        "check_lengths": TEST_FLAGS_TOOLS + "test_export_flags_reach_the_export_and_the_checks",
        "opset": TEST_FLAGS_TOOLS + "test_export_flags_reach_the_export_and_the_checks",
        "int8": TEST_ONNX_ENCODE + "test_int8_model_is_written_loads_and_is_close",
        "validation_file": TEST_ONNX_ENCODE + "test_int8_model_is_written_loads_and_is_close",
        "validation_length": TEST_ONNX_ENCODE + "test_int8_model_is_written_loads_and_is_close",
        "task": TEST_ONNX_EXPORT + "test_export_script_task_exports_the_encoder",
    },
    "encode_onnx": {
        "export_dir": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "output_file": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "texts": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "texts_file": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "batch_size": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "max_length": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "int8": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
        "threads": TEST_ONNX_ENCODE + "test_encode_script_flags_reach_encode_and_the_output_file",
    },
    "finetune_glue": {
        **MODEL_FLAG_TESTS,
        **TRAINING_FLAG_TESTS,
        **DATA_FLAG_TESTS,
        "attn_impl": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
        "task_name": TEST_GLUE_TASKS + "test_every_task_from_the_hub_trains_on_its_canonical_labels",
        "test_file": TEST_GLUE + "test_task_reports_its_metrics_as_sklearn_computes_them",
        "validation_mismatched_file": TEST_GLUE + "test_mnli_reports_matched_and_mismatched",
        "test_mismatched_file": TEST_GLUE + "test_mnli_reports_matched_and_mismatched",
        "pad_to_max_length": TEST_FLAGS_DATA + "test_glue_pad_to_max_length_pads_every_example",
        "max_predict_samples": TEST_GLUE_TASKS + "test_gradient_accumulation_equals_one_large_batch",
        "peft": TEST_FLAGS_DATA + "test_lora_flags_shape_the_adapter",
        "lora_r": TEST_FLAGS_DATA + "test_lora_flags_shape_the_adapter",
        "lora_alpha": TEST_FLAGS_DATA + "test_lora_flags_shape_the_adapter",
        "lora_dropout": TEST_FLAGS_DATA + "test_lora_flags_shape_the_adapter",
        "lora_target_modules": TEST_FLAGS_DATA + "test_lora_flags_shape_the_adapter",
        "dataloader_persistent_workers": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
        "do_train": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_eval": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_predict": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "resume_from_checkpoint": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    },
    "finetune_wikihop": {
        **MODEL_FLAG_TESTS,
        **TRAINING_FLAG_TESTS,
        **DATA_FLAG_TESTS,
        "attn_impl": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
        "pad_to_max_length": TEST_WIKIHOP_CLI + "test_length_chunk_and_sample_options",
        "max_chunks": TEST_WIKIHOP_CLI + "test_length_chunk_and_sample_options",
        "dataloader_persistent_workers": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
        "do_train": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_eval": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_predict": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        "resume_from_checkpoint": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    },
    "mutation_check": {
        "only": TEST_FLAGS_TOOLS + "test_mutation_check_flags",
        "slow": TEST_FLAGS_TOOLS + "test_mutation_check_flags",
        "list": TEST_FLAGS_TOOLS + "test_mutation_check_flags",
        "no_baseline": TEST_FLAGS_TOOLS + "test_mutation_check_flags",
        "timeout": TEST_FLAGS_TOOLS + "test_mutation_check_flags",
    },
    "prepare_glue_sample": {
        "sample": TEST_FLAGS_TOOLS + "test_prepare_glue_sample_flags",
        "output_dir": TEST_FLAGS_TOOLS + "test_prepare_glue_sample_flags",
        "validation_every": TEST_FLAGS_TOOLS + "test_prepare_glue_sample_flags",
    },
    "prepare_wikihop": {
        "output_dir": TEST_FLAGS_TOOLS + "test_prepare_wikihop_flags",
        "train_examples": TEST_FLAGS_TOOLS + "test_prepare_wikihop_flags",
        "dev_examples": TEST_FLAGS_TOOLS + "test_prepare_wikihop_flags",
    },
    "prepare_wikipedia": {
        "output_dir": TEST_FLAGS_TOOLS + "test_prepare_wikipedia_flags",
        "validation_articles": TEST_FLAGS_TOOLS + "test_prepare_wikipedia_flags",
        "min_words": TEST_FLAGS_TOOLS + "test_prepare_wikipedia_flags",
    },
    "pretrain_mlm": {
        **MODEL_FLAG_TESTS,
        **TRAINING_FLAG_TESTS,
        **DATA_FLAG_TESTS,
        **MLM_DATA_FLAG_TESTS,
        "attn_impl": TEST_FLAGS_MODEL_TRAINING + "test_local_model_flags_reach_what_they_name",
        "dataloader_persistent_workers": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        "do_train": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_eval": TEST_FLAGS_MODEL_TRAINING + "test_do_flags_choose_the_stages",
        "do_predict": TEST_FLAGS_MODEL_TRAINING + "test_run_flags_are_read_before_loading",
        "resume_from_checkpoint": TEST_FLAGS_MODEL_TRAINING + "test_training_flags_reach_the_trainer",
    },
    "push_to_hub": {
        "model_dir": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "repo_id": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "attn_impl": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "attn_config": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "tokenizer_name": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "base_model": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "license": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "results_file": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "dataset_name": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "dataset_config_name": TEST_FLAGS_TOOLS + "test_push_flags_make_the_upload_folder",
        "private": TEST_HUB_UPLOAD + "test_the_scripts_upload_flags_reach_the_hub",
        "revision": TEST_HUB_UPLOAD + "test_the_scripts_upload_flags_reach_the_hub",
        "commit_message": TEST_HUB_UPLOAD + "test_the_scripts_upload_flags_reach_the_hub",
        "dry_run": TEST_HUB_UPLOAD + "test_the_scripts_upload_flags_reach_the_hub",
    },
    "python_api": {
        "AutoModel.from_config.attn_config": TEST_API_KEYWORDS + "test_from_config_keywords",
        "AutoModel.from_config.attn_impl": TEST_API_KEYWORDS + "test_from_config_keywords",
        "AutoModel.from_config.attn_implementation": TEST_API_KEYWORDS + "test_from_config_keywords",
        "AutoModel.from_config.config": TEST_API_KEYWORDS + "test_from_config_keywords",
        "AutoModel.from_pretrained.attn_config": TEST_AUTO + "test_saved_method_is_restored_and_attn_config_updates_it",
        "AutoModel.from_pretrained.attn_impl": TEST_AUTO + "test_config_keywords_reach_the_config",
        "AutoModel.from_pretrained.attn_implementation": TEST_API_KEYWORDS + "test_attn_implementation_and_config_keywords",
        "AutoModel.from_pretrained.cache_dir": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.config": TEST_API_KEYWORDS + "test_attn_implementation_and_config_keywords",
        "AutoModel.from_pretrained.dtype": TEST_API_KEYWORDS + "test_model_keywords_reach_the_weights_only",
        "AutoModel.from_pretrained.force_download": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.local_files_only": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.num_labels": TEST_AUTO + "test_config_keywords_reach_the_config",
        "AutoModel.from_pretrained.pretrained_model_name_or_path": TEST_AUTO + "test_pretraining_models_reload_as_themselves",
        "AutoModel.from_pretrained.proxies": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.quantization_config": TEST_API_KEYWORDS + "test_model_keywords_reach_the_weights_only",
        "AutoModel.from_pretrained.revision": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.subfolder": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.token": TEST_API_KEYWORDS + "test_hub_keywords_reach_the_config_and_the_weights",
        "AutoModel.from_pretrained.torch_dtype": TEST_API_KEYWORDS + "test_model_keywords_reach_the_weights_only",
        "build_model_card.base_model": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.dataset_config_name": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.dataset_name": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.license": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.model": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.provenance": TEST_PROVENANCE + "test_push_with_only_the_folder_the_repo_and_the_dry_run",
        "build_model_card.repo_id": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.results_file": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "build_model_card.template_path": TEST_API_KEYWORDS + "test_model_card_template_path",
        "build_model_card.trainer_state": TEST_HUB_CARD + "test_card_of_a_results_file_without_the_hub_fixtures",
        "efficient_attention.attention_mask": TEST_FUNCTIONAL + "test_true_marks_the_real_tokens",
        "efficient_attention.k": TEST_FUNCTIONAL + "test_true_marks_the_real_tokens",
        "efficient_attention.method": TEST_API_KEYWORDS + "test_method_and_options_of_efficient_attention",
        "efficient_attention.q": TEST_FUNCTIONAL + "test_true_marks_the_real_tokens",
        "efficient_attention.v": TEST_FUNCTIONAL + "test_true_marks_the_real_tokens",
        "encode.batch_size": TEST_ONNX_ENCODE + "test_batches_are_length_sorted_and_batch_size_long",
        "encode.export_dir": TEST_ONNX_ENCODE + "test_embeddings_equal_sentence_transformers_in_the_order_given",
        "encode.int8": TEST_ONNX_ENCODE + "test_int8_model_is_written_loads_and_is_close",
        "encode.max_length": TEST_ONNX_ENCODE + "test_max_length_truncates_each_text",
        "encode.texts": TEST_ONNX_ENCODE + "test_embeddings_equal_sentence_transformers_in_the_order_given",
        "encode.threads": TEST_ONNX_ENCODE + "test_threads_set_the_sessions_intra_op_threads",
        "export_folder.check_lengths": TEST_API_KEYWORDS + "test_export_folder_keywords",
        "export_folder.int8": TEST_ONNX_EXPORT + "test_export_folder_int8_texts_text_length_and_task_reach_their_steps",
        "export_folder.task": TEST_ONNX_EXPORT + "test_export_folder_int8_texts_text_length_and_task_reach_their_steps",
        "export_folder.text_length": TEST_ONNX_EXPORT + "test_export_folder_int8_texts_text_length_and_task_reach_their_steps",
        "export_folder.texts": TEST_ONNX_EXPORT + "test_export_folder_int8_texts_text_length_and_task_reach_their_steps",
        "export_folder.model_dir": TEST_API_KEYWORDS + "test_export_folder_keywords",
        "export_folder.opset": TEST_API_KEYWORDS + "test_export_folder_keywords",
        "export_folder.output_dir": TEST_API_KEYWORDS + "test_export_folder_keywords",
        "export_folder.seq_len": TEST_API_KEYWORDS + "test_export_folder_keywords",
        "export_onnx.model": TEST_API_KEYWORDS + "test_export_onnx_keywords_reach_the_exporter",
        "export_onnx.opset": TEST_API_KEYWORDS + "test_export_onnx_keywords_reach_the_exporter",
        "export_onnx.path": TEST_API_KEYWORDS + "test_export_onnx_keywords_reach_the_exporter",
        "export_onnx.seq_len": TEST_API_KEYWORDS + "test_export_onnx_keywords_reach_the_exporter",
        "export_variant.base_model": TEST_HUB_CARD + "test_card_metadata_parses_with_huggingface_hub",
        "export_variant.dataset_config_name": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "export_variant.dataset_name": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "export_variant.folder": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "export_variant.license": TEST_HUB_CARD + "test_card_metadata_parses_with_huggingface_hub",
        "export_variant.model": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "export_variant.provenance": TEST_PROVENANCE + "test_push_with_only_the_folder_the_repo_and_the_dry_run",
        "export_variant.repo_id": TEST_HUB_CARD + "test_naming_convention_names_repos_given_only_a_namespace",
        "export_variant.results_file": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "export_variant.tokenizer": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "export_variant.trainer_state": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "extend_position_embeddings.max_length": TEST_BRIDGE + "test_extend_position_embeddings_copies_the_table",
        "extend_position_embeddings.model": TEST_BRIDGE + "test_extend_position_embeddings_copies_the_table",
        "extend_position_embeddings.rope_scaling": TEST_ARCHITECTURES + "test_a_rope_scaling_is_opt_in_and_recorded",
        "load_preset.path": TEST_PRESETS + "test_preset_is_valid_and_fills_defaults",
        "load_variant.attn_config": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "load_variant.attn_impl": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "load_variant.model_dir": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "method_options.name": TEST_API_KEYWORDS + "test_method_options_are_those_of_the_method_named",
        "modules_to_save.model": TEST_PATCHING + "test_lora_adapter_saves_and_restores_the_method_parameters",
        "patch_model.attn_config": TEST_API_KEYWORDS + "test_patch_model_attn_impl_and_attn_config",
        "patch_model.attn_impl": TEST_API_KEYWORDS + "test_patch_model_attn_impl_and_attn_config",
        "patch_model.model": TEST_PATCHING + "test_unpatch_restores_exact_attention_class_and_config",
        "prepare_upload.attn_config": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "prepare_upload.attn_impl": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "prepare_upload.base_model": TEST_HUB_CARD + "test_card_metadata_parses_with_huggingface_hub",
        "prepare_upload.dataset_config_name": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "prepare_upload.dataset_name": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "prepare_upload.folder": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "prepare_upload.license": TEST_HUB_CARD + "test_card_metadata_parses_with_huggingface_hub",
        "prepare_upload.model_dir": TEST_HUB_FOLDER + "test_folder_has_config_weights_tokenizer_card_and_code",
        "prepare_upload.repo_id": TEST_HUB_CARD + "test_naming_convention_names_repos_given_only_a_namespace",
        "prepare_upload.results_file": TEST_HUB_CARD + "test_card_model_index_carries_the_trainer_metrics",
        "prepare_upload.tokenizer_name": TEST_API_KEYWORDS + "test_prepare_upload_tokenizer_name",
        "push_variant.commit_message": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "push_variant.dry_run": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "push_variant.model_dir": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "push_variant.private": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "push_variant.repo_id": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "push_variant.revision": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "register_method.cls": TEST_BRIDGE + "test_method_registered_after_import_works_in_plain_transformers",
        "register_method.replace": TEST_BRIDGE + "test_register_method_refuses_a_taken_name_unless_asked_to_replace",
        "unpatch_model.model": TEST_PATCHING + "test_unpatch_restores_exact_attention_class_and_config",
        "unpatch_model.restore": TEST_API_KEYWORDS + "test_unpatch_restore_chooses_the_attention_that_runs",
        "upload_variant.commit_message": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "upload_variant.folder": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "upload_variant.private": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "upload_variant.repo_id": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "upload_variant.revision": TEST_HUB_UPLOAD + "test_push_uploads_the_dry_run_folder_through_huggingface_hub",
        "validate.model": TEST_API_KEYWORDS + "test_validate_keywords",
        "validate.path": TEST_API_KEYWORDS + "test_validate_keywords",
        "validate.seed": TEST_API_KEYWORDS + "test_validate_keywords",
        "validate.seq_len": TEST_API_KEYWORDS + "test_validate_keywords",
        "variant_name.attn_impl": TEST_HUB_UPLOAD + "test_variant_name_and_repo_id",
        "variant_name.base_model": TEST_HUB_UPLOAD + "test_variant_name_and_repo_id",
        "variant_name.max_length": TEST_HUB_UPLOAD + "test_variant_name_and_repo_id",
        "variant_name.task": TEST_HUB_UPLOAD + "test_variant_name_and_repo_id",
        "write_remote_code.folder": TEST_HUB_FOLDER + "test_shipped_code_is_the_package_source_with_torch_and_transformers_only",
        "write_remote_code.model": TEST_HUB_FOLDER + "test_shipped_code_is_the_package_source_with_torch_and_transformers_only",
    },
    "quality": {
        "methods": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "attn_config": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "seq_lens": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "errors": TEST_FLAGS_BENCH_QUALITY + "test_quality_embedding_flags_reach_what_they_set",
        "embeddings": TEST_FLAGS_BENCH_QUALITY + "test_quality_embedding_flags_reach_what_they_set",
        "model_name_or_path": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "num_texts": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "num_sentences": TEST_FLAGS_BENCH_QUALITY + "test_quality_embedding_flags_reach_what_they_set",
        "num_articles": TEST_FLAGS_BENCH_QUALITY + "test_quality_embedding_flags_reach_what_they_set",
        "threads": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "repeats": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
        "output_dir": TEST_FLAGS_BENCH_QUALITY + "test_quality_error_study_flags_reach_what_they_set",
    },
    "quickstart": {
        "attn_impl": TEST_FLAGS_TOOLS + "test_method_flags_choose_the_method_each_tool_runs",
        "attn_config": TEST_FLAGS_TOOLS + "test_method_flags_choose_the_method_each_tool_runs",
        "output_dir": TEST_FLAGS_TOOLS + "test_quickstart_flags_reach_their_steps",
        "max_length": TEST_FLAGS_TOOLS + "test_quickstart_flags_reach_their_steps",
        "mlm_steps": TEST_FLAGS_TOOLS + "test_quickstart_flags_reach_their_steps",
        "finetune_length": TEST_FLAGS_TOOLS + "test_quickstart_flags_reach_their_steps",
        "finetune_epochs": TEST_FLAGS_TOOLS + "test_quickstart_flags_reach_their_steps",
    },
}


#: The public Python API whose keyword arguments need an effect test, as "module:attribute".
PUBLIC_FUNCTIONS = [
    *(
        f"hf_efficient_attn:{name}"
        for name in (
            "efficient_attention",
            "extend_position_embeddings",
            "load_preset",
            "method_options",
            "modules_to_save",
            "patch_model",
            "register_method",
            "unpatch_model",
        )
    ),
    "hf_efficient_attn:AutoModel.from_pretrained",
    "hf_efficient_attn:AutoModel.from_config",
    *(
        f"hf_efficient_attn.hub:{name}"
        for name in (
            "build_model_card",
            "export_variant",
            "load_variant",
            "prepare_upload",
            "push_variant",
            "upload_variant",
            "variant_name",
            "write_remote_code",
        )
    ),
    *(f"hf_efficient_attn.serving:{name}" for name in ("encode", "export_folder", "export_onnx", "validate")),
]


def api_keywords() -> list[str]:
    """``function.keyword`` for every named parameter of the public functions (``*args``/``**kwargs``
    and ``self``/``cls`` aside)."""
    import inspect

    keywords = []
    for target in PUBLIC_FUNCTIONS:
        module, _, attribute = target.partition(":")
        function = importlib.import_module(module)
        for part in attribute.split("."):
            function = getattr(function, part)
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                keywords.append(f"{attribute}.{parameter.name}")
    return keywords + forwarded_keywords()


def forwarded_keywords() -> list[str]:
    """The keywords the auto classes take out of ``**kwargs`` themselves (integration/auto.py): the hub
    options (config and weights), the weights-only ones, Transformers' ``attn_implementation``, and
    ``config`` / a config field (``num_labels``) for the config."""
    from hf_efficient_attn.integration import auto

    names = [*auto._HUB_KWARGS, *auto._MODEL_ONLY_KWARGS, "attn_implementation", "config", "num_labels"]
    return [f"AutoModel.from_pretrained.{name}" for name in names] + ["AutoModel.from_config.attn_implementation"]
