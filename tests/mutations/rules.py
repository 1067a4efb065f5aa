"""Mutations of the enumerating rules: advice taken, recorded settings changed on a rerun, label-free paths."""

from .base import Mutation, P, T

LABEL_FREE = (T + "test_label_free.py",)

MUTATIONS: list[Mutation] = [
    # ---- label-free paths (tests/label_free_table.py) --------------------------------------------
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
        (T + "test_rule_tables.py::test_every_label_free_path_runs_in_a_test",),
        "a new prediction stage (finetune_wikihop --do_predict) that no test runs",
    ),
]
