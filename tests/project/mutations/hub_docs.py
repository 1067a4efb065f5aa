"""Mutations of the model card of local data, the docs' serving example, repeatable documented numbers."""

from .base import Mutation, P, T

LOCAL_CARD = T + "tasks/test_provenance.py::-k local_data_records_the_run"
REFUSED = T + "tasks/test_provenance.py::-k refused_before_loading"
STAGE_LINE = T + "hub/test_hub_card.py::-k stage_line_tells"

MUTATIONS: list[Mutation] = [
    Mutation(
        P + "hub/card.py",
        '    return f"{number} {noun}" + ("" if number == 1 else "s")',
        '    return f"{number} {noun}" + ("" if number <= 1 else "s")',
        (T + "hub/test_hub_card.py::-k singular_for_one_only",),
        "the card says '0 step' and '0 example'",
    ),
    # ---- the model card of a model trained on local files (issue 46, item 7) ----------------------------
    Mutation(
        P + "hub/card.py",
        "    return matching[-1] if matching else None",
        "    return matching[0] if matching else None",
        (T + "hub/test_hub_card.py::-k last_stage_that_recorded",),
        "the results are described with the data of the first stage that recorded a part of them",
    ),
    Mutation(
        P + "hub/card.py",
        '    return stage["data"]\n',
        '    return {"dataset_name": "local"}\n',
        (LOCAL_CARD,),
        "local results get a made-up Hub dataset in the model-index instead of the files they were measured on",
    ),
    Mutation(
        P + "hub/card.py",
        '    builder = BUILDERS[Path((own or [files["train_file"]])[0]).suffix.lstrip(".")]',
        '    builder = "local"',
        (LOCAL_CARD,),
        "the model-index's dataset type of local files is no `datasets` builder that loads them",
    ),
    Mutation(
        P + "hub/card.py",
        '                    args={"data_files": own[0] if len(own) == 1 else own})',
        "                    args=None)",
        (LOCAL_CARD,),
        "the model-index does not say which local file the metrics were measured on",
    ),
    Mutation(
        P + "hub/card.py",
        'all(found.get(k) == v for k, v in s["eval"].items())',
        'any(found.get(k) == v for k, v in s["eval"].items())',
        (REFUSED,),
        "a results file another evaluation wrote is credited to the training run's data",
    ),
    Mutation(
        P + "hub/export.py",
        "        results_data(results_file, dataset_name, dataset_config_name, provenance)\n",
        "",
        (REFUSED,),
        "results of unknown data are refused only after the model is loaded",
    ),
    Mutation(
        P + "hub/card.py",
        '    over = f" over {_count(examples, \'training example\')}" if examples is not None else ""',
        '    over = ""',
        (LOCAL_CARD, STAGE_LINE),
        "the training record does not say how many training examples the epochs went over",
    ),
    Mutation(
        P + "hub/card.py",
        '    return f"{number} {noun}" + ("" if number == 1 else "s")',
        '    return f"{number} {noun}s"',
        (STAGE_LINE,),
        'one example is written "1 examples"',
    ),
    Mutation(
        P + "hub/card.py",
        'for flag in SPLIT_FILES["validation"] if files.get(flag)]',
        'for flag in files if flag != "train_file"]',
        (LOCAL_CARD, STAGE_LINE),
        "a file only predicted on (--test_file) is listed among the files the model was evaluated on",
    ),
    Mutation(
        P + "hub/card.py",
        "    if auto_class_of(model) not in CLASSIFIER_HEADS:\n        return None\n",
        "    if True:\n        return None\n",
        (LOCAL_CARD,),
        "a classifier's card does not list its labels",
    ),
    Mutation(
        P + "hub/card.py",
        "for i, name in sorted(config.id2label.items())",
        "for name, i in sorted(config.label2id.items())",
        (LOCAL_CARD,),
        "the labels are listed in the order of their names, not of the outputs",
    ),
    # ---- docs/serving.md's encode example runs from what the docs make (issue 46, item 8) -----------------
    Mutation(
        "docs/serving.md",
        "--output_dir outputs/quickstart-encoder-onnx \\\n    --task feature-extraction --int8\n",
        "--output_dir outputs/quickstart-encoder-onnx \\\n    --int8\n",
        (T + "project/test_doc_examples.py::-k serving.md:142",),
        "the serving page exports the masked-LM head, which encode_onnx.py refuses, before encoding with it",
        slow=True,
    ),
    # ---- a documented run repeats on the same machine and thread count (issue 46, item 10) ---------------
    Mutation(
        P + "tasks/common/masking.py",
        "torch.Generator().manual_seed(example_seed(self.seed, self.epoch, int(index)))",
        "torch.Generator().manual_seed(torch.seed())",
        (T + "tasks/test_repeatable_runs.py",),
        "masks drawn from an unseeded generator: the same command gives other numbers",
    ),
    # ---- found by a blind set of bugs (issue 45, item 3) ------------------------------------------------
    Mutation(
        P + "hub/card.py",
        'args={"data_files": own[0] if len(own) == 1 else own})',
        'args={"data_files": own})',
        (LOCAL_CARD,),
        "the model-index's data_files of one local file is a one-item list, not the file the card names",
    ),
    Mutation(
        P + "hub/card.py",
        '    if dataset_name:\n        return {"dataset_name": dataset_name',
        '    if dataset_config_name:\n        return {"dataset_name": dataset_name',
        (REFUSED,),
        "--dataset_name without --dataset_config_name is not taken as the results' data",
    ),
    Mutation(
        P + "hub/export.py",
        "    if results_file:  # the results",
        "    if results_file and dataset_name:  # the results",
        (REFUSED,),
        "a results file of unknown data is refused only after the model is loaded",
    ),
    Mutation(
        P + "tasks/common/sentence_pipeline.py",
        "    for name in (MODULES_FILE, VERSIONS_FILE):",
        "    for name in (MODULES_FILE,):",
        (T + "tasks/test_sentence_pipeline.py::-k prompts",),
        "a stretched sentence encoder loses its prompts and similarity function (config_sentence_transformers.json)",
    ),
    Mutation(
        P + "hub/card.py",
        '"test": ("test_file", "test_mismatched_file")}',
        '"test": ("validation_file", "test_mismatched_file")}',
        (T + "hub/test_hub_card.py::-k own_files",),
        "the model-index says test metrics were measured on the validation file",
    ),
    Mutation(
        P + "hub/card.py",
        'SPLIT_FILES = {"validation": ("validation_file", "validation_mismatched_file"),',
        'SPLIT_FILES = {"validation": ("validation_file",),',
        (T + "hub/test_hub_card.py::-k own_files",),
        "the model-index leaves MNLI's mismatched validation file out of the data its metrics were measured on",
    ),
    Mutation(
        P + "hub/card.py",
        "f\"(`{stage.get('script')}`, attention `{stage.get('attn_impl') or 'exact'}`): \"",
        "f\"(`{stage.get('script')}`, attention `{stage.get('attn_impl', 'exact')}`): \"",
        (T + "hub/test_hub_card.py::-k exact_attention_says",),
        "a training stage with exact attention (attn_impl recorded as null) is described as attention `None`",
    ),
]
