"""What a run prints: a short training run, and a short method comparison, print what a user needs
(progress, metrics, the summary and where the files went) in at most 40 lines, ``--log_level info``
everything Transformers' examples print; Ctrl-C is one line (and, in training, how rerunning resumes;
in a comparison, from none of its processes a traceback), exit status 130; masked-LM
pretraining says how much text did not fill a block; encode_onnx counts the texts it truncated; a Hub
id that cannot be downloaded (offline mode, no network) is one error naming why and the way out.
Each message's advice is taken and checked to work."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import types

import huggingface_hub.constants
import pytest
import transformers.utils.hub
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
from test_compare import arguments as comparison_arguments
from test_compare import finished, workspace  # noqa: F401  (fixtures: the tiny comparison)
from training_fixtures import (
    REPO,
    Captured,
    capture_trainer,
    read_json,
    save_tiny_mlm,
    small_tokenizer,
    write_news_files,
)
from transformers import TrainerCallback

from hf_efficient_attn.tasks.convert import main as convert_main
from hf_efficient_attn.tasks.mlm import compare, compare_stage, pretrain
from hf_efficient_attn.utils.cli_errors import DEBUG_VARIABLE, INTERRUPTED_STATUS, run_cli

#: The most lines a short training run may print by default.
SHORT_OUTPUT = 40


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("output")
    train, validation = write_news_files(str(root), train_articles=20, validation_articles=4)
    return {"root": root, "train": train, "validation": validation, "model": save_tiny_mlm(str(root / "tiny"))}


def mlm_arguments(files, output_dir, *extra):
    """A short pretrain_mlm.py run on the news text (exact attention, 32-token blocks)."""
    return ["--model_name_or_path", files["model"], "--train_file", files["train"], "--validation_file",
            files["validation"], "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--do_train",
            "--output_dir", str(output_dir), "--report_to", "none", *extra]  # fmt: skip


# ---- a short run's output ------------------------------------------------------------------------------


def compare_arguments(files, output_dir, *extra):
    """A short compare_methods.py run on the news text: softmax and linformer, 32-token blocks."""
    return ["--model_name_or_path", files["model"], "--methods", "softmax,linformer", "--train_file", files["train"],
            "--validation_file", files["validation"], "--max_seq_length", "32", "--per_device_train_batch_size", "2",
            "--max_eval_samples", "8", "--output_dir", str(output_dir), "--report_to", "none", *extra]  # fmt: skip


def run_as_a_user(script, arguments, python_path=REPO, **env) -> tuple[int, list[str]]:
    """Exit status and lines (stdout and stderr) of ``scripts/<script>.py arguments`` run as a user runs
    it, in a process group of its own (what a terminal's Ctrl-C reaches); ``env`` added to the environment."""
    # Not what the tests of this process left behind: TrainingArguments(torch_compile=True) sets
    # ACCELERATE_DYNAMO_* in os.environ for good, and a user's shell holds no PYTEST_* variables.
    leftovers = ("ACCELERATE_", "FSDP_", "PYTEST_")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(leftovers)}, "PYTHONPATH": python_path,
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **env}  # fmt: skip
    for variable in ("TRANSFORMERS_VERBOSITY", "HF_DATASETS_DISABLE_PROGRESS_BARS", DEBUG_VARIABLE):
        env.pop(variable, None)
    # A user's shell starts the script with Ctrl-C at its default. A SIGINT that native code run by an earlier
    # test left ignored in this process would be inherited (ignored signals survive exec), and the Ctrl-C tests
    # could not interrupt the script: seen in full slow-tier runs only, never alone. Installing a handler here
    # resets what the child inherits.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        command = [sys.executable, f"scripts/{script}.py", *arguments]
        result = subprocess.run(command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, timeout=600)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    output = result.stdout.decode()  # bytes: text mode would turn a progress bar's \r updates into lines
    return result.returncode, output.rstrip("\n").split("\n")


def printed(arguments, script="pretrain_mlm") -> list[str]:
    """The lines of a run of ``script`` (:func:`run_as_a_user`) that succeeds."""
    status, lines = run_as_a_user(script, arguments)
    assert status == 0, "\n".join(lines)[-3000:]
    return lines


@pytest.mark.parametrize("log_level", [None, pytest.param("info", marks=pytest.mark.slow)])
def test_a_short_run_prints_what_a_user_needs(files, tmp_path, log_level):
    """A 10-step run with evaluation prints its progress, metrics, summary and output folder in at
    most 40 lines; Transformers' and datasets' info lines (configs, loading, Trainer's advertisement)
    only with --log_level info, which prints every line Transformers' examples print. Seconds: the
    script runs as a user runs it, in a fresh interpreter (what it prints is the process's output)."""
    out = tmp_path / "out"
    level = ["--log_level", log_level] if log_level else []
    lines = printed(mlm_arguments(files, out, "--do_eval", "--max_steps", "10", "--max_eval_samples", "8", *level))
    text = "\n".join(lines)
    assert "10/10" in text and "***** train metrics *****" in text and "***** eval metrics *****" in text
    assert lines[-1].startswith("summary: ") and lines[-1].endswith(f"files in {out}")
    library_lines = ("loading configuration file", "Do not forget to share your model", "Using custom data configuration")
    if log_level is None:
        assert len(lines) <= SHORT_OUTPUT, text
        assert not any(line in text for line in library_lines) and "process rank" not in text
    else:
        assert len(lines) > SHORT_OUTPUT and all(line in text for line in library_lines)
        # datasets' lines once per data file, not a second time through the root logger
        assert sum("Using custom data configuration" in line for line in lines) == 2


@pytest.mark.parametrize("log_level", [None, pytest.param("info", marks=pytest.mark.slow)])
def test_a_short_comparison_prints_what_a_user_needs(request, tmp_path, log_level):
    """A comparison of two methods over 4 steps after a head warm-up (test_compare's tiny comparison,
    whose run by default is shared with test_compare), evaluated and saved every 2 steps, prints for each
    method what it trains and where, its training bar and its closing line, then where the results went:
    at most 40 lines, no line per evaluation or checkpoint and no Trainer metrics block. --log_level info
    prints all that Trainer and the libraries print. Seconds: the comparison runs once per test run as
    a user runs it (its process, and its methods' processes forked from a fork server that imports the
    training stack once), for every test that reads it."""
    if log_level is None:
        out, _ = request.getfixturevalue("finished")
        lines = (out.parent / "printed.txt").read_bytes().decode().split("\n")  # bytes: a bar's \r updates stay in their line
    else:
        out = tmp_path / "out"
        lines = printed(
            comparison_arguments(request.getfixturevalue("workspace"), out, "--log_level", log_level), "compare_methods"
        )
    text = "\n".join(lines)
    for method in ("softmax", "linformer"):
        assert sum(line.startswith(f"{method}: training {method} ") and line.endswith(f" in {out / method}")
                   for line in lines) == 1  # fmt: skip
        assert sum(line.startswith(f"{method}: step 4, eval accuracy ") for line in lines) == 1
    assert text.count("4/4 [") >= 2  # each method's training bar reached its end
    assert lines[-1] == f"wrote results.csv, comparison.png and summary.md to {out}"
    per_evaluation = ("'eval_loss'", "***** train metrics *****", "Writing model shards")
    if log_level is None:
        assert len(lines) <= SHORT_OUTPUT, text
        assert not any(noise in text for noise in per_evaluation)
        assert sum("do not fill a block" in line for line in lines) == 2  # the data, said once: train and validation
        assert "WARNING" not in text  # the new head, linformer's new projections, the checkpoints' rotation
    else:
        assert len(lines) > SHORT_OUTPUT and all(noise in text for noise in per_evaluation)
        assert text.count("'eval_loss'") == 2 * 3 and "loading configuration file" in text  # steps 0, 2, 4


# ---- Ctrl-C --------------------------------------------------------------------------------------------


class CtrlC(TrainerCallback):
    """Raises KeyboardInterrupt (what Ctrl-C raises) at the end of optimisation step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def exit_status(main, arguments) -> int:
    """The exit status of ``run_cli(main, arguments)``; a KeyboardInterrupt getting through it (the
    user would see a traceback) fails the test instead of stopping pytest."""
    try:
        run_cli(main, arguments)
    except SystemExit as exit_info:
        return exit_info.code
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C got through run_cli: a traceback")
    pytest.fail("run_cli returned")


def interrupted(arguments, step, capsys) -> tuple[int, str]:
    """Exit status and stderr of pretrain_mlm.py interrupted at ``step``, through run_cli."""
    status = exit_status(lambda argv: pretrain.main(argv, callbacks=[CtrlC(step)]), arguments)
    return status, capsys.readouterr().err


def test_ctrl_c_in_training_is_one_line_and_rerunning_resumes(files, tmp_path, capsys, caplog, monkeypatch):
    """Ctrl-C at step 3 of a run that saves every 2 steps: one line, no traceback, exit status 130,
    naming checkpoint-2; rerunning the same command, as it says, resumes from checkpoint-2 and
    finishes. Before the first checkpoint, it says that rerunning starts again. HEA_DEBUG shows the
    traceback."""
    out = tmp_path / "out"
    arguments = mlm_arguments(files, out, "--max_steps", "4", "--save_steps", "2")
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    status, err = interrupted(arguments, 3, capsys)
    checkpoint = out / "checkpoint-2"
    assert status == INTERRUPTED_STATUS == 130 and "Traceback" not in err
    advice = f"rerun the same command to resume from {checkpoint}, the last complete checkpoint"
    assert err.splitlines()[-1] == f"interrupted: {advice}"

    caplog.set_level(logging.WARNING, logger="hf_efficient_attn.tasks")
    pretrain.main(arguments)
    assert f"resuming from {checkpoint}, the last complete checkpoint" in caplog.text
    assert read_json(str(out), "trainer_state.json")["global_step"] == 4

    fresh = mlm_arguments(files, tmp_path / "fresh", "--max_steps", "4", "--save_steps", "2")
    status, err = interrupted(fresh, 1, capsys)
    assert (status, err.splitlines()[-1]) == (130, f"interrupted: {tmp_path / 'fresh'} holds no complete checkpoint yet, "
                                                   "so rerunning the same command starts training again")  # fmt: skip
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(KeyboardInterrupt):
        run_cli(lambda argv: pretrain.main(argv, callbacks=[CtrlC(1)]), fresh)


def test_ctrl_c_with_an_explicit_checkpoint_advises_leaving_the_flag_out(files, tmp_path, capsys, caplog):
    """A run given --resume_from_checkpoint resumes from it at every rerun: after Ctrl-C the line says to
    rerun without the flag, and so rerun it resumes from the newer checkpoint."""
    out = tmp_path / "out"
    pretrain.main(mlm_arguments(files, out, "--max_steps", "2", "--save_steps", "2"))
    arguments = mlm_arguments(files, out, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint",
                              str(out / "checkpoint-2"))  # fmt: skip
    status, err = interrupted(arguments, 5, capsys)
    advice = f"without --resume_from_checkpoint to resume from {out / 'checkpoint-4'}, the last complete checkpoint"
    assert (status, err.splitlines()[-1]) == (130, f"interrupted: rerun the same command {advice}")
    caplog.set_level(logging.WARNING, logger="hf_efficient_attn.tasks")
    pretrain.main(arguments[:-2])
    assert f"resuming from {out / 'checkpoint-4'}" in caplog.text


#: Put on PYTHONPATH as sitecustomize.py, imported by every Python process started with it (a comparison's
#: method processes too): Ctrl-C, that is SIGINT to the process group (as a terminal sends it) or, with
#: CTRL_C_TO=self, to the method's process alone, at the end of step N of the stage STAGE (CTRL_C_AT=STAGE:N).
CTRL_C_HOOK = """
import os
import signal

from transformers import TrainerCallback

from hf_efficient_attn.tasks.common import trainer

STAGE, STEP = os.environ["CTRL_C_AT"].split(":")


class CtrlC(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if os.path.basename(args.output_dir) == STAGE and state.global_step == int(STEP):
            if os.environ.get("CTRL_C_TO") == "self":
                os.kill(os.getpid(), signal.SIGINT)
            else:
                os.killpg(os.getpgrp(), signal.SIGINT)


class WithCtrlC(trainer.CrashSafeTrainer):
    def __init__(self, *args, callbacks=None, **kwargs):
        super().__init__(*args, callbacks=[*(callbacks or []), CtrlC()], **kwargs)


trainer.CrashSafeTrainer = WithCtrlC
"""


@pytest.mark.slow  # three processes start, twice
@pytest.mark.parametrize("sent_to", ["group", "self"])
def test_ctrl_c_in_a_comparison_is_one_line_and_rerunning_resumes(files, tmp_path, capsys, caplog, monkeypatch, sent_to):
    """Ctrl-C at step 3 of linformer, the second method (each saves every 2 steps), reaching both processes
    (or the method's alone): no traceback from either, one line saying what rerunning does, exit status
    130. Rerunning the same command, as it says, skips softmax and resumes linformer from checkpoint-2.
    (The default tier: test_ctrl_c_ends_a_comparisons_method_process_quietly and the next test.)"""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(CTRL_C_HOOK)
    out = tmp_path / "out"
    arguments = compare_arguments(files, out, "--max_steps", "4", "--eval_steps", "2")
    status, lines = run_as_a_user("compare_methods", arguments, python_path=f"{hook}{os.pathsep}{REPO}",
                                  CTRL_C_AT="linformer:3", CTRL_C_TO=sent_to)  # fmt: skip
    text = "\n".join(lines)
    assert status == INTERRUPTED_STATUS and "Traceback" not in text and "softmax: step 4" in text, text
    checkpoint = out / "linformer" / "checkpoint-2"
    assert lines[-1] == (
        f"interrupted: rerun the same command: finished methods are skipped and linformer resumes from {checkpoint}, "
        "its last complete checkpoint"
    )

    caplog.set_level(logging.WARNING, logger="hf_efficient_attn.tasks")
    monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)  # the stages in this process
    rows = compare.main(arguments)
    assert f"softmax: finished before, skipped ({out / 'softmax'})" in capsys.readouterr().out
    assert f"resuming from {checkpoint}, the last complete checkpoint" in caplog.text
    assert [(row["method"], row["step"]) for row in rows] == [(method, step) for method in ("softmax", "linformer")
                                                              for step in (0, 2, 4)]  # fmt: skip


def test_ctrl_c_ends_a_comparisons_method_process_quietly(monkeypatch):
    """In a method's process, Ctrl-C ends the process with exit status 130, sending nothing to the parent
    (which, interrupted too, says it in one line): by SystemExit, with which multiprocessing ends a
    process without printing a traceback as it does for any other exception."""

    def interrupted_stage(stage):
        raise KeyboardInterrupt("rerun the same command to resume from checkpoint-2")

    monkeypatch.setattr(compare_stage, "run_stage", interrupted_stage)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    try:
        compare_stage._stage_process(sender, None)
    except SystemExit as exit_info:
        assert exit_info.code == INTERRUPTED_STATUS and not receiver.poll()
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C got out of the method's process: multiprocessing prints a traceback for it")
    else:
        pytest.fail("the method's process ended as if it had finished")


@pytest.mark.parametrize("status, raised", [(None, KeyboardInterrupt), (3, RuntimeError)])
def test_a_method_process_interrupted_alone_interrupts_the_comparison(monkeypatch, status, raised):
    """A method's process that Ctrl-C reached alone (exit status 130, nothing sent) interrupts the
    parent as its own Ctrl-C would (the one line, exit 130); one that died otherwise is an error naming
    its exit status. (Forked here, with the stage replaced; the comparison starts its processes from a fork server.)"""

    def stopped_stage(stage):
        if status is None:
            raise KeyboardInterrupt
        os._exit(status)

    monkeypatch.setattr(compare_stage, "run_stage", stopped_stage)
    fork = multiprocessing.get_context("fork")
    monkeypatch.setattr(compare_stage.multiprocessing, "get_context", lambda method: fork)
    stage = types.SimpleNamespace(name="linformer")  # what the parent reads of a stage
    with pytest.raises(raised, match=None if status is None else f"exit status {status}"):
        compare_stage.run_in_own_process(stage)


def test_ctrl_c_before_a_methods_first_checkpoint_says_it_starts_again(files, tmp_path, capsys, monkeypatch):
    """Ctrl-C at step 1 of linformer, before its first checkpoint (step 2): the line says that rerunning
    skips the finished softmax and starts linformer again; so rerun, linformer trains from step 0 to the end."""
    out = tmp_path / "out"
    arguments = compare_arguments(files, out, "--max_steps", "2", "--eval_steps", "2")
    monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)  # the stages in this process
    trainer = compare_stage.mlm_trainer

    def with_ctrl_c(model, training_args, *args, **kwargs):
        built = trainer(model, training_args, *args, **kwargs)
        if os.path.basename(training_args.output_dir) == "linformer":
            built.add_callback(CtrlC(1))
        return built

    with monkeypatch.context() as interrupting:
        interrupting.setattr(compare_stage, "mlm_trainer", with_ctrl_c)
        assert exit_status(compare.main, arguments) == INTERRUPTED_STATUS
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: rerun the same command: finished methods are skipped and linformer starts again "
        f"({out / 'linformer'} holds no complete checkpoint yet)"
    )
    rows = compare.main(arguments)
    assert "softmax: finished before, skipped" in capsys.readouterr().out
    assert [row["step"] for row in rows if row["method"] == "linformer"] == [0, 2]


def test_ctrl_c_outside_training_is_one_line(files, tmp_path, capsys, monkeypatch):
    """Ctrl-C while a script loads (here convert_to_long, its model) is the line ``interrupted``,
    exit status 130, no traceback."""
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", ctrl_c)
    status = exit_status(convert_main, ["--model_name_or_path", files["model"], "--output_dir", str(tmp_path / "long")])
    assert status == 130 and capsys.readouterr().err == "\ninterrupted\n"


# ---- what masked-LM pretraining leaves out -------------------------------------------------------------


def test_mlm_says_how_many_tokens_do_not_fill_a_block(files, tmp_path, caplog, monkeypatch):
    """Blocks of 48 tokens from the news text: the tokens past the last whole block are counted in the
    log (the count worked out from the tokenizer). Its advice, --line_by_line, makes each line an
    example instead: then no text is left out for not filling a block."""
    caplog.set_level(logging.INFO, logger="hf_efficient_attn.tasks")
    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        pretrain.main(mlm_arguments(files, tmp_path, "--max_seq_length", "48"))
    with open(files["train"]) as f:
        texts = [line.rstrip("\n") for line in f]
    total = sum(len(ids) for ids in small_tokenizer()(texts)["input_ids"])
    blocks, left_out = divmod(total, 48)
    assert left_out > 0 and len(caught.value.kwargs["train_dataset"]) == blocks
    assert (
        f"train: {blocks} blocks of 48 tokens; {left_out} of the {total} tokens ({left_out / total:.0%}) do not fill a "
        "block and are left out (at most 47 per 1000 texts; --line_by_line makes each line an example instead, padded or "
        "truncated to 48 tokens)"
    ) in caplog.messages

    caplog.clear()
    with pytest.raises(Captured) as caught:
        pretrain.main(mlm_arguments(files, tmp_path, "--max_seq_length", "48", "--line_by_line"))
    assert len(caught.value.kwargs["train_dataset"]) == len([text for text in texts if text.strip()])
    assert not [message for message in caplog.messages if "left out" in message]


# ---- encode_onnx's truncated texts ----------------------------------------------------------------------


def test_encode_onnx_counts_the_texts_it_truncates(built_once, tmp_path, caplog):
    """encode_onnx.py --max_length 100 on texts of 450, 30 and 200 tokens warns that 2 of 3 were
    truncated and that the model reads up to 512; taking the advice (--max_length 512) truncates none
    and the rows of the long texts change. A text longer than the model's 512 is truncated at its limit,
    and the warning advises no larger max_length."""
    import numpy as np

    onnx_tests = pytest.importorskip("test_onnx_encode")
    from hf_efficient_attn.serving import encode_cli

    export = built_once("onnx_encode_embedder", onnx_tests.build_embedder) / "onnx"
    texts = onnx_tests.texts_of([450, 30, 200])

    def encoded(max_length, texts=texts):
        path = tmp_path / f"rows{max_length}.npy"
        encode_cli.main(["--export_dir", str(export), "--output_file", str(path), "--max_length", str(max_length),
                         "--texts", *texts])  # fmt: skip
        return np.load(path)

    def warnings():
        return [record.getMessage() for record in caplog.records if record.name == "hf_efficient_attn.serving.encoding"]

    caplog.set_level(logging.WARNING, logger="hf_efficient_attn.serving.encoding")
    caplog.clear()  # the export's own check warns about its texts
    short = encoded(100)
    assert warnings() == [
        "2 of 3 texts were longer than max_length=100 tokens, truncated (the model reads up to 512: a larger max_length "
        "keeps more)"
    ]
    caplog.clear()
    whole = encoded(512)
    assert warnings() == []
    np.testing.assert_allclose(whole[1], short[1], atol=1e-5)
    assert not np.allclose(whole[[0, 2]], short[[0, 2]], atol=1e-3)
    caplog.clear()
    encoded(512, onnx_tests.texts_of([600, 30]))
    assert warnings() == ["1 of 2 texts were longer than max_length=512 tokens, truncated (the model's limit)"]


# ---- a Hub id that cannot be downloaded ----------------------------------------------------------------

#: A model id on the (fake) Hub of these tests.
HUB_ID = "someone/tiny-mlm"
COMMIT = "c" * 40


def fake_hub(monkeypatch, repo_folder, reachable=True) -> list[str]:
    """Transformers' downloads (``hf_hub_download`` / ``snapshot_download``) served from ``repo_folder``
    for :data:`HUB_ID` into the cache as huggingface_hub writes it; ``local_files_only`` (offline mode)
    or ``reachable=False`` (no network) raise what huggingface_hub raises then. Returns the files fetched."""
    fetched = []

    def fetch(repo_id, filename, cache_dir, revision, local_files_only):
        if local_files_only or not reachable:
            raise LocalEntryNotFoundError(f"{filename} of {repo_id} is not in the cache")
        source = os.path.join(repo_folder, filename)
        if repo_id != HUB_ID or not os.path.isfile(source):
            raise EntryNotFoundError(f"{repo_id} has no {filename}")
        fetched.append(filename)
        repo = os.path.join(cache_dir or huggingface_hub.constants.HF_HUB_CACHE, f"models--{repo_id.replace('/', '--')}")
        os.makedirs(os.path.join(repo, "snapshots", COMMIT), exist_ok=True)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", revision or "main"), "w") as f:
            f.write(COMMIT)
        return shutil.copy(source, os.path.join(repo, "snapshots", COMMIT, filename))

    def download(repo_id, filename, *args, cache_dir=None, revision=None, local_files_only=False, **kwargs):
        return fetch(repo_id, filename, cache_dir, revision, local_files_only)

    def snapshot(repo_id, *args, allow_patterns=(), cache_dir=None, revision=None, local_files_only=False, **kwargs):
        for filename in allow_patterns:
            try:
                fetch(repo_id, filename, cache_dir, revision, local_files_only)
            except EntryNotFoundError:
                pass

    def unresolved(self, repo_id, *args, revision=None, **kwargs):
        raise LocalEntryNotFoundError(f"{repo_id} has no commit for {revision} here")  # Transformers keeps the name

    def listed(self, repo_id, *args, **kwargs):
        if not reachable:
            raise LocalEntryNotFoundError("no network")
        return sorted(os.listdir(repo_folder)) if repo_id == HUB_ID else []

    def subfolder(self, repo_id, path_in_repo=None, *args, **kwargs):
        listed(self, repo_id)
        return iter(())  # the repo holds files only (the tokenizer looks for a chat templates folder)

    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", download)
    monkeypatch.setattr(transformers.utils.hub, "snapshot_download", snapshot)
    monkeypatch.setattr(huggingface_hub.HfApi, "resolve_revision", unresolved)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", listed)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", subfolder)
    return fetched


def training_model(script, files, output_dir, model, monkeypatch, *extra):
    """The model the training script ``script`` would train from ``--model_name_or_path model``."""
    if script == "compare_methods":
        arguments = ["--model_name_or_path", model, "--methods", "softmax,mra2", "--max_steps", "2",
                     "--head_warmup_steps", "0", "--train_file", files["train"], "--validation_file",
                     files["validation"], "--max_seq_length", "32", "--output_dir", str(output_dir), *extra]  # fmt: skip
        monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)
    else:
        arguments = mlm_arguments(files, output_dir, "--model_name_or_path", model, *extra)
    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        (compare if script == "compare_methods" else pretrain).main(arguments)
    return caught.value.kwargs["model"]


def offline_error(flag: str = "model_name_or_path") -> str:
    return (
        rf"^--{flag} 'someone/tiny-mlm' is not in the local Hub cache, and offline mode \(HF_HUB_OFFLINE=1\) "
        "forbids downloading it: give a local folder, or unset HF_HUB_OFFLINE$"
    )


OFFLINE = offline_error()


@pytest.mark.parametrize(
    "script, flag",
    [*((script, "model_name_or_path") for script in ("pretrain_mlm", "compare_methods", "convert_to_long")),
     ("pretrain_mlm", "config_name"), ("pretrain_mlm", "tokenizer_name")],
)  # fmt: skip
def test_offline_hub_id_is_one_error_naming_offline_mode(script, flag, files, tmp_path, monkeypatch, capsys):
    """In offline mode a Hub id missing from the cache is refused as the flags are parsed (nothing
    loaded), naming offline mode, the flag that gave it and the ways out; through run_cli, one line
    and exit status 2. ``--config_name`` and ``--tokenizer_name`` beside a local model too."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    model = ["--model_name_or_path", HUB_ID if flag == "model_name_or_path" else files["model"]]
    if flag != "model_name_or_path":
        model += [f"--{flag}", HUB_ID]
    arguments = [*model, "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path)]
    main = convert_main
    if script != "convert_to_long":
        main = compare.main if script == "compare_methods" else pretrain.main
        arguments += ["--train_file", files["train"], "--do_train", "--max_steps", "2"]
    with pytest.raises(ValueError, match=offline_error(flag)):
        main(arguments)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, arguments)
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("script", ["pretrain_mlm", "compare_methods"])
def test_offline_advice_works(script, files, tmp_path, monkeypatch):
    """The offline error's ways out: a local folder (the model itself) trains; with HF_HUB_OFFLINE unset
    (and the Hub reachable: the unreachable Hub's advice), the same Hub id is downloaded from a stand-in
    Hub into --cache_dir, and the same model trains."""
    local = training_model(script, files, tmp_path / "local", files["model"], monkeypatch)
    cache = tmp_path / "cache"
    fetched = fake_hub(monkeypatch, files["model"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=OFFLINE):
        training_model(script, files, tmp_path / "hub", HUB_ID, monkeypatch, "--cache_dir", str(cache))
    assert fetched == []
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    downloaded = training_model(script, files, tmp_path / "hub", HUB_ID, monkeypatch, "--cache_dir", str(cache))
    assert {"config.json", "model.safetensors"} <= set(fetched)
    assert downloaded.state_dict().keys() == local.state_dict().keys()
    assert all(downloaded.state_dict()[name].equal(tensor) for name, tensor in local.state_dict().items())


@pytest.mark.parametrize("flag", ["model_name_or_path", "config_name", "tokenizer_name"])
@pytest.mark.parametrize("script", ["pretrain_mlm", "compare_methods"])
def test_unreachable_hub_is_one_error_naming_it(script, flag, files, tmp_path, monkeypatch):
    """Online, a Hub id that cannot be fetched (no network: huggingface_hub finds neither the Hub nor
    the cache) is one error naming the flag that gave it and the missing network, not Transformers'
    message; ``--config_name`` and ``--tokenizer_name`` beside a local model too."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    fake_hub(monkeypatch, files["model"], reachable=False)
    message = (
        rf"^--{flag} 'someone/tiny-mlm' is not in the local Hub cache, and the Hub cannot be reached "
        r"\(no network\?\): give a local folder, or rerun where huggingface.co can be reached$"
    )
    model, extra = (HUB_ID, []) if flag == "model_name_or_path" else (files["model"], [f"--{flag}", HUB_ID])
    with pytest.raises(ValueError, match=message):
        training_model(script, files, tmp_path, model, monkeypatch, *extra, "--cache_dir", str(tmp_path / "cache"))
