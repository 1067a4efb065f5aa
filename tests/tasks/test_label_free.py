"""The paths that run on examples without labels (tests/project/label_free_table.py): finetune_glue.py
--do_predict alone, with the label names of --task_name or of the fine-tuned model's id2label, each
padded, --no_pad_to_max_length and --padding_free, on test rows labelled -1 (as the Hub's) and rows
with no label column. Each example's written prediction is the model's own on that example alone."""

import pytest
import torch
from glue_fixtures import MNLI_NAMES, as_test, mnli_rows, write_rows
from glue_runs import predictions_file
from training_fixtures import small_tokenizer, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.glue import main

SEQ = 64
#: MRA-2 approximating at SEQ tokens: 16-token blocks, one exact block per query block.
MRA = {"block_size": 16, "block_per_row": 1}
MODE_FLAGS = {"padded": [], "no_pad_to_max_length": ["--no_pad_to_max_length"], "padding_free": ["--padding_free"]}


@pytest.fixture(scope="module")
def predicting(tmp_path_factory):
    """A tiny MNLI classifier as a fine-tuned folder holds it (MRA-2 and the label names in its config;
    weights large enough that examples differ in their predicted label), a test file labelled -1 with
    an ``idx`` column, one without a label column, and each row's expected label: the model's argmax
    on that example alone."""
    root = tmp_path_factory.mktemp("label_free")
    config = tiny_config(num_labels=3, id2label=dict(enumerate(MNLI_NAMES)), initializer_range=0.3)
    torch.manual_seed(0)
    model = hea.AutoModelForSequenceClassification.from_config(config, attn_impl="mra2", attn_config=MRA).eval()
    model.save_pretrained(root / "tuned")
    small_tokenizer().save_pretrained(root / "tuned")
    matched, mismatched = mnli_rows(30, 2, seed=1)[:12], mnli_rows(60, 2, seed=2)[:12]
    unlabelled = [{"premise": row["premise"], "hypothesis": row["hypothesis"]} for row in mismatched]
    files = {
        "labelled -1": write_rows(str(root / "test.json"), as_test(matched)),
        "no label column": write_rows(str(root / "test_mm.json"), unlabelled),
    }
    expected = {}
    for name, rows in (("labelled -1", matched), ("no label column", mismatched)):
        alone = [
            small_tokenizer()(r["premise"], r["hypothesis"], truncation=True, max_length=SEQ, return_tensors="pt") for r in rows
        ]
        with torch.no_grad():
            expected[name] = [MNLI_NAMES[int(model(**inputs).logits.argmax())] for inputs in alone]
    assert all(len(set(labels)) > 1 for labels in expected.values())  # the check can tell examples apart
    return {"model": str(root / "tuned"), "files": files, "expected": expected}


@pytest.mark.parametrize("mode", list(MODE_FLAGS))
@pytest.mark.parametrize("labels", ["task", "model"])
def test_predict_only_writes_each_examples_own_prediction(predicting, tmp_path, labels, mode):
    """--do_predict alone (no training or validation data): with --task_name mnli, the matched test file
    (label -1, idx from 100) and the mismatched one (no label column) each get predict_results_mnli*.txt
    indexed by idx (else by row); without a task, a file without labels gets predict_results.txt with
    the names of the model's id2label. Every line is the label the model gives that example alone, in
    every padding mode (batches of 8 mixed-length pairs: padded to 64, to their longest, or packed)."""
    files, expected = predicting["files"], predicting["expected"]
    if labels == "task":
        data = ["--task_name", "mnli", "--test_file", files["labelled -1"], "--test_mismatched_file", files["no label column"]]
        written = {"predict_results_mnli.txt": "labelled -1", "predict_results_mnli-mm.txt": "no label column"}
    else:
        data = ["--test_file", files["no label column"]]
        written = {"predict_results.txt": "no label column"}
    main(["--model_name_or_path", predicting["model"], *data, "--do_predict", "--max_seq_length", str(SEQ),
          "--per_device_eval_batch_size", "8", "--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu",
          *MODE_FLAGS[mode]])  # fmt: skip
    for name, rows in written.items():
        lines = predictions_file(tmp_path / name)
        indices = [str(100 + i) for i in range(12)] if rows == "labelled -1" else [str(i) for i in range(12)]
        assert lines == [[index, label] for index, label in zip(indices, expected[rows])], name
    assert sorted(path.name for path in tmp_path.glob("predict_results*")) == sorted(written)
