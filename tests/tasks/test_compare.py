"""The method comparison (scripts/compare_methods.py): a tiny comparison writes its CSV, plot and
summary against softmax; every method starts from the same warmed weights (the head warm-up trains
the head only); a rerun skips finished methods and resumes an interrupted one; bad flags are one
line; the recommendation follows the numbers."""

import multiprocessing
import multiprocessing.forkserver
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
import transformers as T
from safetensors.torch import load_file
from training_fixtures import small_tokenizer, tiny_config, write_news_files
from transformers import TrainerState

from hf_efficient_attn.tasks.mlm import compare, compare_stage
from hf_efficient_attn.tasks.mlm.compare import main
from hf_efficient_attn.tasks.mlm.compare_report import read_rows, recommendation
from hf_efficient_attn.tasks.mlm.compare_stage import DONE_MARKER, START_WEIGHTS, read_json, tensor_hashes
from hf_efficient_attn.utils.cli_errors import run_cli

SEQ = 64
STEPS, EVERY = 4, 2


def write_workspace(root):
    """A tiny sentence encoder without an MLM head (as all-MiniLM-L6-v2) and real news text."""
    write_news_files(str(root))
    T.set_seed(0)
    T.AutoModel.from_config(tiny_config()).save_pretrained(root / "encoder")
    small_tokenizer().save_pretrained(root / "encoder")


def workspace_files(root):
    """The files :func:`write_workspace` wrote in ``root``."""
    return {"train": str(root / "train.txt"), "validation": str(root / "validation.txt"), "model": str(root / "encoder")}


@pytest.fixture(scope="module")
def workspace(built_once):
    """:func:`write_workspace`'s files (read-only: shared by the workers)."""
    return workspace_files(built_once("compare_workspace", write_workspace))


def arguments(workspace, output_dir, *extra):
    return [
        "--model_name_or_path", workspace["model"], "--methods", "softmax,linformer",
        "--attn_config", '{"linformer": {"k": 16}}', "--train_file", workspace["train"],
        "--validation_file", workspace["validation"], "--max_seq_length", str(SEQ), "--max_steps", str(STEPS),
        "--eval_steps", str(EVERY), "--head_warmup_steps", "2", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "8", "--max_eval_samples", "8", "--learning_rate", "5e-3",
        "--save_total_limit", "2", "--output_dir", str(output_dir), "--report_to", "none", "--seed", "7", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def finished(workspace, built_once):
    """One whole tiny comparison, run as a user runs scripts/compare_methods.py (its own process, a
    terminal's process group), shared by the tests that read its folder, results and printed lines
    (test_run_output reads these)."""
    from test_run_output import run_as_a_user

    def run(folder):
        status, lines = run_as_a_user("compare_methods", arguments(workspace, folder / "out"))
        assert status == 0, "\n".join(lines)[-3000:]
        (folder / "printed.txt").write_text("\n".join(lines))

    folder = built_once("tiny_comparison", run)
    return folder / "out", read_rows(folder / "out" / "results.csv")


def test_a_tiny_comparison_writes_its_csv_plot_and_summary(finished):
    out, saved = finished
    assert list(saved[0]) == ["method", "step", "seconds", "eval_loss", "eval_accuracy", "peak_memory_mb"]
    for method in ("softmax", "linformer"):
        mine = [row for row in saved if row["method"] == method]
        assert [row["step"] for row in mine] == [0, 2, 4]
        assert mine[0]["seconds"] == 0 and 0 < mine[1]["seconds"] < mine[2]["seconds"]
        assert all(row["peak_memory_mb"] > 0 and 0 <= row["eval_accuracy"] <= 1 for row in mine)
        assert (out / method / DONE_MARKER).is_file()
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "`softmax` (exact attention) is the reference" in summary
    table = [line for line in summary.splitlines() if line.startswith("| `")]
    assert [line.split("|")[1].strip() for line in table] == ["`softmax`", "`linformer`"]
    assert table[0].split("|")[4].strip() == "+0.00" and table[0].split("|")[7].strip() == "1.00x"
    assert "**Recommendation.** At 64 tokens, use `" in summary


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server (Windows)")
def test_a_methods_process_is_forked_from_a_server_that_imported_the_stage():
    """Not a fork of the comparison's process (its CUDA state and memory would be the method's), and
    not a spawned interpreter that imports torch and Transformers again (seconds a method): a child of
    Python's fork server, which preloads compare_stage. (The tiny comparison runs its methods so.)"""
    context = compare_stage.method_process_context()
    assert context.get_start_method() == "forkserver"
    assert multiprocessing.forkserver._forkserver._preload_modules == [compare_stage.__name__]  # no public getter


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_cpu_peak_memory_is_the_peak_resident_set_in_mib():
    """results.csv's peak_memory_mb on CPU is this process's peak resident set, in MiB (Linux's
    VmHWM, read from /proc, kB)."""
    with open("/proc/self/status") as f:
        (high_water_kb,) = [int(line.split()[1]) for line in f if line.startswith("VmHWM:")]
    assert compare_stage.peak_memory_mb(torch.device("cpu")) == pytest.approx(high_water_kb / 1024, rel=0.05)


def test_train_seconds_add_up_the_steps_alone_and_count_on_after_a_resume(monkeypatch):
    """StepTimer's train_seconds is the sum of the optimisation steps' times (not the time between
    them, not the last step's), and a timer restored from a checkpoint's state counts on from it."""
    clock = iter([10.0, 11.0, 50.0, 52.0, 90.0, 94.0])  # steps of 1, 2 and 4 s; evaluations between them
    monkeypatch.setattr(compare_stage.time, "perf_counter", lambda: next(clock))
    args, state = SimpleNamespace(device=torch.device("cpu")), TrainerState()

    def steps(timer, count):
        for _ in range(count):
            timer.on_step_begin(args, state, None)
            timer.on_step_end(args, state, None)
        state.log_history.append({"eval_loss": 1.0})
        timer.on_log(args, state, None, logs={"eval_loss": 1.0})
        return state.log_history[-1]["train_seconds"]

    first = compare_stage.StepTimer()
    first.on_train_begin(args, state, None)
    assert steps(first, 2) == 3.0
    state.stateful_callbacks = {"StepTimer": first.state()}  # what a checkpoint saves
    resumed = compare_stage.StepTimer()
    resumed.on_train_begin(args, state, None)
    assert steps(resumed, 1) == 7.0


def test_every_method_starts_from_the_warmed_checkpoint(workspace, finished):
    """The same-start property: each method's step-0 weights are the warmed checkpoint's (Linformer
    adds its projections); the warm-up trained the MLM head and left the encoder as it was."""
    out, _ = finished
    warmed = load_file(out / "head_warmup" / "model.safetensors")
    expected = tensor_hashes(warmed)
    for method in ("softmax", "linformer"):
        started = read_json(out / method / START_WEIGHTS)
        shared = started.keys() & expected.keys()
        assert len(shared) == len(expected)  # (the decoder weight is saved once, as the tied embeddings')
        assert {name: started[name] for name in shared} == expected
    assert set(read_json(out / "linformer" / START_WEIGHTS)) - set(read_json(out / "softmax" / START_WEIGHTS))

    encoder = load_file(os.path.join(workspace["model"], "model.safetensors"))
    assert tensor_hashes({f"bert.{name}": t for name, t in encoder.items() if "pooler" not in name}) == {
        name: digest for name, digest in expected.items() if not name.startswith("cls.")
    }  # frozen
    head = [name for name, _ in T.BertForMaskedLM(tiny_config()).named_parameters() if not name.startswith("bert.")]
    optimizer = torch.load(out / "head_warmup" / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert len(optimizer["state"]) == len(head) == 5  # trained: the head (tied decoder weight excluded)


@pytest.mark.slow  # a second and a third comparison run
def test_a_rerun_skips_finished_methods_and_resumes_an_interrupted_one(workspace, finished, tmp_path, capfd):
    """softmax finished; linformer was interrupted after its step-2 checkpoint: the rerun skips
    softmax and the warm-up, resumes linformer at step 2 and ends with the uninterrupted results."""
    out, rows = finished
    again = tmp_path / "again"
    shutil.copytree(out, again)
    for name in os.listdir(again / "linformer"):
        if name not in ("checkpoint-2", "method.json", START_WEIGHTS):
            path = again / "linformer" / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    os.remove(again / "results.csv")
    capfd.readouterr()
    resumed = main(arguments(workspace, again))
    output = capfd.readouterr()
    console = output.out + output.err
    assert "head_warmup: finished before, skipped" in console and "softmax: finished before, skipped" in console
    assert f"resuming from {again / 'linformer' / 'checkpoint-2'}" in console
    assert "linformer: step 4, eval accuracy" in console

    assert [(row["method"], row["step"], row["eval_accuracy"]) for row in resumed] == [
        (row["method"], row["step"], row["eval_accuracy"]) for row in rows
    ]
    assert [row["eval_loss"] for row in resumed] == pytest.approx([row["eval_loss"] for row in rows], rel=1e-6)
    seconds = {(row["method"], row["step"]): row["seconds"] for row in resumed}
    previous = {(row["method"], row["step"]): row["seconds"] for row in rows}
    assert seconds[("linformer", 2)] == previous[("linformer", 2)]  # counted on from the checkpoint
    assert seconds[("linformer", 4)] > seconds[("linformer", 2)]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "softmax,mra3"], "--methods: unknown method 'mra3'; known methods: "),
        (["--methods", "mra2,linformer"], "--methods must include softmax"),
        (["--methods", "softmax,mra2,mra2"], "--methods must name each method once"),
        (["--attn_config", '{"mra2": {"k": 3}}'], "--attn_config: 'mra2' is not a method of this run"),
        (["--attn_config", '{"linformer": {"rank": 3}}'], "unknown option(s) ['rank'] for method 'linformer'"),
        (["--attn_config", "[1]"], "--attn_config must be a JSON object"),
        (["--attn_impl", "mra2"], "--attn_impl does not apply to a comparison"),
        (["--max_steps", "-1"], "give --max_steps N"),
        (["--head_warmup_steps", "-3"], "--head_warmup_steps must be 0 or a positive integer"),
        (["--max_seq_length", "512"], "--max_seq_length 512 exceeds the model's position table (130 tokens)"),
        (["--model_name_or_path", "./no/such/model"], "no such folder"),
        (["--methodz", "softmax"], "unknown flag --methodz (did you mean --methods?)"),
    ],
)
def test_bad_flags_are_one_line_errors(workspace, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, arguments(workspace, tmp_path / "out") + extra)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "\n" not in error and message in error
    assert not (tmp_path / "out" / "softmax").exists()  # refused before anything ran


class FirstStage(Exception):
    """Raised with the first stage a comparison would run (:func:`first_stage`)."""

    def __init__(self, stage):
        super().__init__(stage.name)
        self.stage = stage


def first_stage(monkeypatch, argv):
    """The first stage (warm-up or method) compare_methods.py would run with ``argv``; no data are read."""
    monkeypatch.setattr(compare, "masked_datasets", lambda *args: ([], []))
    monkeypatch.setattr(compare, "run_or_skip", lambda stage, description: (_ for _ in ()).throw(FirstStage(stage)))
    with pytest.raises(FirstStage) as caught:
        main(argv)
    return caught.value.stage


@pytest.mark.parametrize("flag, value", [("--eval_strategy", "epoch"), ("--save_strategy", "no"), ("--save_steps", "3"),
                                         ("--eval_on_start", "true")])  # fmt: skip
def test_the_schedule_a_comparison_decides_is_refused_and_eval_steps_chooses_it(workspace, tmp_path, monkeypatch, capsys,
                                                                                  flag, value):  # fmt: skip
    """Each method's run evaluates at step 0, then evaluates and saves every --eval_steps steps: a flag that
    would change that schedule is refused in one line before anything runs; its advice, --eval_steps N,
    is the schedule of every method's run."""
    argv = arguments(workspace, tmp_path / "out", "--head_warmup_steps", "0")
    with pytest.raises(SystemExit):
        run_cli(main, [*argv, flag, value])
    assert capsys.readouterr().err == (
        f"error: {flag} does not apply to a comparison: every method evaluates at step 0, then evaluates and saves a "
        "checkpoint every --eval_steps steps; give --eval_steps N to choose how often\n"
    )
    assert not (tmp_path / "out" / "softmax").exists()
    args = first_stage(monkeypatch, [*argv, "--eval_steps", "3"]).training_args
    assert (args.eval_strategy, args.eval_steps, args.eval_on_start, args.save_strategy, args.save_steps) == (
        "steps",
        3,
        True,
        "steps",
        3,
    )


def test_validation_split_percentage_is_refused_with_the_default_data(workspace, tmp_path, monkeypatch, capsys):
    """Without data flags a comparison holds out the last 8 articles of its default data for validation:
    --validation_split_percentage, with nothing to carve, is refused before any data are read or written;
    its advice, leaving it out, goes on with the default data's validation file."""
    argv = arguments(workspace, tmp_path / "out", "--head_warmup_steps", "0")
    for flag in ("--train_file", "--validation_file"):
        at = argv.index(flag)
        del argv[at : at + 2]
    with pytest.raises(SystemExit):
        run_cli(main, [*argv, "--validation_split_percentage", "10"])
    assert capsys.readouterr().err.endswith("and these have one (the default data hold out their last 8 articles); leave "
                                            "it out\n")  # fmt: skip
    assert not (tmp_path / "out").exists()
    stage = first_stage(monkeypatch, argv)
    assert stage.data_args.validation_file == str(tmp_path / "out" / "data" / "validation.jsonl")
    with open(stage.data_args.validation_file) as f:
        assert sum(1 for _ in f) == 8


def test_help_lists_the_flags_a_comparison_takes(capsys):
    """--help shows --methods and the per-method --attn_config, not the --attn_impl it refuses."""
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and "--methods" in shown and "keyed by method name" in shown
    assert "--attn_impl" not in shown


def test_a_rerun_with_other_settings_is_refused(finished, workspace, capsys):
    out, _ = finished
    with pytest.raises(SystemExit):
        run_cli(main, arguments(workspace, out) + ["--learning_rate", "1e-3"])
    assert "holds a comparison made with learning_rate = 0.005, not 0.001" in capsys.readouterr().err


def row(method, accuracy, seconds_per_step):
    return {"method": method, "eval_accuracy": accuracy, "seconds_per_step": seconds_per_step}


@pytest.mark.parametrize(
    "others, expected",
    [
        ([row("a", 0.495, 1.0), row("b", 0.499, 2.0), row("c", 0.40, 0.5)], "use `a`: -0.50 points"),
        ([row("b", 0.499, 2.0), row("c", 0.40, 0.5)], "use `b`: -0.10 points"),
        ([row("b", 0.499, 5.0)], "use `softmax`: `b` came within 1 point of its accuracy but train no faster"),
        ([row("c", 0.40, 0.5)], "use `softmax`: no method came within 1 point"),
    ],
)
def test_the_recommendation_is_the_fastest_method_within_a_point(others, expected):
    final = {r["method"]: r for r in [row("softmax", 0.50, 4.0), *others]}
    assert expected in recommendation(final, 2048)


@pytest.mark.parametrize("log_level, everything", [("debug", True), ("info", True), ("warning", False), ("passive", False)])
def test_info_and_debug_show_everything(log_level, everything, tmp_path):
    """--log_level info or debug: the method runs print all that Trainer and the libraries print; a
    quieter level (and the default, passive): their progress and warnings only."""
    assert compare_stage.shows_everything(T.TrainingArguments(str(tmp_path), log_level=log_level)) is everything
