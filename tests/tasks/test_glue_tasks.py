"""GLUE fine-tuning against the canonical tasks: every task's columns, labels and metric against a
frozen copy of the Hub's features, training from the Hub's layout on the canonical labels,
regression read from the label type, the metrics against their definitions, gradient
accumulation = one large batch, and the length, padding and sample-limit options."""

import json
import os

import numpy as np
import pytest
import torch
from glue_fixtures import single_sentence_rows, write_rows
from glue_runs import make_workspace, predictions_file, read_rows, run
from transformers import AutoTokenizer, EvalPrediction

from hf_efficient_attn.tasks.common.metrics import classification_scores
from hf_efficient_attn.tasks.glue import GLUE_TASKS


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("glue"))


#: A frozen copy of the features of every GLUE task on the Hub (nyu-mll/glue; the GlueConfig of
#: each task in huggingface/datasets' datasets/glue/glue.py), as ``datasets.Features.to_dict()``.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "glue_features.json")) as _f:
    CANONICAL_FEATURES = json.load(_f)
#: The official score(s) of each task (Wang et al. 2018, "GLUE: A Multi-Task Benchmark and Analysis
#: Platform for Natural Language Understanding", Table 1), named as evaluate's glue metric names them.
CANONICAL_SCORES = {
    "cola": ("matthews_correlation",), "sst2": ("accuracy",), "mrpc": ("accuracy", "f1"), "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"), "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",),
    "wnli": ("accuracy",),
}  # fmt: skip
#: Tasks whose GLUE server reads class names, not ids, in the submission file (run_glue.py's
#: predict_results for these tasks writes names).
SUBMITS_NAMES = {"mnli", "qnli", "rte"}


def canonical(task):
    from datasets import Features

    features = Features.from_dict(CANONICAL_FEATURES[task])
    label = features["label"]
    names = tuple(label.names) if hasattr(label, "names") else None
    return features, tuple(c for c in features if c not in ("label", "idx")), names


def test_every_glue_task_is_known():
    assert set(GLUE_TASKS) == set(CANONICAL_FEATURES) == set(CANONICAL_SCORES)


@pytest.mark.parametrize("task", sorted(CANONICAL_FEATURES))
def test_task_columns_labels_and_metric_are_the_canonical_ones(task):
    from hf_efficient_attn.tasks.common.metrics import SCORE_NAMES

    _, columns, names = canonical(task)
    spec = GLUE_TASKS[task]
    assert tuple(c for c in spec.text_columns if c) == columns
    assert spec.label_names == names
    assert SCORE_NAMES[spec.metric] == CANONICAL_SCORES[task]
    assert spec.submits_names == (task in SUBMITS_NAMES)


def hub_copy(task, rows=12):
    """An in-memory copy of the task on the Hub: its features, every class among the labels, the
    Hub's split names (MNLI's validation_matched, ...), unlabelled test rows (-1)."""
    from datasets import Dataset, DatasetDict

    features, columns, names = canonical(task)
    sentences = [r["sentence"] for r in single_sentence_rows()[0]]

    def split(count, labelled=True, start=0):
        if names is None:
            labels = [round(0.37 * (i % 14), 2) for i in range(count)] if labelled else [-1.0] * count
        else:
            labels = [(i * 7 + start) % len(names) for i in range(count)] if labelled else [-1] * count
        data = {c: [sentences[(start + i + j * 5) % len(sentences)] for i in range(count)] for j, c in
                enumerate(columns)}  # fmt: skip
        return Dataset.from_dict({**data, "label": labels, "idx": list(range(count))}, features=features)

    if task == "mnli":
        splits = {"train": split(rows), "validation_matched": split(6, start=1), "validation_mismatched": split(5, start=2),
                  "test_matched": split(4, False), "test_mismatched": split(3, False)}  # fmt: skip
    else:
        splits = {"train": split(rows), "validation": split(6, start=1), "test": split(4, False)}
    return DatasetDict(splits)


def captured_glue(workspace, monkeypatch, tmp_path, task, **overrides):
    from training_fixtures import Captured, capture_trainer

    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        run(workspace, task, tmp_path / "captured", **overrides)
    return caught.value.kwargs


@pytest.mark.parametrize("task", sorted(CANONICAL_FEATURES))
def test_every_task_from_the_hub_trains_on_its_canonical_labels(workspace, monkeypatch, tmp_path, task):
    """--task_name alone (nyu-mll/glue, here its in-memory copy with the canonical features): the
    model's classes are the dataset's ClassLabel names in id order, the targets are the dataset's
    ids (floats for STS-B), and the task's official metric scores it."""
    import datasets

    hub = hub_copy(task)
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name=None, **kwargs: hub)
    trainer = captured_glue(workspace, monkeypatch, tmp_path, "cola", task_name=task, train_file=None,
                            validation_file=None, test_file=None)  # fmt: skip
    _, _, names = canonical(task)
    config = trainer["model"].config
    if names is None:
        assert config.num_labels == 1
        assert list(trainer["train_dataset"]["labels"]) == pytest.approx(list(hub["train"]["label"]))
    else:
        assert config.id2label == dict(enumerate(names)) and config.label2id == {n: i for i, n in enumerate(names)}
        assert list(trainer["train_dataset"]["labels"]) == list(hub["train"]["label"])
        validation = hub["validation" if task != "mnli" else "validation_matched"]
        assert list(trainer["eval_dataset"]["labels"]) == list(validation["label"])
    assert trainer["compute_metrics"].kind == GLUE_TASKS[task].metric
    assert trainer["compute_metrics"].regression == (names is None)


@pytest.mark.parametrize(
    ("labels", "dtype", "expected"),
    [
        ([0.5, 1.25, 3.0], "float64", None),
        ([0.5, 1.25, 3.0], "float32", None),
        ([0.5, 1.25, 3.0], "float16", None),
        ([2, 0, 1, 2], "int64", ("0", "1", "2")),
        ([1, 3, 1], "int32", ("1", "3")),
        (["pos", "neg", "pos"], "string", ("neg", "pos")),
    ],
)
def test_regression_or_classes_are_read_from_the_labels_type(labels, dtype, expected):
    """Without a task, float labels of any width are a regression target; integers and strings
    are classes (sorted distinct values, as run_glue.py)."""
    from datasets import Dataset, Features, Value

    from hf_efficient_attn.tasks.glue import label_names_of

    train = Dataset.from_dict({"sentence": ["a"] * len(labels), "label": labels},
                              features=Features(sentence=Value("string"), label=Value(dtype)))  # fmt: skip
    assert label_names_of(None, train) == expected


def test_float_labels_of_a_csv_file_train_a_regression_head(workspace, monkeypatch, tmp_path):
    """A local csv without a task (pandas reads its labels as float64): one output, float targets
    equal to the file's, scored by mean squared error."""
    rows = read_rows(workspace["files"]["stsb"]["train"])
    train = write_rows(str(tmp_path / "train.csv"), rows[:40])
    validation = write_rows(str(tmp_path / "validation.csv"), rows[40:60])
    trainer = captured_glue(workspace, monkeypatch, tmp_path, "stsb", task_name=None, train_file=train,
                            validation_file=validation, test_file=None, do_predict=None)  # fmt: skip
    assert trainer["model"].config.num_labels == 1
    assert list(trainer["train_dataset"]["labels"]) == pytest.approx([r["label"] for r in rows[:40]])
    assert trainer["compute_metrics"].kind == "mse" and trainer["compute_metrics"].regression


def test_accuracy_mse_and_predictions_equal_their_definitions():
    from hf_efficient_attn.tasks.common.metrics import SequenceClassificationMetrics

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 100)
    predictions = np.where(rng.random(100) < 0.6, labels, rng.integers(0, 3, 100))
    assert classification_scores("accuracy", predictions, labels) == pytest.approx({"accuracy": np.mean(predictions == labels)})
    scores, gold = rng.normal(size=30), rng.uniform(0, 5, 30)
    assert classification_scores("mse", scores, gold) == pytest.approx({"mse": np.mean((scores - gold) ** 2)})

    logits = rng.normal(size=(100, 3))
    classes = SequenceClassificationMetrics("accuracy", regression=False)
    np.testing.assert_array_equal(classes.predictions(logits), [int(np.argmax(row)) for row in logits])
    result = classes(EvalPrediction(predictions=(logits,), label_ids=labels))
    assert result == pytest.approx({"accuracy": np.mean(logits.argmax(-1) == labels)})
    regression = SequenceClassificationMetrics("pearson_and_spearman", regression=True)
    np.testing.assert_array_equal(regression.predictions(scores[:, None]), scores)


def test_gradient_accumulation_equals_one_large_batch(workspace, tmp_path):
    """Batch 16 equals 8 x 2 accumulated (dropout off): the same logged loss and the same model;
    --max_predict_samples keeps the first test rows."""
    common = {"model_name_or_path": workspace["no_dropout"], "max_steps": 3, "max_predict_samples": 5}
    large = run(workspace, "mrpc", tmp_path / "large", **common, per_device_train_batch_size=16)
    accumulated = run(workspace, "mrpc", tmp_path / "acc", **common, per_device_train_batch_size=8,
                      gradient_accumulation_steps=2)  # fmt: skip
    assert accumulated["train_loss"] == pytest.approx(large["train_loss"], rel=1e-4)
    assert accumulated["eval_loss"] == pytest.approx(large["eval_loss"], rel=1e-4)
    assert [int(i) for i, _ in predictions_file(tmp_path / "acc" / "predict_results_mrpc.txt")] == list(
        range(100, 105))  # fmt: skip


def test_lengths_padding_and_sample_limits(workspace, monkeypatch, tmp_path):
    """--max_seq_length truncates each pair as the tokenizer does; --pad_to_max_length pads every
    example to it (else the collator pads each batch); --max_train/eval_samples keep the first rows."""
    from transformers import DataCollatorWithPadding, default_data_collator

    files = workspace["files"]["mrpc"]
    rows = read_rows(files["train"])
    tokenizer = AutoTokenizer.from_pretrained(workspace["model"])
    for length in (24, 40):
        expected = tokenizer([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], truncation=True,
                             max_length=length)["input_ids"]  # fmt: skip
        dynamic = captured_glue(workspace, monkeypatch, tmp_path, "mrpc", max_seq_length=length,
                                pad_to_max_length=False)  # fmt: skip
        assert list(dynamic["train_dataset"]["input_ids"]) == expected
        assert isinstance(dynamic["data_collator"], DataCollatorWithPadding)
        padded = captured_glue(workspace, monkeypatch, tmp_path, "mrpc", max_seq_length=length, max_train_samples=7,
                               max_eval_samples=3)  # fmt: skip
        assert padded["data_collator"] is default_data_collator
        assert [ids[: len(e)] for ids, e in zip(padded["train_dataset"]["input_ids"], expected)] == expected[:7]
        assert {len(ids) for ids in padded["train_dataset"]["input_ids"]} == {length}
        assert len(padded["train_dataset"]) == 7 and len(padded["eval_dataset"]) == 3
        gold = [int(r["label"]) for r in read_rows(files["validation"])[:3]]
        assert list(padded["eval_dataset"]["labels"]) == gold


def test_padding_free_refuses_a_head_that_averages_each_row(workspace, tmp_path):
    """--padding_free with a model whose classifier averages each row's tokens (EuroBERT's default
    pooling) is refused before training, naming the pooling."""
    from training_fixtures import save_tiny_mlm

    model = save_tiny_mlm(str(tmp_path / "eurobert"), "eurobert")
    with pytest.raises(ValueError, match="--padding_free: this model's classifier_pooling='late' averages"):
        run(workspace, "mrpc", tmp_path / "out", model_name_or_path=model, padding_free=True)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("task", ["mrpc", "stsb"])
def test_padding_free_packs_each_batch_and_keeps_logits_and_loss(workspace, monkeypatch, tmp_path, task):
    """finetune_glue.py --padding_free: examples are left unpadded and each batch is one packed row,
    whose logits (one row per example) and loss equal those of the same examples padded; classes
    and regression alike."""
    from transformers import DataCollatorWithPadding

    trainer = captured_glue(workspace, monkeypatch, tmp_path, task, padding_free=True)
    examples = [trainer["train_dataset"][i] for i in range(6)]
    assert len({len(e["input_ids"]) for e in examples}) > 1  # not padded to one length
    packed = trainer["data_collator"](examples)
    padded = DataCollatorWithPadding(trainer["processing_class"])(examples)
    assert packed["input_ids"].shape == (1, sum(len(e["input_ids"]) for e in examples))
    model = trainer["model"].eval()
    with torch.no_grad():
        packed_out, padded_out = model(**packed), model(**padded)
    torch.testing.assert_close(packed_out.logits, padded_out.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(packed_out.loss, padded_out.loss, atol=1e-5, rtol=1e-4)
