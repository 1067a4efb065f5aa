"""Which test runs each script without a flag whose help says what happens then, and checks that it
happens; and how those defaults are found.

A default is found, not typed: in the help texts of the fields of the project's own dataclasses that
each script parses (as tests/project/flag_table.py finds them; TrainingArguments' are Transformers'), a help
that says what happens when its flag is not given (``Default: ...``, ``when omitted``, ``without
it``, ``left out``) is a default, keyed by the flag's name. One that differs by mode,
``Default: A; with --model: B; with --compile: C``, is a case per mode: ``seq_lens``, ``seq_lens
with --model``, ``seq_lens with --compile``. A script's own mode, what it does when none of its
mode-choosing flags is given, is the line of its description that starts with ``Default:``, keyed
``(mode) default``.

``DEFAULT_TESTS[script][key]`` names a test (``tests/<file>.py::<test name>``) that runs the script, or
the pipeline behind it, without that flag and checks what its help says happens then (the newer
tests read the help text itself, so that the two cannot drift apart); ``tests/project/test_defaults_table.py``
checks that every default has one, that no entry is stale and that each named test exists.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import re
from contextlib import redirect_stdout

from flag_table import parsed_dataclasses, script_main

#: A help text that says what happens without its flag.
STATES_DEFAULT = re.compile(r"\bdefault:|\bwhen omitted\b|\bwithout it\b|\bleft out\b", re.IGNORECASE)
#: The modes of a ``Default: ...`` statement after its first case: ``; with <mode>:``.
MODE_CASE = re.compile(r";\s*with ([^:;]+):")


def default_keys(help_text: str, name: str) -> list[str]:
    """The keys of what ``help_text`` (of the flag ``name``) says happens without the flag."""
    if not STATES_DEFAULT.search(help_text):
        return []
    statement = re.split(r"\bDefault:", help_text, maxsplit=1)[-1]
    return [name] + [f"{name} with {mode.strip()}" for mode in MODE_CASE.findall(statement)]


@functools.lru_cache(maxsize=None)
def field_help(script: str) -> dict[str, str]:
    """Each flag of the project's own dataclasses that ``script`` parses -> its help text."""
    from transformers import TrainingArguments

    helps = {}
    for cls in parsed_dataclasses(script):
        if not issubclass(cls, TrainingArguments):
            helps.update({f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.init})
    return helps


@functools.lru_cache(maxsize=None)
def description(script: str) -> str:
    """The description ``script --help`` opens with."""
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            script_main(script)(["--help"])
    except SystemExit:
        pass
    return out.getvalue().split("\n\n", 1)[1].split("\noptions:\n", 1)[0]


def script_defaults(script: str) -> list[str]:
    """The keys of every default of ``script`` (see the module docstring)."""
    keys = [key for name, text in field_help(script).items() for key in default_keys(text, name)]
    if any(line.startswith("Default:") for line in description(script).splitlines()):
        keys.append("(mode) default")
    return keys


def help_statement(script: str, key: str) -> str:
    """What the help of ``script`` says happens for ``key``: the text of its case (after ``Default:``
    or ``with <mode>:``, up to the next case), or the description's ``Default:`` line."""
    if key == "(mode) default":  # the description's paragraph lines from "Default:" to the next label
        text = description(script).split("\nDefault:", 1)[1]
        return " ".join(re.split(r"\n(?:\n|[A-Z]\w+: )", text, maxsplit=1)[0].split())
    name, _, mode = key.partition(" with ")
    statement = re.split(r"\bDefault:", field_help(script)[name], maxsplit=1)[-1]
    cases = re.split(MODE_CASE, statement)  # [first case, mode, its case, mode, its case, ...]
    return dict(zip(cases[1::2], cases[2::2])).get(mode, cases[0]).strip() if mode else cases[0].strip()


#: Test files, by name.
TEST_DEFAULTS_TOOLS = "tests/project/test_defaults_tools.py::"
TEST_DEFAULTS_TRAINING = "tests/project/test_defaults_training.py::"
TEST_RELEASED = "tests/integration/test_released_checkpoints.py::"

BENCHMARK_VALUES = TEST_DEFAULTS_TOOLS + "test_benchmark_values_per_benchmark_are_those_its_help_states"
BENCHMARK_DEFAULT = TEST_DEFAULTS_TOOLS + "test_benchmark_default_is_the_attention_call_of_each_method_forward_and_backward"
BENCHMARK_LEFT_AS_IS = (
    TEST_DEFAULTS_TOOLS + "test_benchmark_threads_default_to_torchs_and_a_method_left_out_of_attn_config_runs_at_its_defaults"
)
ATTN_IMPL = TEST_DEFAULTS_TRAINING + "test_attn_impl_default_is_the_saved_method_else_exact_attention"
TOKEN = TEST_DEFAULTS_TRAINING + "test_token_default_is_the_one_hf_auth_login_stored"
MAX_SEQ_LENGTH = TEST_DEFAULTS_TRAINING + "test_max_seq_length_default_is_the_tokenizer_limit_capped_by_the_position_table"
TEXT_COLUMN = TEST_DEFAULTS_TRAINING + "test_text_column_default_is_text"
SPLIT_PERCENTAGE = TEST_DEFAULTS_TRAINING + "test_validation_split_percentage_default_carves_the_percentage_its_help_states"
QUALITY = TEST_DEFAULTS_TOOLS + "test_quality_default_is_the_error_study_of_every_method_on_minilm"
EXPORT = TEST_DEFAULTS_TOOLS + "test_export_without_its_optional_flags_does_what_their_help_says"
ENCODE_MAX_LENGTH = TEST_DEFAULTS_TOOLS + "test_encode_max_length_defaults_to_the_recorded_one_else_the_position_table"

DEFAULT_TESTS: dict[str, dict[str, str]] = {
    "benchmark": {
        **{
            key: BENCHMARK_VALUES
            for key in (
                "methods",
                "methods with --model, --compile, --onnx or --mixed_lengths",
                "seq_lens",
                "seq_lens with --model",
                "seq_lens with --compile",
                "seq_lens with --onnx",
                "seq_lens with --mixed_lengths",
                "batch",
                "batch with --compile",
                "batch with --mixed_lengths",
                "repeats",
                "repeats with --model or --mixed_lengths",
                "warmup",
                "warmup with --model",
                "warmup with --mixed_lengths",
                "rounds",
                "rounds with --model",
            )
        },
        "attn_config": BENCHMARK_LEFT_AS_IS,
        "threads": BENCHMARK_LEFT_AS_IS,
        "(mode) default": BENCHMARK_DEFAULT,
    },
    "compare_methods": {
        "attn_config": TEST_DEFAULTS_TRAINING + "test_comparison_method_left_out_of_attn_config_takes_its_defaults",
        "token": TOKEN,
        "max_seq_length": MAX_SEQ_LENGTH,
        "text_column_name": TEXT_COLUMN,
        "validation_split_percentage": SPLIT_PERCENTAGE,
        "head_warmup_steps": TEST_DEFAULTS_TRAINING + "test_comparison_head_warmup_default_follows_whether_the_head_is_new",
        "(mode) default": TEST_DEFAULTS_TRAINING + "test_comparison_default_data_is_gensims_wikipedia_last_8_held_out",
    },
    "convert_checkpoint": {
        "attn_impl": TEST_RELEASED + "test_convert_script_writes_a_variant_that_reloads_as_itself",
        "auto_class": TEST_RELEASED + "test_convert_script_writes_a_variant_that_reloads_as_itself",
    },
    "convert_to_long": {
        "attn_impl": ATTN_IMPL,
        "rope_scaling": "tests/integration/test_architectures.py::"
        "test_convert_to_long_stretches_rotary_positions_with_or_without_a_scaling",
        "token": TOKEN,
    },
    "demo": {},
    "encode_onnx": {
        "max_length": ENCODE_MAX_LENGTH,
        "max_length with no sentence-transformers files": ENCODE_MAX_LENGTH,
        "threads": "tests/serving/test_onnx_encode.py::test_threads_set_the_sessions_intra_op_threads",
    },
    "export_onnx": {"check_lengths": EXPORT, "opset": EXPORT, "task": EXPORT, "validation_length": EXPORT},
    "finetune_glue": {
        "attn_impl": ATTN_IMPL,
        "token": TOKEN,
        "task_name": TEST_DEFAULTS_TRAINING + "test_glue_without_a_task_takes_its_classes_and_metric_from_the_data",
        "task_name with no --train_file": "tests/tasks/test_glue.py::"
        "test_predict_only_from_a_fine_tuned_folder_writes_the_label_names",
        "peft": TEST_DEFAULTS_TRAINING + "test_glue_without_peft_fine_tunes_every_weight",
        "lora_target_modules": "tests/tasks/test_glue.py::test_lora_targets_the_attention_projections_by_default",
    },
    "finetune_wikihop": {
        "attn_impl": ATTN_IMPL,
        "token": TOKEN,
        "max_seq_length": MAX_SEQ_LENGTH,
        "pad_to_max_length": "tests/tasks/test_wikihop_cli.py::test_length_chunk_and_sample_options",
        "max_chunks": TEST_DEFAULTS_TRAINING + "test_wikihop_without_max_chunks_reads_every_chunk",
    },
    "mutation_check": {},
    "prepare_glue_sample": {},
    "prepare_wikihop": {},
    "prepare_wikipedia": {},
    "pretrain_mlm": {
        "attn_impl": ATTN_IMPL,
        "token": TOKEN,
        "max_seq_length": MAX_SEQ_LENGTH,
        "text_column_name": TEXT_COLUMN,
        "validation_split_percentage": SPLIT_PERCENTAGE,
    },
    "push_to_hub": {
        "base_model": "tests/tasks/test_provenance.py::test_push_with_only_the_folder_the_repo_and_the_dry_run",
        "license": "tests/tasks/test_provenance.py::test_push_with_only_the_folder_the_repo_and_the_dry_run",
        "dataset_name": "tests/tasks/test_provenance.py::test_card_of_local_data_records_the_run_as_it_was",
    },
    "quality": {"methods": QUALITY, "attn_config": QUALITY, "model_name_or_path": QUALITY, "(mode) default": QUALITY},
    "quickstart": {
        "(mode) default": TEST_DEFAULTS_TOOLS + "test_quickstart_without_flags_runs_each_step_with_the_defaults_its_help_shows"
    },
}
