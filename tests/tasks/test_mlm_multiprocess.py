"""Slow tier: two real CPU processes (gloo) equal one with the same global batch, under torchrun
and under `accelerate launch` with configs/accelerate/cpu-2proc.yaml; the real MiniLM checkpoint
stretched to 1024 tokens trains through the command-line scripts."""

import os
import shutil

import pytest
from training_fixtures import (
    logged_losses,
    read_json,
    recorded_rows,
    run_on_two_processes,
    run_script,
    save_tiny_mlm,
    write_news_files,
)

from hf_efficient_attn.tasks.common.driver import COMPLETE_MARKER
from hf_efficient_attn.tools.minilm import minilm_path

pytestmark = pytest.mark.slow


def train_args(model, train, validation, output_dir, per_device_batch):
    return [
        "scripts/pretrain_mlm.py", "--model_name_or_path", model, "--attn_impl", "mra2",
        "--attn_config", '{"block_size": 16}', "--train_file", train, "--validation_file", validation,
        "--max_seq_length", "64", "--do_train", "--do_eval", "--max_steps", "8", "--learning_rate", "2e-3",
        "--logging_steps", "1", "--per_device_train_batch_size", str(per_device_batch),
        "--per_device_eval_batch_size", "8", "--seed", "7", "--use_cpu", "--report_to", "none",
        "--disable_tqdm", "true", "--output_dir", str(output_dir),
    ]  # fmt: skip


def test_two_processes_equal_one(tmp_path):
    """Global batch 8: one process of 8 against two of 4 (dropout off, so only the reduction order
    differs). At every step the two processes together train on exactly the examples and masks the
    one process trains on (recorded by tests/tasks/record_batches.py), the loss is divided by the step's
    masked-token count over both processes: the logged training losses match (not doubled), and so
    does the evaluation."""
    train, validation = write_news_files(str(tmp_path))
    model = save_tiny_mlm(str(tmp_path / "tiny"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def recorded(output_dir, per_device_batch):
        args = train_args(model, train, validation, output_dir, per_device_batch)
        return ["tests/tasks/record_batches.py", str(output_dir) + "-batches", *args]

    run_script(recorded(tmp_path / "one", 8))
    run_on_two_processes(lambda output_dir: recorded(output_dir, 4), str(tmp_path))

    for name in ("two", "accelerate"):  # the final checkpoint: every process's RNG state, then the marker
        checkpoint = tmp_path / name / "checkpoint-8"
        assert {"rng_state_0.pth", "rng_state_1.pth", COMPLETE_MARKER} <= set(os.listdir(checkpoint)), name
    one_losses = logged_losses(tmp_path / "one")
    one = read_json(tmp_path / "one", "all_results.json")
    for other in ("two", "accelerate"):
        for step in range(8):
            expected = recorded_rows(f"{tmp_path / 'one'}-batches", step)
            assert len(expected) == 8
            assert recorded_rows(f"{tmp_path / other}-batches", step, ranks=2) == expected, (other, step)
        losses = logged_losses(tmp_path / other)
        assert len(losses) == len(one_losses) == 8
        assert losses == pytest.approx(one_losses, rel=1e-3)
        results = read_json(tmp_path / other, "all_results.json")
        assert results["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-3)
        assert results["train_loss"] == pytest.approx(one["train_loss"], rel=1e-3)
        assert results["eval_accuracy"] == one["eval_accuracy"]


def test_real_minilm_to_1024_tokens_through_the_scripts(tmp_path):
    """convert_to_long then pretrain_mlm on real Wikipedia articles, as the README runs them."""
    from hf_efficient_attn.tasks.common.data import write_wikipedia_jsonl

    write_wikipedia_jsonl(str(tmp_path / "wiki"), validation_articles=2, min_words=2000)
    long = tmp_path / "minilm-1024-mra2"
    converted = run_script(["scripts/convert_to_long.py", "--model_name_or_path", str(minilm_path()),
                            "--max_length", "1024", "--attn_impl", "mra2", "--output_dir", str(long)])  # fmt: skip
    assert "a new one was initialised" in converted.stdout
    wiki = tmp_path / "wiki"
    result = run_script([
        "scripts/pretrain_mlm.py", "--model_name_or_path", str(long), "--train_file", str(wiki / "train.jsonl"),
        "--validation_file", str(wiki / "validation.jsonl"), "--max_seq_length", "1024", "--do_train", "--do_eval",
        "--max_steps", "3", "--per_device_train_batch_size", "1", "--max_eval_samples", "2", "--learning_rate", "1e-4",
        "--report_to", "none", "--disable_tqdm", "true", "--output_dir", str(tmp_path / "mlm"),
    ])  # fmt: skip
    assert "summary: attention mra2, train " in result.stdout
    results = read_json(tmp_path / "mlm", "all_results.json")
    assert results["eval_samples"] == 2 and 0 <= results["eval_accuracy"] <= 1
    shutil.rmtree(long)
