"""Slow tier: GLUE fine-tuning on two real CPU processes (gloo) equals one process with the same
global batch, under torchrun and under `accelerate launch` with configs/accelerate/cpu-2proc.yaml;
the real MiniLM checkpoint fine-tunes with LoRA through the command-line scripts as the README
runs them."""

import os

import pytest
from glue_fixtures import write_task_files
from training_fixtures import (
    TWO_PROCESS_LAUNCHERS,
    logged_losses,
    read_json,
    run_on_two_processes,
    run_script,
    save_tiny_mlm,
)

from hf_efficient_attn.tools.minilm import minilm_path

pytestmark = pytest.mark.slow


def train_args(model, files, output_dir, per_device_batch):
    return [
        "scripts/finetune_glue.py", "--model_name_or_path", model, "--attn_impl", "mra2",
        "--attn_config", '{"block_size": 16, "block_per_row": 2}', "--task_name", "mrpc",
        "--train_file", files["train"], "--validation_file", files["validation"], "--test_file", files["test"],
        "--max_seq_length", "64", "--do_train", "--do_eval", "--do_predict", "--max_steps", "8",
        "--learning_rate", "2e-3", "--logging_steps", "1", "--per_device_train_batch_size", str(per_device_batch),
        "--per_device_eval_batch_size", "8", "--seed", "7", "--use_cpu", "--report_to", "none",
        "--disable_tqdm", "true", "--output_dir", str(output_dir),
    ]  # fmt: skip


def test_two_processes_equal_one(tmp_path):
    """Global batch 8: one process of 8 against two of 4 (dropout off, so only the reduction
    order differs). Same examples per step and the loss divided by the step's label count over
    both processes: the logged training losses match (not doubled), and so do the eval metrics
    and every test prediction."""
    files = write_task_files(str(tmp_path / "data"), "mrpc")
    model = save_tiny_mlm(str(tmp_path / "tiny"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    run_script(train_args(model, files, tmp_path / "one", 8))
    run_on_two_processes(lambda output_dir: train_args(model, files, output_dir, 4), str(tmp_path))

    one = read_json(tmp_path / "one", "all_results.json")
    predictions = (tmp_path / "one" / "predict_results_mrpc.txt").read_text()
    for other in ("two", "accelerate"):
        losses = logged_losses(tmp_path / other)
        assert len(losses) == len(logged_losses(tmp_path / "one")) == 8
        assert losses == pytest.approx(logged_losses(tmp_path / "one"), rel=1e-3)
        results = read_json(tmp_path / other, "all_results.json")
        assert results["eval_samples"] == one["eval_samples"]
        for key in ("eval_accuracy", "eval_f1", "eval_combined_score"):
            assert results[key] == one[key], key
        assert results["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-4)
        assert (tmp_path / other / "predict_results_mrpc.txt").read_text() == predictions


def test_real_minilm_with_lora_through_the_scripts(tmp_path):
    """prepare_glue_sample then finetune_glue with MRA-2 and LoRA on real movie reviews."""
    data = tmp_path / "movie_reviews"
    run_script(["scripts/prepare_glue_sample.py", "--sample", "movie_reviews", "--output_dir", str(data)])
    result = run_script([
        "scripts/finetune_glue.py", "--model_name_or_path", str(minilm_path()), "--attn_impl", "mra2",
        "--task_name", "sst2", "--train_file", str(data / "train.csv"), "--validation_file", str(data / "validation.csv"),
        "--max_seq_length", "64", "--peft", "lora", "--do_train", "--do_eval", "--max_steps", "4",
        "--per_device_train_batch_size", "16", "--learning_rate", "1e-3", "--report_to", "none",
        "--disable_tqdm", "true", "--output_dir", str(tmp_path / "out"),
    ])  # fmt: skip
    assert "summary: attention mra2, train " in result.stdout
    results = read_json(tmp_path / "out", "all_results.json")
    assert results["eval_samples"] == 50 and 0 <= results["eval_accuracy"] <= 1
    assert os.path.exists(tmp_path / "out" / "adapter_model.safetensors")


LEAVING_PROBE = """
import gc, os, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback
from hf_efficient_attn.tasks.glue import main

class KeepsItsTrainer(TrainerCallback):  # trainer -> callbacks -> trainer: freed only by the cyclic collector
    def __init__(self, trainer):
        self.trainer = trainer

def init_with_a_cycle(self, *args, init=Trainer.__init__, **kwargs):
    init(self, *args, **kwargs)
    self.add_callback(KeepsItsTrainer(self))

Trainer.__init__ = init_with_a_cycle
alive_at_destroy = []

def destroy(*args, real=dist.destroy_process_group, **kwargs):
    alive_at_destroy.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
    real(*args, **kwargs)

dist.destroy_process_group = destroy
gc.disable()  # no collection at an allocation threshold: only the script's own
main(sys.argv[1:])
# One write per process: two processes' print()s, split into pieces, interleaved on the pipe.
os.write(1, f"group left {not dist.is_initialized()}, DDP alive at destroy {alive_at_destroy}\\n".encode())
"""


def test_each_process_leaves_its_group_after_the_run(tmp_path):
    """finetune_glue's main ends by destroying the process group, from Python, with the run's DDP
    wrapper already freed, even when the trainer sits in a reference cycle (a callback that keeps
    its trainer, the usual way to evaluate extra sets): a group left alive until the interpreter
    exits made one two-process run in eight abort there (SIGABRT in gloo's threads), and a group
    destroyed by the wrapper's reducer can deadlock."""
    files = write_task_files(str(tmp_path / "data"), "mrpc")
    model = save_tiny_mlm(str(tmp_path / "tiny"))
    probe = tmp_path / "probe.py"
    probe.write_text(LEAVING_PROBE)
    args = train_args(model, files, tmp_path / "out", 4)[1:]  # the probe runs main on the script's flags
    result = run_script([str(probe), *args], launcher=TWO_PROCESS_LAUNCHERS["two"])
    assert result.stdout.count("group left True, DDP alive at destroy [0]\n") == 2, result.stdout
