"""Slow tier: WikiHop fine-tuning on two real CPU processes (gloo) equals one process with the
same global batch, under torchrun and under `accelerate launch` with configs/accelerate/cpu-2proc.yaml."""

import pytest
from training_fixtures import logged_losses, read_json, run_on_two_processes, run_script
from wikihop_fixtures import save_tiny_encoder, write_files

pytestmark = pytest.mark.slow


def train_args(model, train, dev, output_dir, per_device_batch):
    return [
        "scripts/finetune_wikihop.py", "--model_name_or_path", model, "--attn_impl", "mra2",
        "--attn_config", '{"block_size": 16}', "--train_file", train, "--validation_file", dev,
        "--max_seq_length", "128", "--do_train", "--do_eval", "--max_steps", "4", "--learning_rate", "2e-3",
        "--logging_steps", "1", "--per_device_train_batch_size", str(per_device_batch),
        "--per_device_eval_batch_size", "4", "--seed", "7", "--use_cpu", "--report_to", "none",
        "--disable_tqdm", "true", "--output_dir", str(output_dir),
    ]  # fmt: skip


def test_two_processes_equal_one(tmp_path):
    """Global batch 8: one process of 8 against two of 4, dropout off, so both see the same examples
    per step and compute the same loss: the logged losses (not doubled), the evaluation and
    predictions.json agree. The development set holds the two real examples (48 and 10 chunks) and
    6 synthetic ones: 8, a multiple of the 2 x 4 evaluation batch (with a remainder, Accelerate fills
    the last batches with repeated examples, which Trainer's eval_loss counts; see the README)."""
    train, dev = write_files(str(tmp_path), dev=6)
    model = save_tiny_encoder(str(tmp_path / "tiny"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    run_script(train_args(model, train, dev, tmp_path / "one", 8))
    run_on_two_processes(lambda output_dir: train_args(model, train, dev, output_dir, 4), str(tmp_path))

    one_losses = logged_losses(tmp_path / "one")
    one = read_json(tmp_path / "one", "all_results.json")
    for other in ("two", "accelerate"):
        losses = logged_losses(tmp_path / other)
        assert len(losses) == len(one_losses) == 4
        assert losses == pytest.approx(one_losses, rel=1e-3)
        results = read_json(tmp_path / other, "all_results.json")
        assert results["eval_samples"] == one["eval_samples"] == 8
        assert results["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-4)
        assert results["eval_accuracy"] == one["eval_accuracy"]
        assert read_json(tmp_path / other, "predictions.json") == read_json(tmp_path / "one", "predictions.json")
