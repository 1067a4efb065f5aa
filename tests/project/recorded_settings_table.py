"""Every setting a resumable tool records to compare on a rerun, and the test that changes it on a
rerun (the recorded-settings rule, checked by tests/project/test_rule_tables.py).

A rerun into a folder that holds a finished or interrupted run continues it, so a setting changed in
between must be refused (or, for the quickstart, make it redo what depends on the setting), else one
folder mixes two runs. The settings are found, not typed:

- ``compare_methods comparison.json``: the keys of the dict that ``run_comparison`` passes to
  ``check_settings`` (tasks/mlm/compare.py);
- ``compare_methods <method>/method.json``: the keys ``check_method_folder`` records;
- ``<script> checkpoint config.json``: what ``check_same_method`` (tasks/common/driver.py) reads from
  the config of the checkpoint it would resume from, for each script that trains through
  ``train_and_save``;
- ``quickstart quickstart.json``: the settings of ``STEP_SETTINGS`` (tools/quickstart.py), whose change
  redoes the step that records it and the steps after it that read it.

``RERUN_TESTS[case]`` names a test that reruns with that one setting changed and expects the
refusal naming it (the quickstart: the documented redo).
"""

from __future__ import annotations

import ast

from flag_table import SCRIPT_MAINS
from rule_tables import calls, function, syntax_tree

COMPARE = "hf_efficient_attn.tasks.mlm.compare"
DRIVER = "hf_efficient_attn.tasks.common.driver"


def comparison_settings() -> list[str]:
    """The keys of the settings dict ``run_comparison`` hands to ``check_settings``."""
    (call,) = calls(function(syntax_tree(COMPARE), "run_comparison"), "check_settings")
    return [ast.literal_eval(key) for key in call.args[1].keys]


def method_folder_settings() -> list[str]:
    """The keys of the record ``check_method_folder`` writes into ``method.json``."""
    body = function(syntax_tree(COMPARE), "check_method_folder")
    (record,) = [node.value for node in ast.walk(body) if isinstance(node, ast.Assign) and node.targets[0].id == "recorded"]
    return [ast.literal_eval(key) for key in record.keys]


def checkpoint_settings() -> list[str]:
    """The fields ``check_same_method`` reads from the saved checkpoint's config (``saved.get(...)``)."""
    body = function(syntax_tree(DRIVER), "check_same_method")
    return [ast.literal_eval(call.args[0]) for call in calls(body, "get") if ast.unparse(call.func) == "saved.get"]


#: Modules beside a script's main module that its runs train in (a comparison's stages, each in its own process).
STAGE_MODULES = {"compare_methods": (COMPARE + "_stage",)}


def resuming_scripts() -> list[str]:
    """The scripts that train through ``train_and_save`` (which resumes only a checkpoint of the same method)."""
    return sorted(
        script
        for script, target in SCRIPT_MAINS.items()
        if any(any(calls(syntax_tree(module), "train_and_save")) for module in (target, *STAGE_MODULES.get(script, ())))
    )


def quickstart_settings() -> list[str]:
    """The settings the quickstart records per step."""
    from hf_efficient_attn.tools.quickstart import STEP_SETTINGS

    return sorted({setting for settings in STEP_SETTINGS.values() for setting in settings})


def recorded_settings() -> list[str]:
    """Every recorded setting of every resumable tool (see the module docstring), as ``RERUN_TESTS``' keys."""
    return [
        *(f"compare_methods comparison.json: {key}" for key in comparison_settings()),
        *(f"compare_methods <method>/method.json: {key}" for key in method_folder_settings()),
        *(f"{script} checkpoint config.json: {key}" for script in resuming_scripts() for key in checkpoint_settings()),
        *(f"quickstart quickstart.json: {key}" for key in quickstart_settings()),
    ]


TEST_RERUNS = "tests/project/test_reruns_refused.py::"
COMPARISON_KEYS = ("model_name_or_path", "max_seq_length", "data", "dataset_config_name", "text_column_name",
                   "validation_split_percentage", "max_train_samples", "max_eval_samples", "max_steps", "batch",
                   "learning_rate", "seed", "data_seed", "eval_mask_seed", "mlm_probability", "line_by_line", "eval_steps",
                   "head_warmup", "optim", "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                   "max_grad_norm", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps")  # fmt: skip
METHOD_FOLDER = {
    "attn_impl": TEST_RERUNS + "test_a_comparison_rerun_into_another_methods_folder_is_refused",
    "attn_config": TEST_RERUNS + "test_a_comparison_rerun_with_other_method_options_is_refused",
}

RERUN_TESTS = {
    **{
        f"compare_methods comparison.json: {key}": f"{TEST_RERUNS}test_a_comparison_rerun_with_another_setting_is_refused[{key}]"
        for key in COMPARISON_KEYS
    },
    **{f"compare_methods <method>/method.json: {key}": test for key, test in METHOD_FOLDER.items()},
    # a comparison's method runs resume their own folders: method.json is checked first
    **{f"compare_methods checkpoint config.json: {key}": test for key, test in METHOD_FOLDER.items()},
    **{
        f"{script} checkpoint config.json: {key}": (
            f"{TEST_RERUNS}test_a_rerun_asking_another_method_than_the_checkpoints_is_refused[{script}-{key}]"
        )
        for script in ("finetune_glue", "finetune_wikihop", "pretrain_mlm")
        for key in ("attn_impl", "attn_config")
    },
    **{
        f"quickstart quickstart.json: {key}": f"{TEST_RERUNS}test_a_quickstart_rerun_with_a_changed_setting_redoes_its_steps"
        f"[{key}]"
        for key in ("attn_config", "attn_impl", "finetune_epochs", "finetune_length", "max_length", "mlm_steps")
    },
}
