"""A training run repeats exactly on the same machine and thread count, the promise behind the
numbers of docs/long_models_mlm.md: two identical masked-LM runs with MRA-2, at a length where it
approximates, give the same losses, evaluation loss and masked-token accuracy, bit for bit. (Across
thread counts they need not: PyTorch's CPU backward kernels depend on the thread count, with exact
attention as with MRA-2; the page says so.)"""

from __future__ import annotations

import json

import torch
from training_fixtures import save_tiny_mlm, write_news_files

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.mlm.pretrain import main

LENGTH = 256  # 16 key blocks of 16 per query block, 2 kept: MRA-2 approximates
MRA2 = {"block_size": 16, "block_per_row": 2}


def test_two_identical_runs_give_identical_numbers(tmp_path):
    train, validation = write_news_files(str(tmp_path), train_articles=40, validation_articles=8)
    model = save_tiny_mlm(str(tmp_path / "tiny"), max_positions=LENGTH)

    q, k, v = torch.randn(3, 1, 2, LENGTH, 8, generator=torch.Generator().manual_seed(0)).mul(3).unbind(0)
    approximate = hea.efficient_attention(q, k, v, method="mra2", **MRA2)
    exact = hea.efficient_attention(q, k, v, method="softmax")
    assert (approximate - exact).norm() > 0.05 * exact.norm()  # at this length MRA-2 approximates

    runs = []
    for name in ("first", "second"):
        main(["--model_name_or_path", model, "--attn_impl", "mra2", "--attn_config", json.dumps(MRA2),
              "--train_file", train, "--validation_file", validation, "--max_seq_length", str(LENGTH),
              "--do_train", "--do_eval", "--max_steps", "3", "--per_device_train_batch_size", "4",
              "--per_device_eval_batch_size", "4", "--learning_rate", "3e-3", "--logging_steps", "1",
              "--output_dir", str(tmp_path / name), "--report_to", "none", "--disable_tqdm", "true", "--seed", "0"])  # fmt: skip
        state = json.loads((tmp_path / name / "trainer_state.json").read_text())
        results = json.loads((tmp_path / name / "all_results.json").read_text())
        losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
        runs.append((losses, results["eval_loss"], results["eval_accuracy"], results["train_loss"]))
    assert len(runs[0][0]) == 3
    assert runs[0] == runs[1]
