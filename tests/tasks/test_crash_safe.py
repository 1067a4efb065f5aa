"""Crash-safe checkpoints: a run killed at any moment, even while it writes a checkpoint, continues
from the last complete checkpoint when the same command is run again, and ends with the
uninterrupted run's evaluation.

Default tier: the kill is simulated in this process (an exception at a chosen point of a save,
which leaves the files a kill there would leave). Slow tier: real SIGKILLs of the scripts, one
in the middle of a checkpoint's writing and several at random moments, for pretraining, GLUE and
WikiHop fine-tuning.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from glue_fixtures import write_task_files
from training_fixtures import REPO, read_json, save_tiny_mlm, write_news_files
from transformers import Trainer

from hf_efficient_attn.tasks.common import driver, trainer
from hf_efficient_attn.tasks.common.driver import COMPLETE_MARKER, last_complete_checkpoint
from hf_efficient_attn.tasks.mlm.pretrain import main

SEQ = 64
#: Steps of the killed runs (a checkpoint at each): room for three kills in the training.
STEPS = 30


class Killed(BaseException):
    """Stands for SIGKILL in this process: nothing catches it, nothing after it runs."""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    train, validation = write_news_files(str(root))
    return {"train": train, "validation": validation, "model": save_tiny_mlm(str(root / "tiny"))}


def mlm_args(workspace, output_dir, *extra):
    return [
        "--model_name_or_path", workspace["model"], "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}',
        "--train_file", workspace["train"], "--validation_file", workspace["validation"], "--max_seq_length",
        str(SEQ), "--output_dir", str(output_dir), "--do_train", "--do_eval", "--max_steps", "6",
        "--max_train_samples", "20", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--save_steps", "2", "--learning_rate", "2e-3", "--report_to", "none", "--disable_tqdm", "true",
        "--seed", "7", *extra,
    ]  # fmt: skip


def kill_at(monkeypatch, owner, name, step):
    """Make ``owner.name`` raise :class:`Killed` when called at training step ``step``."""
    original = getattr(owner, name)

    def killed(*args, **kwargs):
        trainer_or_folder = args[0]
        current = trainer_or_folder.state.global_step if isinstance(trainer_or_folder, Trainer) else args[1]
        if current == step:
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, killed)


@pytest.mark.parametrize(
    "where, limit",
    [
        ("_save_rng_state", None),  # weights and optimizer written; RNG, trainer state and marker not
        ("mark_complete", 1),  # every file written but the marker, with --save_total_limit 1
    ],
)
def test_a_save_killed_midway_is_skipped_and_the_rerun_matches(workspace, tmp_path, monkeypatch, caplog,
                                                               training_steps, where, limit):  # fmt: skip
    extra = ["--save_total_limit", str(limit)] if limit else []
    whole = main(mlm_args(workspace, tmp_path / "whole", *extra))
    assert len(training_steps) == 6

    out = tmp_path / "killed"
    with monkeypatch.context() as patch:
        kill_at(patch, Trainer if where.startswith("_") else trainer, where, 4)
        with pytest.raises(Killed):
            main(mlm_args(workspace, out, *extra))
    assert (out / "checkpoint-4").is_dir() and not (out / "checkpoint-4" / COMPLETE_MARKER).exists()
    assert (out / "checkpoint-2" / COMPLETE_MARKER).exists()  # not rotated away before 4 was complete

    del training_steps[:]
    with caplog.at_level(logging.INFO, logger="hf_efficient_attn.tasks"):
        resumed = main(mlm_args(workspace, out, *extra))
    assert len(training_steps) == 4  # steps 3 to 6: resumed from checkpoint-2, not restarted
    assert f"skipped {out / 'checkpoint-4'}: incomplete" in caplog.text
    assert f"resuming from {out / 'checkpoint-2'}" in caplog.text
    assert resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6)
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]
    kept = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert kept == (["checkpoint-6"] if limit == 1 else ["checkpoint-2", "checkpoint-4", "checkpoint-6"])


def test_a_rerun_after_the_last_checkpoint_trains_nothing_more(workspace, tmp_path, training_steps):
    """Killed after the checkpoint of the last step (in the final save or the evaluation): the rerun
    resumes from it, trains no further step (Trainer alone would run one) and evaluates the same."""
    seven = ("--max_steps", "7")  # 3 steps per epoch: the last one is in mid-epoch
    whole = main(mlm_args(workspace, tmp_path / "whole", *seven))
    shutil.copytree(tmp_path / "whole" / "checkpoint-7", tmp_path / "rerun" / "checkpoint-7")
    del training_steps[:]
    rerun = main(mlm_args(workspace, tmp_path / "rerun", *seven))
    assert training_steps == [] and not (tmp_path / "rerun" / "checkpoint-8").exists()
    assert (rerun["epoch"], rerun["eval_loss"], rerun["eval_accuracy"]) == (
        whole["epoch"], whole["eval_loss"], whole["eval_accuracy"])  # fmt: skip


def test_last_complete_checkpoint(tmp_path):
    for step, complete in ((1, True), (3, True), (5, False), (10, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            driver.mark_complete(str(tmp_path / f"checkpoint-{step}"), step)
    (tmp_path / "checkpoint-7.tmp").mkdir()  # not a checkpoint name
    (tmp_path / "checkpoint-9").write_text("a file")
    last, skipped = last_complete_checkpoint(str(tmp_path))
    assert last == str(tmp_path / "checkpoint-3")
    assert skipped == [str(tmp_path / "checkpoint-10"), str(tmp_path / "checkpoint-5")]
    assert json.loads((tmp_path / "checkpoint-3" / COMPLETE_MARKER).read_text()) == {"global_step": 3}


# ---- real kills (slow tier) ------------------------------------------------------------------------

#: Runs a script with Trainer's save killed (SIGKILL) in the middle of checkpoint KILL_AT_STEP:
#: after the weights and optimizer are written, before the RNG states and trainer state.
KILL_DURING_SAVE = """
import os, runpy, signal, sys
from transformers import Trainer
save_rng_state = Trainer._save_rng_state
def killed(self, output_dir):
    if self.state.global_step == int(os.environ["KILL_AT_STEP"]):
        os.kill(os.getpid(), signal.SIGKILL)
    save_rng_state(self, output_dir)
Trainer._save_rng_state = killed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def environment(**extra) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
            **extra}  # fmt: skip


def complete_steps(output_dir) -> list[int]:
    if not os.path.isdir(output_dir):
        return []
    names = [n for n in os.listdir(output_dir) if n.startswith("checkpoint-")]
    return sorted(int(n.split("-")[1]) for n in names if os.path.isfile(os.path.join(output_dir, n, COMPLETE_MARKER)))


def run_until_killed(command, output_dir, delay: float) -> tuple[str, bool]:
    """Start ``command``, wait until it writes a new checkpoint folder, then ``delay`` seconds more,
    and SIGKILL it. Returns its output (the log says what it resumed from) and whether the kill
    interrupted it (False: it had finished)."""
    before = set(os.listdir(output_dir))
    process = subprocess.Popen(command, cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)  # fmt: skip
    while process.poll() is None and not any(n.startswith("checkpoint-") for n in set(os.listdir(output_dir)) - before):
        time.sleep(0.02)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    log = process.communicate()[0]
    return log, process.returncode == -signal.SIGKILL


def finish(command) -> str:
    result = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def eval_metrics(output_dir) -> dict[str, float]:
    results = read_json(output_dir, "eval_results.json")
    return {k: v for k, v in results.items() if not k.endswith(("_runtime", "_per_second"))}


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """For each script: output folder -> its command line (tiny models, a checkpoint at every step,
    two kept)."""
    from wikihop_fixtures import save_tiny_encoder, write_files

    root = tmp_path_factory.mktemp("kills")
    train, validation = write_news_files(str(root))
    mlm_model = save_tiny_mlm(str(root / "tiny"))
    glue_files = write_task_files(str(root / "cola"), "cola")
    wikihop_train, wikihop_dev = write_files(str(root / "wikihop"), train=16, dev=4, with_real=False)
    common = ["--save_steps", "1", "--save_total_limit", "2", "--logging_steps", "1", "--report_to", "none",
              "--disable_tqdm", "true", "--seed", "5", "--do_train", "--do_eval", "--use_cpu"]  # fmt: skip
    return {
        "mlm": lambda out: [
            "scripts/pretrain_mlm.py", "--model_name_or_path", mlm_model, "--train_file", train, "--validation_file",
            validation, "--max_seq_length", str(SEQ), "--max_steps", str(STEPS), "--per_device_train_batch_size", "4",
            "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}', "--output_dir", str(out), *common,
        ],
        "glue": lambda out: [
            "scripts/finetune_glue.py", "--model_name_or_path", mlm_model, "--task_name", "cola", "--train_file",
            glue_files["train"], "--validation_file", glue_files["validation"], "--max_seq_length", str(SEQ),
            "--max_steps", str(STEPS), "--per_device_train_batch_size", "8", "--attn_impl", "yoso",
            "--output_dir", str(out), *common,
        ],
        "wikihop": lambda out: [
            "scripts/finetune_wikihop.py", "--model_name_or_path", save_tiny_encoder(str(root / "encoder")),
            "--train_file", wikihop_train, "--validation_file", wikihop_dev, "--max_seq_length", "128",
            "--max_steps", str(STEPS), "--per_device_train_batch_size", "4", "--attn_impl", "mra2",
            "--output_dir", str(out), *common,
        ],
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("script", ["mlm", "glue", "wikihop"])
def test_sigkill_at_any_moment_then_rerun_matches_the_uninterrupted_run(script, commands, tmp_path):
    """One SIGKILL in the middle of checkpoint 3's writing, then three at random moments of the
    training (seeded: 0 to 3 steps' time after the rerun writes its first checkpoint; with a
    checkpoint at every step, many land in a save), then the same command to the end: every rerun
    resumes from the last complete checkpoint, and the evaluation equals the uninterrupted run's
    (rel. 1e-4)."""
    command = commands[script]
    finish([sys.executable, *command(tmp_path / "whole")])
    expected = eval_metrics(tmp_path / "whole")

    out = tmp_path / "killed"
    subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, *command(out)], cwd=REPO,
                   env=environment(KILL_AT_STEP="3"), capture_output=True, timeout=900)  # fmt: skip
    assert complete_steps(out) == [1, 2] and (out / "checkpoint-3").is_dir()  # the kill hit checkpoint 3

    rng = random.Random(f"kills-{script}")
    step_seconds = read_json(tmp_path / "whole", "train_results.json")["train_runtime"] / STEPS
    logs = []
    for _ in range(3):
        before = complete_steps(out)
        log, interrupted = run_until_killed([sys.executable, *command(out)], out, rng.uniform(0, 3 * step_seconds))
        assert interrupted, f"the run ended before the kill:\n{log[-2000:]}"
        assert complete_steps(out)[-1] >= before[-1]  # the last complete checkpoint is never lost
        logs.append(log)
    logs.append(finish([sys.executable, *command(out)]))
    assert f"skipped {out / 'checkpoint-3'}: incomplete" in logs[0]
    assert f"resuming from {out / 'checkpoint-2'}" in logs[0]
    assert all("resuming from" in log for log in logs[1:])
    got = eval_metrics(out)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4), key
