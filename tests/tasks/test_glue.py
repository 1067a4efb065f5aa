"""GLUE fine-tuning: metrics against references computed another way, tiny runs on real text in
the Hub's layouts (csv, tsv, json) whose reported metrics equal scikit-learn/scipy on the saved
model's own predictions, MNLI matched + mismatched, the submission files, LoRA round trip with
Linformer's projections, resume = uninterrupted, bad input and the GLUE recipes. The canonical tasks,
labels and options: test_glue_tasks.py."""

import dataclasses
import json
import os
import shutil

import numpy as np
import paths
import pytest
import torch
from glue_fixtures import MNLI_NAMES, write_rows
from glue_runs import SEQ, make_workspace, predictions_file, read_rows, read_text, run, run_config
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from training_fixtures import TrainingSet, assert_summary_rate, read_json
from transformers import AutoTokenizer, TrainingArguments

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.common.adapters import PeftArguments, apply_lora
from hf_efficient_attn.tasks.common.args import ModelArguments, parse_arguments
from hf_efficient_attn.tasks.common.metrics import classification_scores
from hf_efficient_attn.tasks.glue import GLUE_TASKS, GlueDataArguments, label_id, main, write_predictions

REPO = str(paths.REPO)
RECIPES = os.path.join(REPO, "configs", "train")


# ---- metrics and labels ----------------------------------------------------------------------


def test_scores_equal_their_definitions():
    """Each score against its textbook formula (not the library it is computed with)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    predictions = np.where(rng.random(200) < 0.7, labels, 1 - labels)
    tp = np.sum((predictions == 1) & (labels == 1))
    tn = np.sum((predictions == 0) & (labels == 0))
    fp = np.sum((predictions == 1) & (labels == 0))
    fn = np.sum((predictions == 0) & (labels == 1))
    mcc = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    f1 = 2 * tp / (2 * tp + fp + fn)
    accuracy = (tp + tn) / len(labels)
    assert classification_scores("matthews_correlation", predictions, labels) == pytest.approx({"matthews_correlation": mcc})
    assert classification_scores("accuracy_and_f1", predictions, labels) == pytest.approx(
        {"accuracy": accuracy, "f1": f1, "combined_score": (accuracy + f1) / 2}
    )
    scores, gold = rng.normal(size=50), rng.uniform(0, 5, 50)

    def ranks(x):  # no ties in continuous draws
        return np.argsort(np.argsort(x))

    pearson = np.corrcoef(scores, gold)[0, 1]
    spearman = np.corrcoef(ranks(scores), ranks(gold))[0, 1]
    assert classification_scores("pearson_and_spearman", scores, gold) == pytest.approx(
        {"pearson": pearson, "spearmanr": spearman, "combined_score": (pearson + spearman) / 2}
    )
    with pytest.raises(ValueError, match="unknown metric kind 'bleu'; allowed: matthews_correlation"):
        classification_scores("bleu", predictions, labels)


def test_labels_as_ids_or_names():
    names = GLUE_TASKS["mnli"].label_names
    assert [label_id(v, names, "train") for v in ("entailment", "neutral", "contradiction", 0, 2)] == [0, 1, 2, 0, 2]
    assert label_id(-1, names, "test") == -1
    assert label_id(3.25, None, "train") == 3.25
    with pytest.raises(ValueError, match="label 'maybe'; allowed: entailment, neutral, contradiction or their ids 0..2"):
        label_id("maybe", names, "validation")
    with pytest.raises(ValueError, match="label -1; allowed"):
        label_id(-1, names, "validation")  # unlabelled rows only in test splits
    with pytest.raises(ValueError, match="non-numeric regression label 'high'"):
        label_id("high", None, "train")
    # labels read from the data (no task) are names, even when they are numbers
    assert [label_id(v, ("1", "2"), "train", ids=False) for v in (1, 2)] == [0, 1]
    with pytest.raises(ValueError, match="label 0; allowed: 1, 2$"):
        label_id(0, ("1", "2"), "train", ids=False)


def test_submission_file_format(tmp_path):
    """GLUE's server reads ids for SST-2 etc., names for MNLI/QNLI/RTE, 3 decimals for STS-B."""
    path = str(tmp_path / "p.txt")
    write_predictions(path, [7, 8], np.array([1, 0]), GLUE_TASKS["rte"].label_names, submits_names=True)
    assert read_text(path) == "index\tprediction\n7\tnot_entailment\n8\tentailment\n"
    write_predictions(path, [0, 1], np.array([1, 0]), GLUE_TASKS["sst2"].label_names, submits_names=False)
    assert read_text(path) == "index\tprediction\n0\t1\n1\t0\n"
    write_predictions(path, [0], np.array([3.14159]), None, submits_names=False)
    assert read_text(path) == "index\tprediction\n0\t3.142\n"


# ---- tiny runs on real text ------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("glue"))


def reloaded_logits(model, model_dir, task, rows):
    """Logits of the saved model on ``rows``, tokenised here (padded to SEQ as the run did)."""
    first, second = GLUE_TASKS[task].text_columns
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [[r[first] for r in rows]] + ([[r[second] for r in rows]] if second else [])
    encoded = tokenizer(*texts, padding="max_length", max_length=SEQ, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**encoded).logits.numpy()


def gold_labels(task, rows):
    names = GLUE_TASKS[task].label_names
    if names is None:
        return np.array([r["label"] for r in rows], dtype=float)
    return np.array([names.index(r["label"]) if isinstance(r["label"], str) else r["label"] for r in rows])


EXPECTED_KEYS = {
    "cola": {"eval_matthews_correlation"},
    "mrpc": {"eval_accuracy", "eval_f1", "eval_combined_score"},
    "stsb": {"eval_pearson", "eval_spearmanr", "eval_combined_score"},
}
REFERENCES = {
    "eval_matthews_correlation": lambda p, g: matthews_corrcoef(g, p),
    "eval_accuracy": lambda p, g: accuracy_score(g, p),
    "eval_f1": lambda p, g: f1_score(g, p),
    "eval_pearson": lambda p, g: pearsonr(p, g)[0],
    "eval_spearmanr": lambda p, g: spearmanr(p, g)[0],
}


@pytest.mark.parametrize("task", ["cola", "mrpc", "stsb"])
def test_task_reports_its_metrics_as_sklearn_computes_them(workspace, tmp_path, task, capsys):
    """A single-sentence task (csv), a pair task (tsv) and the regression task (json lines)
    train a few steps; the reported metrics are exactly the task's, equal to scikit-learn /
    scipy on the saved model's predictions, the submission file holds those predictions
    and the closing summary gives the task's main score."""
    out = tmp_path / task
    if task == "cola":  # a single .json argument is the whole configuration; dynamic padding
        (tmp_path / "cola.json").write_text(json.dumps(run_config(workspace, task, out, pad_to_max_length=False)))
        training_set = TrainingSet()
        metrics = main([str(tmp_path / "cola.json")], callbacks=[training_set])
    else:
        metrics = run(workspace, task, out)
    results = read_json(out, "eval_results.json")
    scores = {k for k in results if k not in ("eval_loss", "eval_samples", "epoch") and "_per_second" not in k}
    assert scores - {"eval_runtime"} == EXPECTED_KEYS[task]
    assert read_json(out, "all_results.json") == {**read_json(out, "train_results.json"), **results}
    assert metrics["eval_samples"] == len(read_rows(workspace["files"][task]["validation"]))

    model = hea.AutoModelForSequenceClassification.from_pretrained(str(out))
    assert model.config.attn_impl == "mra2"
    assert model.config.num_labels == (1 if task == "stsb" else 2)
    rows = read_rows(workspace["files"][task]["validation"])
    logits = reloaded_logits(model, str(out), task, rows)
    predictions = logits[:, 0] if task == "stsb" else logits.argmax(-1)
    gold = gold_labels(task, rows)
    for key in EXPECTED_KEYS[task] - {"eval_combined_score"}:
        assert results[key] == pytest.approx(REFERENCES[key](predictions, gold), rel=1e-4, abs=1e-6), key
    if "eval_combined_score" in results:
        parts = [results[k] for k in EXPECTED_KEYS[task] - {"eval_combined_score"}]
        assert results["eval_combined_score"] == pytest.approx(np.mean(parts))

    submitted = predictions_file(out / f"predict_results_{task}.txt")
    assert [int(i) for i, _ in submitted] == [100 + i for i in range(len(rows))]  # the test set's idx
    if task == "stsb":
        np.testing.assert_allclose([float(v) for _, v in submitted], predictions, atol=6e-4)
    else:
        assert [int(v) for _, v in submitted] == predictions.tolist()
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("summary: attention mra2, train ")
    # the task's main score: the combined score of a task with several (GLUE's leaderboard), else its only one
    score = "eval_combined_score" if len(EXPECTED_KEYS[task]) > 1 else min(EXPECTED_KEYS[task])
    assert f", eval {score[len('eval_') :].replace('_', ' ')} {results[score]:.4f}, eval_loss " in summary
    if task == "cola":  # padded per batch: the training examples' own lengths, not the evaluation set's
        assert_summary_rate(summary, read_json(out, "train_results.json"), training_set.examples)


def test_mnli_reports_matched_and_mismatched(workspace, tmp_path):
    """Labels given as names (matched) and as ids (mismatched) map to the Hub's ids; the
    mismatched set is reported with the suffix _mm and predicted into its own file, in names."""
    out = tmp_path / "mnli"
    run(workspace, "mnli", out)
    results = read_json(out, "eval_results.json")
    assert {"eval_accuracy", "eval_accuracy_mm", "eval_loss_mm", "eval_samples_mm"} <= set(results)
    assert read_json(out, "all_results.json")["eval_accuracy_mm"] == results["eval_accuracy_mm"]
    model = hea.AutoModelForSequenceClassification.from_pretrained(str(out))
    assert model.config.id2label == dict(enumerate(MNLI_NAMES))
    files = workspace["files"]["mnli"]
    for suffix, split, predict_name in (("", "validation", "mnli"), ("_mm", "validation_mismatched", "mnli-mm")):
        rows = read_rows(files[split])
        predictions = reloaded_logits(model, str(out), "mnli", rows).argmax(-1)
        gold = gold_labels("mnli", rows)
        assert results[f"eval_accuracy{suffix}"] == pytest.approx(accuracy_score(gold, predictions))
        assert results[f"eval_samples{suffix}"] == len(rows)
        submitted = predictions_file(out / f"predict_results_{predict_name}.txt")
        assert [v for _, v in submitted] == [MNLI_NAMES[p] for p in predictions]


def test_resume_equals_uninterrupted(workspace, tmp_path, training_steps):
    """Six steps with a checkpoint at step 3; a rerun in a folder holding only checkpoint-3
    trains the 3 remaining steps and ends with the same eval loss as the run that never stopped."""
    whole = run(workspace, "cola", tmp_path / "whole", save_steps=3)
    assert len(training_steps) == 6
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", tmp_path / "resumed" / "checkpoint-3")
    resumed = run(workspace, "cola", tmp_path / "resumed", save_steps=3)
    assert len(training_steps) == 6 + 3
    assert resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6)
    assert resumed["eval_matthews_correlation"] == whole["eval_matthews_correlation"]


# ---- LoRA ------------------------------------------------------------------------------------


def linformer_layers(model):
    from hf_efficient_attn.methods.linformer import Linformer

    return [m for m in model.modules() if isinstance(m, Linformer)]


def test_lora_round_trip_with_linformer(workspace, tmp_path):
    """--peft lora with Linformer: the adapter holds LoRA weights, the task head and Linformer's
    trained projections (not the base); reloaded onto the same base and method it reproduces the
    run's eval loss and predictions, with the Linformer attention running."""
    from peft import PeftModel
    from safetensors.torch import load_file

    out = tmp_path / "lora"
    run(workspace, "mrpc", out, attn_impl="linformer", attn_config={"k": 8}, peft="lora", lora_r=4, learning_rate=1e-2)
    assert not os.path.exists(out / "model.safetensors")
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_A" in k for k in saved) and any("classifier" in k for k in saved)
    assert any("efficient_attn" in k for k in saved)
    assert not any("word_embeddings" in k for k in saved)  # the frozen base stays out

    base = hea.AutoModelForSequenceClassification.from_pretrained(
        workspace["model"], attn_impl="linformer", attn_config={"k": 8}, num_labels=2
    )
    calls = []
    for layer in linformer_layers(base):
        layer.register_forward_hook(lambda *args: calls.append(1))
    tuned = PeftModel.from_pretrained(base, str(out))
    rows = read_rows(workspace["files"]["mrpc"]["validation"])
    logits = reloaded_logits(tuned, str(out), "mrpc", rows)
    assert len(calls) == base.config.num_hidden_layers  # Linformer ran once per layer
    gold = gold_labels("mrpc", rows)
    loss = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(gold)).item()
    results = read_json(out, "eval_results.json")
    assert loss == pytest.approx(results["eval_loss"], rel=1e-4)
    assert results["eval_accuracy"] == pytest.approx(accuracy_score(gold, logits.argmax(-1)))


def test_lora_keeps_the_method_and_trains_its_parameters():
    from training_fixtures import tiny_config

    model = hea.AutoModelForSequenceClassification.from_config(
        tiny_config(num_labels=2), attn_impl="linformer", attn_config={"k": 8}
    )
    tuned = apply_lora(model, PeftArguments(peft="lora", lora_r=2), task_type="SEQ_CLS")
    trainable = {n for n, p in tuned.named_parameters() if p.requires_grad}
    assert any("efficient_attn" in n for n in trainable) and any("lora_A" in n for n in trainable)
    assert not any("query.base_layer" in n for n in trainable)
    assert tuned.get_base_model().config.attn_impl == "linformer"
    with pytest.raises(ValueError, match=r"--lora_target_modules \['q_proj'\]: no such module; linear layers here: "):
        apply_lora(hea.AutoModelForSequenceClassification.from_config(tiny_config(num_labels=2)),
                   PeftArguments(peft="lora", lora_target_modules=["q_proj"]), task_type="SEQ_CLS")  # fmt: skip


@pytest.mark.parametrize(("model_type", "targets"), [("bert", ["query", "value"]), ("distilbert", ["q_lin", "v_lin"]),
                                                     ("gte", ["q_proj", "v_proj"]), ("modernbert", ["Wqkv"])])  # fmt: skip
def test_lora_targets_the_attention_projections_by_default(model_type, targets, monkeypatch):
    """Without --lora_target_modules, LoRA adapts the query and value projections of every attention
    layer, whatever the architecture names them, or its fused projection (ModernBERT's Wqkv). An
    architecture with neither asks for the flag; given, it is used."""
    from peft.tuners.lora import LoraLayer
    from tiny import tiny_config

    from hf_efficient_attn.tasks.common import adapters

    def model():
        return hea.AutoModelForSequenceClassification.from_config(tiny_config(model_type, num_labels=2), attn_impl="mra2")

    tuned = apply_lora(model(), PeftArguments(peft="lora"), task_type="SEQ_CLS")
    adapted = sorted(name.rsplit(".", 1)[-1] for name, m in tuned.named_modules() if isinstance(m, LoraLayer))
    assert adapted == sorted(targets * tuned.config.num_hidden_layers)
    monkeypatch.setattr(adapters, "QUERY_VALUE_PROJECTIONS", ())
    monkeypatch.setattr(adapters, "FUSED_PROJECTIONS", ())
    with pytest.raises(ValueError, match="found no query and value projections to adapt: give --lora_target_modules"):
        apply_lora(model(), PeftArguments(peft="lora"), task_type="SEQ_CLS")
    tuned = apply_lora(model(), PeftArguments(peft="lora", lora_target_modules=targets), task_type="SEQ_CLS")
    assert any(isinstance(m, LoraLayer) for m in tuned.modules())


def test_peft_arguments_are_checked():
    """Each limit at its boundary: --lora_dropout 0 (no dropout) is accepted, 1 and below 0 refused."""
    with pytest.raises(ValueError, match="--peft 'ia3': unknown; allowed: lora"):
        PeftArguments(peft="ia3")
    with pytest.raises(ValueError, match="--lora_r must be a positive integer"):
        PeftArguments(peft="lora", lora_r=0)
    for refused in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"--lora_dropout must be in \[0, 1\)"):
            PeftArguments(peft="lora", lora_dropout=refused)
    assert PeftArguments(peft="lora", lora_dropout=0.0).lora_dropout == 0.0


# ---- bad input -------------------------------------------------------------------------------


def test_data_arguments_are_checked(workspace, tmp_path):
    files = workspace["files"]
    with pytest.raises(ValueError, match="--task_name 'mnli-mm': unknown; allowed: cola, sst2, mrpc, stsb, qqp, mnli"):
        GlueDataArguments(task_name="mnli-mm")
    with pytest.raises(ValueError, match="are MNLI's: add --task_name mnli"):
        GlueDataArguments(task_name="rte", train_file=files["mrpc"]["train"],
                          validation_mismatched_file=files["mrpc"]["validation"])  # fmt: skip
    with pytest.raises(ValueError, match="allowed extensions: json, jsonl, csv, tsv"):
        GlueDataArguments(task_name="rte", train_file=str(tmp_path / "train.parquet"))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="--max_predict_samples must be a positive integer"):
            GlueDataArguments(task_name="rte", max_predict_samples=bad)
    hub = GlueDataArguments(task_name="QNLI")  # no local file: the Hub's GLUE
    assert (hub.task_name, hub.dataset_name, hub.dataset_config_name) == ("qnli", "nyu-mll/glue", "qnli")
    with pytest.raises(ValueError, match="give a dataset: --dataset_name NAME"):  # not the task's Hub config instead
        GlueDataArguments(task_name="mnli", dataset_config_name="ax")
    for flags in (["test_file"], ["test_file", "test_mismatched_file"]):  # predict-only from local files: no Hub
        local = GlueDataArguments(task_name="mnli", **dict.fromkeys(flags, files["mrpc"]["validation"]))
        assert local.dataset_name is None and local.dataset_config_name is None, flags


def test_bad_data_is_refused(workspace, tmp_path):
    files = workspace["files"]
    with pytest.raises(ValueError, match=r"no column 'question1': this task reads \['question1', 'question2'\]"):
        run(workspace, "mrpc", tmp_path / "a", task_name="qqp")
    wrong = write_rows(str(tmp_path / "wrong.tsv"), [{"sentence1": "a b", "sentence2": "c d", "label": "yes"}])
    with pytest.raises(ValueError, match="validation data has label 'yes'; allowed: not_equivalent, equivalent"):
        run(workspace, "mrpc", tmp_path / "b", validation_file=wrong)
    with pytest.raises(ValueError, match="must have the same format"):
        run(workspace, "mrpc", tmp_path / "c", validation_file=files["cola"]["validation"])
    with pytest.raises(ValueError, match="--do_predict needs a test split"):
        run(workspace, "cola", tmp_path / "d", test_file=None)
    with pytest.raises(ValueError, match=r"--max_seq_length 512 exceeds the model's position table \(130 tokens\)"):
        run(workspace, "cola", tmp_path / "e", max_seq_length=512)


def test_hub_layout_is_read_as_local_files(monkeypatch):
    """--task_name alone reads nyu-mll/glue (replaced here by an in-memory copy of its MNLI
    layout: ClassLabel ids, validation_matched/..._mismatched, test labels -1); the splits get
    the local names and nothing is carved from train."""
    import datasets
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    from hf_efficient_attn.tasks.glue import load_glue_splits

    features = Features(premise=Value("string"), hypothesis=Value("string"),
                        label=ClassLabel(names=list(MNLI_NAMES)), idx=Value("int32"))  # fmt: skip

    def split(labels):
        n = len(labels)
        return Dataset.from_dict({"premise": ["p"] * n, "hypothesis": ["h"] * n, "label": labels, "idx": list(range(n))},
                                 features=features)  # fmt: skip

    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        hub = {"train": [0, 1, 2, 1], "validation_matched": [2, 0], "validation_mismatched": [1],
               "test_matched": [-1, -1], "test_mismatched": [-1]}  # fmt: skip
        return DatasetDict({s: split(labels) for s, labels in hub.items()})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    raw = load_glue_splits(GlueDataArguments(task_name="mnli"))
    assert calls == [("nyu-mll/glue", "mnli")]
    assert sorted(raw) == ["test", "test_mismatched", "train", "validation", "validation_mismatched"]
    assert len(raw["train"]) == 4 and raw["validation"]["label"] == [2, 0]
    names = GLUE_TASKS["mnli"].label_names
    assert [label_id(v, names, "test_mismatched") for v in raw["test_mismatched"]["label"]] == [-1]


def test_without_a_task_labels_come_from_the_data(workspace, tmp_path):
    """No --task_name (run_glue's own-data path): text columns by name, labels = the sorted
    distinct training labels, accuracy; names in the config."""
    rows = [{"review": r["sentence"], "label": "pos" if r["label"] else "neg"} for r in read_rows(
        workspace["files"]["cola"]["train"])]  # fmt: skip
    train = write_rows(str(tmp_path / "train.csv"), rows[:120])
    validation = write_rows(str(tmp_path / "validation.csv"), rows[120:])
    metrics = run(workspace, "cola", tmp_path / "out", task_name=None, train_file=train, validation_file=validation,
                  test_file=None, do_predict=None)  # fmt: skip
    assert 0 <= metrics["eval_accuracy"] <= 1 and "eval_matthews_correlation" not in metrics
    model = hea.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out"))
    assert model.config.id2label == {0: "neg", 1: "pos"}


# ---- recipes -----------------------------------------------------------------------------------


GLUE_RECIPES = sorted(name for name in os.listdir(RECIPES) if name.startswith("glue-"))


@pytest.mark.parametrize("name", GLUE_RECIPES)
def test_recipes_parse(name, tmp_path, monkeypatch):
    """Every configs/train/glue-*.json is a whole configuration of finetune_glue.py (without
    bf16, which TrainingArguments refuses on a machine without a GPU), online: their Hub model
    (roberta-base) is downloadable there."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    with open(os.path.join(RECIPES, name)) as f:
        recipe = json.load(f)
    types = (ModelArguments, GlueDataArguments, PeftArguments, TrainingArguments)
    flags = {f.name for cls in types for f in dataclasses.fields(cls)}
    assert set(recipe) <= flags, sorted(set(recipe) - flags)
    recipe.pop("bf16", None)
    (tmp_path / name).write_text(json.dumps(recipe))
    model_args, data_args, _, training_args = parse_arguments(types, [str(tmp_path / name)])
    assert data_args.task_name in GLUE_TASKS and model_args.attn_impl in hea.list_methods()
    assert training_args.do_train and training_args.do_eval


def test_mnli_recipe_has_the_papers_settings():
    """The MRA paper's Table 8 (Zeng et al. ICML 2022; RoBERTa-base, MNLI): 512 tokens, batch 32, lr 3e-5, 4 epochs."""
    for name, processes in (("glue-mnli-roberta-base-mra2.json", 1), ("glue-mnli-roberta-base-mra2-8gpu.json", 8)):
        with open(os.path.join(RECIPES, name)) as f:
            recipe = json.load(f)
        batch = recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1) * processes
        assert (recipe["max_seq_length"], batch, recipe["learning_rate"], recipe["num_train_epochs"]) == (
            512, 32, 3e-5, 4)  # fmt: skip
        assert recipe["task_name"] == "mnli" and recipe["model_name_or_path"] == "roberta-base"


def test_predict_only_from_a_fine_tuned_folder_writes_the_label_names(workspace, tmp_path):
    """Local data without a task: a model fine-tuned on it predicts a test file with nothing but its
    own folder (the labels come from its config's id2label), and predict_results.txt holds the label
    names it knows, each the argmax of its own logits; a model that knows no labels is refused."""
    from hf_efficient_attn.tasks.glue import write_offline_sample

    data = tmp_path / "news"
    write_offline_sample("newsgroups", str(data))
    tuned = tmp_path / "tuned"
    common = ["--max_seq_length", "64", "--report_to", "none", "--use_cpu", "--per_device_eval_batch_size", "16"]
    main(["--model_name_or_path", workspace["model"], "--train_file", str(data / "train.csv"), "--do_train",
          "--max_steps", "2", "--per_device_train_batch_size", "8", "--output_dir", str(tuned), *common])  # fmt: skip
    predicted = tmp_path / "predicted"
    main(["--model_name_or_path", str(tuned), "--test_file", str(data / "validation.csv"), "--do_predict",
          "--output_dir", str(predicted), *common])  # fmt: skip
    rows = read_rows(str(data / "validation.csv"))
    written = predictions_file(predicted / "predict_results.txt")
    model = hea.AutoModelForSequenceClassification.from_pretrained(str(tuned)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tuned))
    with torch.no_grad():
        inputs = tokenizer([row["sentence"] for row in rows], truncation=True, max_length=64, padding=True, return_tensors="pt")
        expected = [model.config.id2label[int(i)] for i in model(**inputs).logits.argmax(-1)]
    assert [label for _, label in written] == expected and set(expected) <= {"alt.atheism", "sci.space"}
    with pytest.raises(ValueError, match="or from a model fine-tuned with them .* give --train_file, or such a model"):
        main(["--model_name_or_path", workspace["model"], "--test_file", str(data / "validation.csv"), "--do_predict",
              "--output_dir", str(tmp_path / "untuned"), *common])  # fmt: skip


def test_predict_only_from_a_fine_tuned_regression_folder_writes_its_scores(workspace, tmp_path):
    """STS-B's files without --task_name (float labels: regression): the fine-tuned folder alone predicts
    a test file (its config says regression), and predict_results.txt holds each pair's score, the
    model's own output to 3 decimals."""
    files = workspace["files"]["stsb"]
    tuned = tmp_path / "tuned"
    common = ["--max_seq_length", str(SEQ), "--pad_to_max_length", "--report_to", "none", "--use_cpu",
              "--per_device_eval_batch_size", "16"]  # fmt: skip
    main(["--model_name_or_path", workspace["model"], "--train_file", files["train"], "--do_train", "--max_steps", "2",
          "--per_device_train_batch_size", "8", "--output_dir", str(tuned), *common])  # fmt: skip
    predicted = tmp_path / "predicted"
    main(["--model_name_or_path", str(tuned), "--test_file", files["test"], "--do_predict", "--output_dir",
          str(predicted), *common])  # fmt: skip
    model = hea.AutoModelForSequenceClassification.from_pretrained(str(tuned))
    assert model.config.problem_type == "regression"
    expected = reloaded_logits(model, str(tuned), "stsb", read_rows(files["test"]))[:, 0]
    written = [float(score) for _, score in predictions_file(predicted / "predict_results.txt")]
    np.testing.assert_allclose(written, expected, atol=1e-3)


def test_local_data_with_an_id_column_takes_its_text_column(workspace, tmp_path):
    """id,text,label without a task: the text column is the string one (not the integer id) and the run
    trains and evaluates; a file with no string column besides the label is refused naming its columns."""
    rows = read_rows(workspace["files"]["cola"]["train"])[:40]
    with_id = [
        {"id": 1000 + i, "text": row["sentence"], "label": "good" if row["label"] else "bad"} for i, row in enumerate(rows)
    ]
    write_rows(str(tmp_path / "train.csv"), with_id)
    common = ["--train_file", str(tmp_path / "train.csv"), "--validation_file", str(tmp_path / "train.csv"),
              "--max_seq_length", "64", "--report_to", "none", "--use_cpu", "--per_device_train_batch_size", "8"]  # fmt: skip
    results = main(["--model_name_or_path", workspace["model"], "--do_train", "--do_eval", "--max_steps", "1",
                    "--output_dir", str(tmp_path / "out"), *common])  # fmt: skip
    assert 0 <= results["eval_accuracy"] <= 1
    write_rows(str(tmp_path / "numbers.csv"), [{"id": i, "score": 2 * i, "label": "good"} for i in range(8)])
    with pytest.raises(ValueError, match=r"no text column besides label/idx: its columns are id \(int64\), score \(int64\)"):
        main(["--model_name_or_path", workspace["model"], "--do_train", "--train_file", str(tmp_path / "numbers.csv"),
              "--max_seq_length", "64", "--report_to", "none", "--output_dir", str(tmp_path / "none")])  # fmt: skip
