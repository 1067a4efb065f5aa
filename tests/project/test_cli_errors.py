"""Every script's bad input ends in one line ``error: ...`` on stderr and exit status 2, without a
traceback, and is found before the model (and, where the check allows, the data) is loaded.

Each bad invocation goes through :func:`hf_efficient_attn.utils.cli_errors.run_cli` in this process,
with the loaders replaced by functions that fail the test: a check that moved after the loading
fails here. One real subprocess and the scripts' ``__main__`` blocks are checked at the end.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys

import pytest
from training_fixtures import REPO, save_tiny_mlm, write_news_files

from hf_efficient_attn.hub import cli as push_cli
from hf_efficient_attn.hub import export
from hf_efficient_attn.serving import cli as serving_cli
from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.convert import main as convert_main
from hf_efficient_attn.tasks.mlm import pretrain as mlm
from hf_efficient_attn.tasks.wikihop import finetune as wikihop
from hf_efficient_attn.tools import benchmark, demo, quickstart
from hf_efficient_attn.tools.quality import cli as quality_cli
from hf_efficient_attn.utils.cli_errors import DEBUG_VARIABLE, USER_ERRORS, run_cli

#: What a bad invocation may have loaded before its error: nothing ("args"), or the data but no model.
NOTHING, DATA = "args", "data"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    train, validation = write_news_files(str(root))
    (root / "empty.txt").write_text("")
    (root / "small.txt").write_text("One short line of text.\nAnother short line.\n")
    (root / "body.jsonl").write_text('{"body": "A text under another name."}\n')
    (root / "broken.jsonl").write_text('{"text": "an unfinished line\n')
    (root / "a_file").write_text("not a folder")
    (root / "empty_folder").mkdir()
    (root / "typo.json").write_text(json.dumps({"model_name_or_path": "x", "lerning_rate": 1e-3}))
    (root / "syntax.json").write_text('{"model_name_or_path": "x",}')
    (root / "unlabelled.csv").write_text("sentence\nA fine film.\nToo long by half.\n")
    qangaroo = {"id": "q0", "query": "place_of_birth john", "answer": "paris", "candidates": ["paris", "rome"]}
    (root / "no_supports.json").write_text(json.dumps([{**qangaroo, "supports": []}]))
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    return {"root": str(root), "train": train, "validation": validation, "model": save_tiny_mlm(str(root / "tiny"))}


def mlm_args(f, *extra, output="out", train=None):
    """pretrain_mlm.py's flags on the news files, or on the training file ``train`` alone."""
    files = ["--train_file", p(f, train)] if train else ["--train_file", f["train"], "--validation_file", f["validation"]]
    return [
        "--model_name_or_path", f["model"], *files, "--output_dir", p(f, output), "--max_seq_length", "64",
        "--report_to", "none", *extra,
    ]  # fmt: skip


def glue_args(f, *extra):
    return ["--model_name_or_path", f["model"], "--output_dir", os.path.join(f["root"], "glue"), "--max_seq_length",
            "64", "--report_to", "none", *extra]  # fmt: skip


def p(f, name):
    return os.path.join(f["root"], name)


#: (script's main, argv from the files, expected text of the error line, what may have been loaded)
BAD = {
    "missing file": (mlm.main, lambda f: mlm_args(f, "--do_train", train="no.txt"),
                     "--train_file '.*no.txt': no such file", NOTHING),
    "empty file": (mlm.main, lambda f: mlm_args(f, "--do_train", train="empty.txt"),
                   "the file is empty", NOTHING),
    "unknown method": (mlm.main, lambda f: mlm_args(f, "--do_train", "--attn_impl", "mra3"),
                       "unknown attention method 'mra3'", NOTHING),
    "unknown option": (mlm.main, lambda f: mlm_args(f, "--do_train", "--attn_impl", "mra2", "--attn_config",
                                                    '{"blocks": 4}'), "blocks", NOTHING),
    "bad --attn_config JSON": (mlm.main, lambda f: mlm_args(f, "--do_train", "--attn_config", "block_size=16"),
                               "--attn_config must be a JSON object", NOTHING),
    "unknown flag": (mlm.main, lambda f: mlm_args(f, "--do_train", "--lerning_rate", "1e-3"),
                     r"unknown flag --lerning_rate \(did you mean --learning_rate\?\)", NOTHING),
    "bad value": (mlm.main, lambda f: mlm_args(f, "--do_train", "--max_steps", "ten"),
                  "argument --max_steps.*: invalid int value: 'ten'", NOTHING),
    "missing required flag": (mlm.main, lambda f: ["--train_file", f["train"], "--do_train"],
                              "required: --model_name_or_path", NOTHING),
    "typo in a JSON configuration": (mlm.main, lambda f: [p(f, "typo.json")],
                                     r"unknown key 'lerning_rate' \(did you mean learning_rate\?\)", NOTHING),
    "JSON configuration syntax": (mlm.main, lambda f: [p(f, "syntax.json")], "is not valid JSON", NOTHING),
    "missing JSON configuration": (mlm.main, lambda f: [p(f, "nowhere.json")], "no such file", NOTHING),
    "length beyond the position table": (mlm.main, lambda f: mlm_args(f, "--do_train", "--max_seq_length", "512"),
                                         r"exceeds the model's position table \(130 tokens\)", NOTHING),
    "--fp16 on CPU": (mlm.main, lambda f: mlm_args(f, "--do_train", "--fp16", "--use_cpu"), "--fp16 needs a GPU",
                      NOTHING),
    "missing model folder": (mlm.main, lambda f: mlm_args(f, "--do_train", "--model_name_or_path", p(f, "no/model")),
                             "no/model': no such folder", NOTHING),
    "model folder without a model": (mlm.main, lambda f: mlm_args(f, "--do_train", "--model_name_or_path",
                                                                  p(f, "empty_folder")), "config.json", NOTHING),
    "--output_dir is a file": (mlm.main, lambda f: mlm_args(f, "--do_train", output="a_file"),
                               "--output_dir .* is a file", NOTHING),
    "nothing to do": (mlm.main, lambda f: mlm_args(f), "nothing to do: pass --do_train and/or --do_eval", NOTHING),
    "missing checkpoint": (mlm.main, lambda f: mlm_args(f, "--do_train", "--resume_from_checkpoint", p(f, "ckpt")),
                           "--resume_from_checkpoint .*: no such folder", NOTHING),
    "missing tensorboard": (mlm.main, lambda f: mlm_args(f, "--do_train", "--report_to", "tensorboard"),
                            "--report_to tensorboard needs the tensorboard package: pip install tensorboard", NOTHING),
    "small file, no validation file": (mlm.main, lambda f: mlm_args(f, "--do_train", "--do_eval", train="small.txt"),
                                       "2 rows, too few to carve 5% of them for validation: give --validation_file",
                                       DATA),
    "no text column": (mlm.main, lambda f: mlm_args(f, "--do_train", train="body.jsonl"),
                       r"no text column 'text'; its columns are \['body'\]: pass --text_column_name", DATA),
    "unreadable data file": (mlm.main, lambda f: mlm_args(f, "--do_train", train="broken.jsonl"),
                             "--train_file .*broken.jsonl' cannot be read as json", DATA),
    "unknown GLUE task": (glue.main, lambda f: glue_args(f, "--task_name", "sst3", "--do_train"),
                          "--task_name 'sst3': unknown; allowed: cola, sst2", NOTHING),
    "GLUE data without labels": (glue.main, lambda f: glue_args(f, "--task_name", "sst2", "--do_train",
                                                                "--train_file", p(f, "unlabelled.csv")),
                                 "the train data has no 'label' column .*--do_train needs one", DATA),
    "GLUE columns of another task": (glue.main, lambda f: glue_args(f, "--task_name", "qqp", "--do_predict",
                                                                    "--test_file", p(f, "unlabelled.csv")),
                                     r"no column 'question1': this task reads \['question1', 'question2'\]", DATA),
    "abbreviated flag": (glue.main, lambda f: glue_args(f, "--task", "sst2", "--do_train"),
                         r"unknown flag --task \(did you mean --task_name\?\)", NOTHING),
    "GLUE nothing to do": (glue.main, lambda f: glue_args(f, "--task_name", "sst2", "--train_file",
                                                          p(f, "unlabelled.csv")),
                           "nothing to do: pass --do_train and/or --do_eval and/or --do_predict", NOTHING),
    "WikiHop example without documents": (
        wikihop.main, lambda f: glue_args(f, "--do_train", "--train_file", p(f, "no_supports.json")),
        "example 'q0' has no supporting documents", DATA),
    "WikiHop --do_predict": (wikihop.main, lambda f: glue_args(f, "--do_predict", "--train_file",
                                                               p(f, "no_supports.json")), "--do_predict is not supported",
                             NOTHING),
    "conversion length": (convert_main, lambda f: ["--model_name_or_path", f["model"], "--max_length", "0",
                                                   "--output_dir", p(f, "long")], "max_length must be a positive",
                          NOTHING),
    "conversion of a missing folder": (convert_main, lambda f: ["--model_name_or_path", "./no-model", "--output_dir",
                                                                p(f, "long")], "no such folder", NOTHING),
    "push of a missing folder": (push_cli.main, lambda f: ["--model_dir", p(f, "no/model"), "--repo_id", "me/x",
                                                           "--dry_run", p(f, "up")], "--model_dir .*: no such folder",
                                 NOTHING),
    "push to a namespace without a base model": (
        push_cli.main, lambda f: ["--model_dir", f["model"], "--attn_impl", "mra2", "--repo_id", "me", "--dry_run",
                                  p(f, "up")], "give --repo_id me/NAME or --base_model", NOTHING),
    "quickstart method": (quickstart.main, lambda f: ["--attn_impl", "fast"],
                          "unknown attention method 'fast'; known methods: informer, ", NOTHING),
    "quickstart option": (quickstart.main, lambda f: ["--attn_config", '{"blocks": 4}'],
                          r"unknown option\(s\) \['blocks'\] for method 'mra2'", NOTHING),
    "quickstart into a foreign folder": (quickstart.main, lambda f: ["--output_dir", p(f, "foreign")],
                                         "holds files that are not a quickstart's", NOTHING),
    # The tools take the method as the training scripts do: --attn_impl NAME --attn_config JSON for one
    # method; --methods NAME,NAME and --attn_config keyed by method name to compare several.
    "demo method": (demo.main, lambda f: ["--attn_impl", "mra3"], "unknown attention method 'mra3'; known methods",
                    NOTHING),
    "demo option": (demo.main, lambda f: ["--attn_impl", "yoso", "--attn_config", '{"num_hashes": 8}'],
                    r"unknown option\(s\) \['num_hashes'\] for method 'yoso'; its options are", NOTHING),
    "demo --attn_config JSON": (demo.main, lambda f: ["--attn_config", "num_hash=8"],
                                "--attn_config must be a JSON object such as", NOTHING),
    "demo old flag": (demo.main, lambda f: ["--method", "yoso"], "unknown flag --method", NOTHING),
    "demo length": (demo.main, lambda f: ["--long_length", "0"], "--long_length must be a positive integer", NOTHING),
    "quality method": (quality_cli.main, lambda f: ["--methods", "softmax,mra3"],
                       "--methods: unknown method 'mra3'; known methods: informer, ", NOTHING),
    "quality option": (quality_cli.main, lambda f: ["--attn_config", '{"mra2": {"blocks": 4}}'],
                       r"--attn_config 'mra2': unknown option\(s\) \['blocks'\]", NOTHING),
    "quality option of a method not compared": (quality_cli.main, lambda f: ["--methods", "softmax", "--attn_config",
                                                                             '{"mra2": {}}'],
                                                "--attn_config: 'mra2' is not a method of this run; its keys are: softmax",
                                                NOTHING),
    "quality --attn_config JSON": (quality_cli.main, lambda f: ["--attn_config", "{mra2: {}}"],
                                   "--attn_config must be a JSON object such as", NOTHING),
    "quality old flag": (quality_cli.main, lambda f: ["--out-dir", "x"],
                         r"unknown flag --out-dir \(did you mean --output_dir\?\)", NOTHING),
    "quality nothing to do": (quality_cli.main, lambda f: ["--no_errors"], "nothing to do", NOTHING),
    "benchmark method": (benchmark.main, lambda f: ["--methods", "mra2,mra3"],
                         "--methods: unknown method 'mra3'; known methods: informer, ", NOTHING),
    "benchmark option": (benchmark.main, lambda f: ["--attn_config", '{"mra2": {"backend": "fused"}}'],
                         "--attn_config 'mra2': .*backend", NOTHING),
    "benchmark --attn_config JSON": (benchmark.main, lambda f: ["--attn_config", "mra2:backend=flex"],
                                     "--attn_config must be a JSON object such as", NOTHING),
}  # fmt: skip


#: Loaders that a bad invocation must not reach: the model, and (for NOTHING) the data and tokenizer.
MODEL_LOADERS = [(mlm, "load_model"), (glue, "load_model"), (wikihop, "load_model"), (export, "load_variant"),
                 (sys.modules["hf_efficient_attn.tasks.convert"].AutoModelForMaskedLM, "from_pretrained"),
                 (demo, "run"), (quality_cli, "minilm_path"), (quality_cli, "capture_qkv"),
                 (quality_cli, "embedding_agreement"), (benchmark, "run")]  # fmt: skip
DATA_LOADERS = [(mlm, "load_raw_datasets"), (glue, "load_glue_splits"), (wikihop, "load_qangaroo"),
                (mlm, "load_tokenizer"), (glue, "load_tokenizer"), (wikihop, "load_tokenizer")]  # fmt: skip


def _fail(name):
    def loader(*args, **kwargs):
        raise AssertionError(f"{name} ran before the error was found")

    return loader


def run_bad(main, argv, capsys) -> tuple[int, list[str], str]:
    """Exit status, stderr lines and stderr of ``run_cli(main, argv)``."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    err = capsys.readouterr().err
    return exit_info.value.code, err.strip().splitlines(), err


def without_tensorboard(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("tensorboard") else find_spec(name, *a))  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_invocation_is_one_line_and_exit_2(case, files, capsys, monkeypatch):
    main, make_argv, expected, loaded = BAD[case]
    for target, name in MODEL_LOADERS + (DATA_LOADERS if loaded == NOTHING else []):
        monkeypatch.setattr(target, name, _fail(name))
    if case == "missing tensorboard":
        without_tensorboard(monkeypatch)
    code, lines, err = run_bad(main, make_argv(files), capsys)
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], err
    assert re.search(expected, lines[-1]), lines[-1]
    if loaded == NOTHING:
        assert len(lines) == 1, err


def test_debug_variable_shows_the_traceback_and_bugs_keep_theirs(files, monkeypatch, capsys):
    """HEA_DEBUG=1 shows a user error's traceback; set to 0 or empty, as unset, the one line."""
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(ValueError, match="nothing to do"):
        run_cli(mlm.main, mlm_args(files))
    for off in ("0", ""):
        monkeypatch.setenv(DEBUG_VARIABLE, off)
        code, lines, err = run_bad(mlm.main, mlm_args(files), capsys)
        assert code == 2 and lines[-1].startswith("error: ") and "Traceback" not in err, (off, err)
    monkeypatch.delenv(DEBUG_VARIABLE)

    def buggy(argv):
        return {}["missing"]

    with pytest.raises(KeyError):  # a programming error is not a user error
        run_cli(buggy, [])


def user_error_case(error_type, files, tmp_path, monkeypatch):
    """A bad input that raises ``error_type``, one of the types run_cli turns into one line."""
    if error_type is OSError:  # a model folder whose config.json is not JSON
        broken = tmp_path / "broken_model"
        broken.mkdir()
        (broken / "config.json").write_text("{")
        return mlm.main, mlm_args(files, "--do_train", "--model_name_or_path", str(broken))
    if error_type is ModuleNotFoundError:  # the exporter's optional package missing
        monkeypatch.setitem(sys.modules, "onnxscript", None)
        model = save_tiny_mlm(str(tmp_path / "model"))
        return serving_cli.main, ["--model_dir", model, "--output_dir", str(tmp_path / "onnx")]
    return mlm.main, mlm_args(files)  # ValueError: nothing to do


#: The exception types of user errors, each with a case in user_error_case (a literal list: a type
#: dropped from USER_ERRORS must fail its case, not silently drop it).
USER_ERROR_TYPES = [ValueError, OSError, ModuleNotFoundError]


@pytest.mark.parametrize("error_type", USER_ERROR_TYPES)
def test_each_user_error_type_is_reached_by_a_bad_input(error_type, files, tmp_path, capsys, monkeypatch):
    """Every exception type that run_cli turns into one line has a real bad input raising it."""
    assert set(USER_ERRORS) == set(USER_ERROR_TYPES)
    main, argv = user_error_case(error_type, files, tmp_path, monkeypatch)
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(error_type):
        run_cli(main, argv)
    monkeypatch.delenv(DEBUG_VARIABLE)
    code, lines, err = run_bad(main, argv, capsys)
    assert code == 2 and "Traceback" not in err and lines[-1].startswith("error: "), err


SCRIPTS = sorted(name for name in os.listdir(os.path.join(REPO, "scripts")) if name.endswith(".py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_goes_through_run_cli(script, monkeypatch, capsys):
    """Each script's ``__main__`` block, run as a script: an unknown flag (or the required flags
    missing) is one error line naming the script's --help, exit status 2."""
    monkeypatch.setattr(sys, "argv", [script, "--no_such_flag"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(os.path.join(REPO, "scripts", script), run_name="__main__")
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"(see {script} --help)" in lines[0]


def test_a_real_process_prints_one_line(files):
    """The whole path in a fresh interpreter: exit status 2, one stderr line, no traceback."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop(DEBUG_VARIABLE, None)
    command = [sys.executable, "scripts/pretrain_mlm.py", *mlm_args(files, "--do_train", "--max_seq_length", "512")]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --max_seq_length 512 exceeds the model's position table (130 tokens); stretch the checkpoint first: "
        "scripts/convert_to_long.py --max_length 512"
    ]
