"""Slow tier: WikiHop training runs. A tiny model fits a small synthetic set (loss down, accuracy
up) through the chunked path with MRA-2; the real MiniLM checkpoint fine-tunes on the real WikiHop
examples at its full 512-token length through the command-line script."""

import json

import numpy as np
import pytest
from training_fixtures import read_json, run_script
from wikihop_fixtures import save_tiny_encoder, write_files

from hf_efficient_attn.tasks.wikihop.finetune import main
from hf_efficient_attn.tools.minilm import minilm_path

pytestmark = pytest.mark.slow


def test_a_small_synthetic_set_is_fitted(tmp_path):
    """16 synthetic examples (two chunks each at 64 tokens), evaluated on themselves before and
    after 150 steps: the loss falls and the accuracy rises from chance to (nearly) every example."""
    train, _ = write_files(str(tmp_path), train=16, with_real=False)
    model = save_tiny_encoder(
        str(tmp_path / "tiny"), hidden_size=64, intermediate_size=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    out = tmp_path / "out"
    main([
        "--model_name_or_path", model, "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}',
        "--train_file", train, "--validation_file", train, "--max_seq_length", "64", "--do_train", "--do_eval",
        "--eval_on_start", "--max_steps", "150", "--per_device_train_batch_size", "8", "--learning_rate", "2e-3",
        "--warmup_steps", "5", "--logging_steps", "5", "--save_strategy", "no", "--report_to", "none",
        "--disable_tqdm", "true", "--seed", "0", "--output_dir", str(out),
    ])  # fmt: skip
    history = read_json(out, "trainer_state.json")["log_history"]
    (start,) = [e for e in history if "eval_accuracy" in e]  # the evaluation before training
    end = read_json(out, "eval_results.json")
    losses = [e["loss"] for e in history if "loss" in e]
    assert len(losses) == 30
    assert start["eval_accuracy"] <= 0.5 and end["eval_accuracy"] >= 0.9
    assert end["eval_loss"] < start["eval_loss"] / 4
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) / 4


def test_real_minilm_on_the_real_examples_through_the_script(tmp_path):
    """The real all-MiniLM-L6-v2 checkpoint (a plain BertModel) with MRA-2, fine-tuned and evaluated
    on the real WikiHop examples (in 512-token chunks) as the README runs the script."""
    _, dev = write_files(str(tmp_path), train=0, dev=2)  # the 2 real examples and 2 synthetic ones
    result = run_script([
        "scripts/finetune_wikihop.py", "--model_name_or_path", minilm_path(), "--attn_impl", "mra2",
        "--train_file", dev, "--validation_file", dev, "--max_seq_length", "512", "--do_train", "--do_eval",
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--learning_rate", "3e-5",
        "--report_to", "none", "--disable_tqdm", "true", "--output_dir", str(tmp_path / "out"),
    ])  # fmt: skip
    assert "summary: attention mra2, train " in result.stdout
    results = read_json(tmp_path / "out", "all_results.json")
    assert results["eval_samples"] == 4 and 0 <= results["eval_accuracy"] <= 1
    predictions = read_json(tmp_path / "out", "predictions.json")
    with open(dev) as f:
        examples = {e["id"]: e for e in json.load(f)}
    assert set(predictions) == set(examples) and all(p in examples[i]["candidates"] for i, p in predictions.items())
