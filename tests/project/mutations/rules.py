"""Mutations of the enumerating rules: advice taken, recorded settings changed on a rerun, label-free paths."""

from .base import Mutation, P, T

LABEL_FREE = (T + "tasks/test_label_free.py",)
RERUNS = T + "project/test_reruns_refused.py::"
ADVICE_API = T + "project/test_advice_taken_api.py::"
ADVICE_CLI = T + "project/test_advice_taken_scripts.py::"
ADVICE_HUB = T + "project/test_advice_taken_serving_hub.py::"

MUTATIONS: list[Mutation] = [
    # ---- label-free paths (tests/project/label_free_table.py) --------------------------------------------
    Mutation(
        P + "tasks/glue.py",
        'rows = rows.remove_columns("labels")  # test labels are -1 (or absent)',
        "rows = rows",
        LABEL_FREE,
        "test rows predicted with their -1 labels (the loss reads them)",
    ),
    Mutation(
        P + "tasks/common/packing.py",
        'if "labels" in features[0]:',
        'if "input_ids" in features[0]:',
        LABEL_FREE,
        "packed batches read labels that unlabelled rows lack",
    ),
    Mutation(
        P + "tasks/common/packing.py",
        'if "token_type_ids" in features[0]:',
        "if False:",
        LABEL_FREE,
        "packed sentence pairs lose their token types",
    ),
    Mutation(
        P + "tasks/glue.py",
        'indices = source["idx"][: len(rows)] if "idx" in source.column_names else range(len(rows))',
        "indices = range(len(rows))",
        LABEL_FREE,
        "predictions indexed by row instead of the test set's idx",
    ),
    Mutation(
        P + "tasks/glue.py",
        "task is None or task.submits_names",
        "task is not None and task.submits_names",
        LABEL_FREE,
        "predictions without a task written as ids, not the model's label names",
    ),
    Mutation(
        P + "tasks/glue.py",
        'if labelled.get(split) and "label" not in rows.column_names:',
        'if "label" not in rows.column_names:',
        LABEL_FREE,
        "a test file without a label column refused",
    ),
    Mutation(
        P + "tasks/glue.py",
        "data_args.pad_to_max_length and not data_args.padding_free,",
        "data_args.pad_to_max_length,",
        LABEL_FREE,
        "--padding_free packs test rows padded to max_seq_length",
    ),
    Mutation(
        P + "tasks/glue.py",
        "    elif data_args.pad_to_max_length:\n        collator = default_data_collator",
        "    elif True:\n        collator = default_data_collator",
        LABEL_FREE,
        "--no_pad_to_max_length batches stacked without padding",
    ),
    Mutation(
        P + "tasks/wikihop/finetune.py",
        "    check_run(training_args)",
        '    check_run(training_args, stages=("do_train", "do_eval", "do_predict"))',
        (T + "project/test_rule_tables.py::test_every_label_free_path_runs_in_a_test",),
        "a new prediction stage (finetune_wikihop --do_predict) that no test runs",
    ),
    # ---- recorded settings changed on a rerun (tests/project/recorded_settings_table.py) -------------------
    Mutation(
        P + "tasks/mlm/compare.py",
        '"data_seed": training_args.data_seed,',
        '"data_seed": training_args.seed,',
        (RERUNS + "-k data_seed",),
        "a comparison rerun with another --data_seed (other training masks) not refused",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        '"eval_mask_seed": data_args.eval_mask_seed,',
        '"eval_mask_seed": training_args.seed,',
        (RERUNS + "-k eval_mask_seed",),
        "a comparison rerun with another --eval_mask_seed (other validation masks) not refused",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        '"seed": training_args.seed, "eval_steps": eval_steps,',
        '"seed": training_args.data_seed, "eval_steps": eval_steps,',
        (RERUNS + "test_a_comparison_rerun_with_another_setting_is_refused[seed]",),
        "a comparison rerun with another --seed not refused",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        "holds a {held['attn_impl']} run with options",
        "holds a {method} run with options",
        (RERUNS + "test_a_comparison_rerun_into_another_methods_folder_is_refused",),
        "a method folder holding another method's run said to hold this method's",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        "if os.path.isfile(path) and read_json(path) != recorded:",
        'if os.path.isfile(path) and read_json(path)["attn_impl"] != method:',
        (RERUNS + "test_a_comparison_rerun_with_other_method_options_is_refused",),
        "a comparison rerun with other --attn_config for a method not refused",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "    if ours != theirs:",
        "    if ours[0] != theirs[0]:",
        (RERUNS + "-k another_method_than and attn_config",),
        "a checkpoint resumed by a run asking the same method with other options",
    ),
    Mutation(
        P + "tools/quickstart.py",
        '"3-newsgroups": ("finetune_length", "finetune_epochs")',
        '"3-newsgroups": ("finetune_epochs",)',
        (RERUNS + "-k quickstart_rerun",),
        "the quickstart reuses a fine-tuning made with another --finetune_length",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        '"line_by_line": data_args.line_by_line,',
        '"line_by_line": data_args.line_by_line, "padding_free": data_args.padding_free,',
        (T + "project/test_rule_tables.py::test_every_recorded_setting_is_changed_on_a_rerun_by_a_test",),
        "a new recorded setting that no test changes on a rerun",
    ),
    # ---- advice taken (tests/project/advice_table.py) ----------------------------------------------------
    Mutation(
        P + "tasks/common/driver.py",
        '_REPORTER_PACKAGES = {"azure_ml": "azureml-core", "flyte": "flytekit"}',
        '_REPORTER_PACKAGES = {"azure_ml": "azureml-core"}',
        (ADVICE_CLI + "test_report_to_uninstalled_tracker_advice",),
        "--report_to flyte advises pip install flyte, not the flytekit that Transformers looks for",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "stretch the checkpoint first: scripts/convert_to_long.py --max_length {max_seq_length}",
        "stretch the checkpoint first: scripts/convert_to_long.py --max_length {model_limit}",
        (ADVICE_CLI + "test_max_seq_length_beyond_the_table_advice",),
        "--max_seq_length beyond the table advises converting to the length the model already has",
    ),
    Mutation(
        P + "integration/packing.py",
        "use DataCollatorWithFlattening(position_ids_start={offset})",
        "use DataCollatorWithFlattening(position_ids_start={offset - 1})",
        (ADVICE_API + "test_packed_positions_start_advice",),
        "packed RoBERTa positions: the advised start is the padding position",
    ),
    Mutation(
        P + "integration/patching.py",
        "call hf_efficient_attn.extend_position_embeddings(model, max_length={tokens.shape[1]}) first",
        "call hf_efficient_attn.extend_position_embeddings(model, max_length={limit}) first",
        (ADVICE_API + "test_input_beyond_the_position_table_advice",),
        "an input beyond the table: the advised length is the table's own",
    ),
    Mutation(
        P + "methods/base.py",
        "        self.shape = dataclasses.replace(self.shape, max_seq_len=max_seq_len)\n        self._draw_seeded_buffers()",
        "        self.shape = dataclasses.replace(self.shape, max_seq_len=max_seq_len)",
        (ADVICE_API + "test_eval_draws_beyond_the_table_advice",),
        "stretching the model does not redraw the eval-mode draws, as the draws' error says it does",
    ),
    Mutation(
        P + "tools/quickstart.py",
        "if not os.path.isdir(output_dir) or not os.listdir(output_dir):",
        "if not os.path.isdir(output_dir):",
        (ADVICE_CLI + "test_quickstart_into_someone_elses_folder_advice",),
        "the quickstart refuses the empty folder its error advises",
    ),
    Mutation(
        P + "tasks/convert_released.py",
        "if os.path.isfile(output_dir) or (os.path.isdir(output_dir) and os.listdir(output_dir)):",
        "if os.path.isfile(output_dir) or os.path.isdir(output_dir):",
        (ADVICE_CLI + "test_convert_checkpoint_advice",),
        "convert_checkpoint.py refuses the empty folder its error advises",
    ),
    Mutation(
        P + "hub/export.py",
        "    if folder.exists() and any(folder.iterdir()):",
        "    if folder.exists():",
        (ADVICE_HUB + "test_upload_folder_not_empty_advice",),
        "the upload refuses the empty folder its error advises",
    ),
    Mutation(
        P + "serving/encoding.py",
        'hint = "export with --int8 to write it" if int8 else "write it with scripts/export_onnx.py"',
        'hint = "export with --int8 to write it" if not int8 else "write it with scripts/export_onnx.py"',
        (ADVICE_HUB + "test_encoding_without_the_export_file_advice",),
        "encode()'s missing-file advice swapped between the int8 file and the export",
    ),
    Mutation(
        P + "tasks/wikihop/qangaroo.py",
        'FETCH_COMMAND = f"pip download allennlp==0.9.0 --no-deps -d {DATA_DIR}"',
        'FETCH_COMMAND = f"pip download allennlp==0.9.0 --no-deps"',
        (ADVICE_CLI + "test_real_wikihop_examples_missing_advice",),
        "the real WikiHop examples' command downloads where they are not read",
    ),
    Mutation(
        P + "tools/benchmark/cli.py",
        'raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")',
        'raise ValueError(f"--warmup must be 0 or more, got {self.warmup}; use --warmup 0")',
        (T + "project/test_rule_tables.py::test_every_advice_is_taken_by_a_test",),
        "a new advising error that no test takes",
    ),
]
