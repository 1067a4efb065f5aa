"""Every script path that runs on examples without labels, and the test that runs it (the label-free
rule, checked by tests/project/test_rule_tables.py).

A path that only predicts is easy to leave untested: training and evaluation need labels, so the
tests that run them never take it. The paths are found, not typed:

- prediction stages: a script whose run accepts ``--do_predict`` (it calls
  ``check_run(..., stages=(..., "do_predict"))``) runs once per source of the label names it writes
  (``--task_name`` when the script has that flag; without a task, the fine-tuned model's
  ``id2label``) and per padding mode its flags offer (``padded``, the default; ``--no_pad_to_max_length``
  when it has ``pad_to_max_length``; ``--padding_free`` when it has ``padding_free``);
- texts: a script whose entry point reads a file of texts (it calls ``read_texts``): each text's row
  from a batch of texts of mixed lengths.

``LABEL_FREE_TESTS[case]`` names the test that runs the case and checks its outputs against a
reference computed another way (each example through the model alone).
"""

from __future__ import annotations

import ast
import dataclasses

from flag_table import SCRIPT_MAINS, parsed_dataclasses
from rule_tables import calls, syntax_tree

#: The padding modes, each with the flag that asks for it (None: the default) and the data field that offers it.
PADDING_MODES = {"padded": None, "no_pad_to_max_length": "pad_to_max_length", "padding_free": "padding_free"}


def predicts(script: str) -> bool:
    """Whether ``script``'s run accepts ``--do_predict`` (``check_run`` called with it among the stages)."""
    for call in calls(syntax_tree(SCRIPT_MAINS[script]), "check_run"):
        stages = [keyword.value for keyword in call.keywords if keyword.arg == "stages"]
        if stages and "do_predict" in [ast.literal_eval(element) for element in stages[0].elts]:
            return True
    return False


def reads_texts(script: str) -> bool:
    """Whether ``script``'s entry point reads a file of texts (calls ``read_texts``)."""
    return any(calls(syntax_tree(SCRIPT_MAINS[script]), "read_texts"))


def label_free_cases() -> list[str]:
    """Every label-free path of every script (see the module docstring), as ``LABEL_FREE_TESTS``' keys."""
    cases = []
    for script in sorted(SCRIPT_MAINS):
        if predicts(script):
            fields = {f.name for cls in parsed_dataclasses(script) for f in dataclasses.fields(cls)}
            sources = (["--task_name"] if "task_name" in fields else []) + ["the model's id2label"]
            modes = [mode for mode, field in PADDING_MODES.items() if field is None or field in fields]
            cases += [f"{script} --do_predict, labels from {source}, {mode}" for source in sources for mode in modes]
        if reads_texts(script):
            cases.append(f"{script}: texts")
    return cases


TEST_LABEL_FREE = "tests/tasks/test_label_free.py::"
TEST_ONNX_ENCODE = "tests/serving/test_onnx_encode.py::"

LABEL_FREE_TESTS = {
    **{
        f"finetune_glue --do_predict, labels from {source}, {mode}": (
            f"{TEST_LABEL_FREE}test_predict_only_writes_each_examples_own_prediction[{key}-{mode}]"
        )
        for source, key in (("--task_name", "task"), ("the model's id2label", "model"))
        for mode in PADDING_MODES
    },
    # batches of mixed lengths (encode(), which the script calls) = each text alone through PyTorch
    "encode_onnx: texts": TEST_ONNX_ENCODE + "test_classifier_rows_are_its_logits",
    # the check on --validation_file texts: ONNX Runtime's label of each text against PyTorch's
    "export_onnx: texts": TEST_ONNX_ENCODE + "test_a_classifiers_check_on_texts_is_the_share_of_labels_kept",
}
