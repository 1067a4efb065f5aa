"""A rerun into a folder that holds a run changes one recorded setting (tests/project/recorded_settings_table.py):
the method comparison refuses it naming the setting (comparison.json, each method's method.json), the
training scripts refuse to resume a checkpoint made with another method or options, and the
quickstart redoes the steps that read the setting, saying why."""

import json
import shutil

import pytest
from glue_fixtures import write_task_files
from test_compare import STEPS as COMPARISON_STEPS
from test_compare import arguments, workspace_files, write_workspace
from test_quickstart import SETTINGS, _again, fake_steps  # noqa: F401  (fake_steps: a fixture)
from training_fixtures import Captured, capture_trainer, save_tiny_mlm, write_news_files
from wikihop_fixtures import save_tiny_encoder, write_files

import hf_efficient_attn as hea
from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.common.driver import mark_complete
from hf_efficient_attn.tasks.mlm import compare, pretrain
from hf_efficient_attn.tasks.wikihop import finetune as wikihop
from hf_efficient_attn.tools.quickstart import STEPS

# ---- compare_methods ----------------------------------------------------------------------------


class Stopped(Exception):
    """The comparison stopped before its first stage trains."""


def stop_before_training(monkeypatch):
    """compare_methods.py stops at its first stage and reads no data (no examples): what it checks and
    records before anything trains."""
    monkeypatch.setattr(compare, "masked_datasets", lambda *args: ([], []))

    def stop(stage, description):
        raise Stopped(stage.name)

    monkeypatch.setattr(compare, "run_or_skip", stop)


def compare_until_training(monkeypatch, argv):
    """compare_methods.py with ``argv``, up to its first stage."""
    stop_before_training(monkeypatch)
    with pytest.raises(Stopped):
        compare.main(argv)


@pytest.fixture(scope="module")
def workspace(built_once, tmp_path_factory):
    """test_compare's files (shared, read-only) and ``root``, a folder of this module's own to write in."""
    return {**workspace_files(built_once("compare_workspace", write_workspace)), "root": tmp_path_factory.mktemp("reruns")}


@pytest.fixture(scope="module")
def compared(workspace):
    """A comparison folder as a first run leaves it (comparison.json written, the warm-up begun)."""
    out = workspace["root"] / "recorded"
    with pytest.MonkeyPatch.context() as monkeypatch:
        compare_until_training(monkeypatch, arguments(workspace, out))
    return out


#: Each recorded setting of a comparison, changed by the flags that set it (the first run: test_compare.arguments,
#: with the data of FIRST_RUN_DATA where the setting needs other data).
COMPARISON_CHANGES = {
    "model_name_or_path": lambda ws: ["--model_name_or_path", str(ws["root"] / "encoder-copy")],
    "max_seq_length": lambda ws: ["--max_seq_length", "32"],
    "data": lambda ws: ["--validation_file", ws["train"]],
    "dataset_config_name": lambda ws: ["--dataset_config_name", "de"],
    "text_column_name": lambda ws: ["--text_column_name", "body"],
    "validation_split_percentage": lambda ws: ["--validation_split_percentage", "20"],
    "max_train_samples": lambda ws: ["--max_train_samples", "10"],
    "max_eval_samples": lambda ws: ["--max_eval_samples", "4"],
    "max_steps": lambda ws: ["--max_steps", "6"],
    "batch": lambda ws: ["--gradient_accumulation_steps", "2"],
    "learning_rate": lambda ws: ["--learning_rate", "1e-3"],
    "seed": lambda ws: ["--seed", "8"],
    "data_seed": lambda ws: ["--data_seed", "8"],
    "eval_mask_seed": lambda ws: ["--eval_mask_seed", "8"],
    "mlm_probability": lambda ws: ["--mlm_probability", "0.3"],
    "line_by_line": lambda ws: ["--line_by_line"],
    "eval_steps": lambda ws: ["--eval_steps", "1"],
    "head_warmup": lambda ws: ["--head_warmup_learning_rate", "1e-2"],
    "optim": lambda ws: ["--optim", "adamw_torch"],
    "optim_args": lambda ws: ["--optim_args", "foreach=False"],
    "weight_decay": lambda ws: ["--weight_decay", "0.01"],
    "adam_beta1": lambda ws: ["--adam_beta1", "0.8"],
    "adam_beta2": lambda ws: ["--adam_beta2", "0.99"],
    "adam_epsilon": lambda ws: ["--adam_epsilon", "1e-6"],
    "max_grad_norm": lambda ws: ["--max_grad_norm", "0.5"],
    "lr_scheduler_type": lambda ws: ["--lr_scheduler_type", "cosine"],
    "lr_scheduler_kwargs": lambda ws: ["--lr_scheduler_kwargs", '{"num_cycles": 2}'],
    "warmup_steps": lambda ws: ["--warmup_steps", "2"],
}
#: The data of a first run whose setting needs other data than test_compare.arguments' files: a Hub
#: dataset's configuration (nothing is loaded: the stopped runs read no data), or training data without a
#: validation file (a validation split is carved out).
FIRST_RUN_DATA = {
    "dataset_config_name": lambda ws: ["--dataset_name", "someone/news", "--dataset_config_name", "en"],
    "validation_split_percentage": lambda ws: ["--train_file", ws["train"]],
}


def without(argv, *flags):
    """``argv`` less each of ``flags`` and its value."""
    argv = list(argv)
    for flag in flags:
        at = argv.index(flag)
        del argv[at : at + 2]
    return argv


def first_run(workspace, output_dir, setting):
    """The arguments of the first comparison run of the test that changes ``setting``."""
    argv = arguments(workspace, output_dir)
    if setting not in FIRST_RUN_DATA:
        return argv
    return without(argv, "--train_file", "--validation_file") + FIRST_RUN_DATA[setting](workspace)


@pytest.mark.parametrize("setting", list(COMPARISON_CHANGES))
def test_a_comparison_rerun_with_another_setting_is_refused(workspace, compared, tmp_path, monkeypatch, setting):
    """Rerun into a comparison's folder with one recorded setting changed: one error naming that setting
    and both values, before anything is loaded or trained; the same command unchanged goes on."""
    shutil.copytree(workspace["model"], workspace["root"] / "encoder-copy", dirs_exist_ok=True)
    out = tmp_path / "out"
    if setting in FIRST_RUN_DATA:
        compare_until_training(monkeypatch, first_run(workspace, out, setting))
    else:
        shutil.copytree(compared, out)
    recorded = json.loads((out / compare.SETTINGS_FILE).read_text())
    stop_before_training(monkeypatch)
    with pytest.raises(ValueError) as refused:
        compare.main(first_run(workspace, out, setting) + COMPARISON_CHANGES[setting](workspace))
    assert json.loads((out / compare.SETTINGS_FILE).read_text()) == recorded  # the record is left as it was
    compare_until_training(monkeypatch, first_run(workspace, out, setting))  # its advice: the same settings go on
    another = tmp_path / "another"
    compare_until_training(monkeypatch, first_run(workspace, another, setting) + COMPARISON_CHANGES[setting](workspace))
    changed = json.loads((another / compare.SETTINGS_FILE).read_text())[setting]
    assert changed != recorded[setting]
    assert str(refused.value) == (  # both values as the record holds them
        f"--output_dir {str(out)!r} holds a comparison made with {setting} = {recorded[setting]!r}, not {changed!r}; "
        "rerun it with the same settings, or give another --output_dir"
    )


#: Settings whose value a first run leaves to a default worked out at run time, and the flags that spell that
#: default out: a rerun giving them is the same comparison.
DEFAULTS_SPELT_OUT = {
    "validation_split_percentage": ["--validation_split_percentage", str(pretrain.VALIDATION_SPLIT_PERCENTAGE)],
    "eval_steps": ["--eval_steps", str(max(1, COMPARISON_STEPS // 10))],  # a tenth of --max_steps
}


@pytest.mark.parametrize("setting", list(DEFAULTS_SPELT_OUT))
def test_a_comparison_rerun_spelling_out_a_default_goes_on(workspace, tmp_path, monkeypatch, setting):
    """The record holds the value a defaulted setting took, so a rerun that gives that value as a flag
    is the same comparison and goes on, leaving the record as it was."""
    out = tmp_path / "out"
    argv = first_run(workspace, out, setting)
    if setting == "eval_steps":
        argv = without(argv, "--eval_steps")
    compare_until_training(monkeypatch, argv)
    recorded = json.loads((out / compare.SETTINGS_FILE).read_text())
    assert recorded[setting] == float(DEFAULTS_SPELT_OUT[setting][1])
    compare_until_training(monkeypatch, argv + DEFAULTS_SPELT_OUT[setting])
    assert json.loads((out / compare.SETTINGS_FILE).read_text()) == recorded


@pytest.fixture
def method_folders(workspace, tmp_path, monkeypatch):
    """A comparison folder whose first method (linformer) has recorded its options, and its arguments."""
    argv = arguments(workspace, tmp_path / "out") + ["--methods", "linformer,softmax", "--head_warmup_steps", "0"]
    compare_until_training(monkeypatch, argv)
    return tmp_path / "out", argv


def test_a_comparison_rerun_with_other_method_options_is_refused(method_folders, monkeypatch):
    """--attn_config changed for a method whose folder holds a run: refused naming both options; the
    recorded options go on."""
    out, argv = method_folders
    stop_before_training(monkeypatch)
    with pytest.raises(ValueError, match=r"holds a linformer run with options \{.*'k': 16.*\}, not linformer with \{.*'k': 8"):
        compare.main(argv + ["--attn_config", '{"linformer": {"k": 8}}'])
    compare_until_training(monkeypatch, argv)  # its advice: the same --attn_config goes on, or another --output_dir
    compare_until_training(
        monkeypatch, [*argv, "--attn_config", '{"linformer": {"k": 8}}', "--output_dir", str(out.parent / "another")]
    )


def test_a_comparison_rerun_into_another_methods_folder_is_refused(method_folders, monkeypatch):
    """A method's folder that holds another method's run (a folder copied under another name): refused
    naming the method it holds."""
    out, argv = method_folders
    (out / "linformer" / "method.json").write_text(json.dumps({"attn_impl": "softmax", "attn_config": {}}))
    stop_before_training(monkeypatch)
    with pytest.raises(ValueError, match=r"holds a softmax run with options \{\}, not linformer with \{"):
        compare.main(argv)


# ---- the training scripts: a checkpoint made with another method ----------------------------------


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Each training script's entry point, its model class and flags that train on a few tiny examples."""
    root = tmp_path_factory.mktemp("reruns")
    news, _ = write_news_files(str(root), train_articles=4, validation_articles=1)
    cola = write_task_files(str(root / "cola"), "cola")
    wikihop_train, _ = write_files(str(root), train=4, dev=0, with_real=False)
    mlm_model, wikihop_model = save_tiny_mlm(str(root / "tiny")), save_tiny_encoder(str(root / "encoder"))
    common = ["--do_train", "--max_steps", "1", "--per_device_train_batch_size", "2", "--report_to", "none", "--use_cpu"]
    return {
        "pretrain_mlm": (pretrain.main, hea.AutoModelForMaskedLM, ["--model_name_or_path", mlm_model, "--train_file", news,
                         "--max_seq_length", "64", "--max_train_samples", "4", *common]),
        "finetune_glue": (glue.main, hea.AutoModelForSequenceClassification, ["--model_name_or_path", mlm_model,
                          "--task_name", "cola", "--train_file", cola["train"], "--max_seq_length", "64",
                          "--max_train_samples", "4", *common]),
        "finetune_wikihop": (wikihop.main, hea.AutoModel, ["--model_name_or_path", wikihop_model, "--train_file",
                             wikihop_train, "--max_seq_length", "128", *common]),
    }  # fmt: skip


#: The method of the checkpoint, and each rerun that asks something else.
SAVED = ["--attn_impl", "mra2", "--attn_config", '{"block_size": 16}']
RERUNS = {
    "attn_impl": (["--attn_impl", "linformer", "--attn_config", '{"k": 8}'], r"this run asks --attn_impl linformer "),
    "attn_config": (["--attn_impl", "mra2", "--attn_config", '{"block_size": 32}'], r"this run asks --attn_impl mra2 .*32"),
}


@pytest.mark.parametrize("setting", list(RERUNS))
@pytest.mark.parametrize("script", ["finetune_glue", "finetune_wikihop", "pretrain_mlm"])
def test_a_rerun_asking_another_method_than_the_checkpoints_is_refused(scripts, tmp_path, monkeypatch, script, setting):
    """--output_dir holds a complete checkpoint saved by a run with mra2 (block_size 16); a rerun asking
    another method, or mra2 with other options, is refused naming both before it trains (resuming would
    load one method's state into another)."""
    main, auto_class, argv = scripts[script]
    checkpoint = tmp_path / "checkpoint-1"
    model_path = argv[argv.index("--model_name_or_path") + 1]
    auto_class.from_pretrained(model_path, attn_impl="mra2", attn_config={"block_size": 16}).config.save_pretrained(checkpoint)
    mark_complete(str(checkpoint), 1)
    flags, asked = RERUNS[setting]
    saved = r"was saved with --attn_impl mra2 --attn_config '\{.*\"block_size\": 16.*\}', "
    with pytest.raises(ValueError, match=saved + asked):
        main([*argv, "--output_dir", str(tmp_path), *flags])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-1"]  # nothing trained or written
    capture_trainer(monkeypatch)  # its advice, another --output_dir: the run starts afresh (stopped before training)
    with pytest.raises(Captured) as started:
        main([*argv, "--output_dir", str(tmp_path / "afresh"), *flags])
    assert started.value.kwargs["args"].output_dir == str(tmp_path / "afresh")


# ---- the quickstart: a changed setting redoes the steps that read it ------------------------------

#: Each recorded setting, a new value, and the first step that records it (redone, with every step after it).
QUICKSTART_CHANGES = {
    "attn_config": ({"block_per_row": 4}, "1-long"),
    "attn_impl": ("yoso", "1-long"),
    "finetune_epochs": (1, "3-newsgroups"),
    "finetune_length": (256, "3-newsgroups"),
    "max_length": (512, "1-long"),
    "mlm_steps": (3, "2-mlm"),
}


@pytest.mark.parametrize("setting", list(QUICKSTART_CHANGES))
def test_a_quickstart_rerun_with_a_changed_setting_redoes_its_steps(tmp_path, fake_steps, capsys, setting):
    """A rerun with one setting changed redoes the first step that records it and the steps after it
    (which read its output), reuses those before, and says which setting changed."""
    value, first = QUICKSTART_CHANGES[setting]
    assert SETTINGS[setting] != value
    out = tmp_path / "out"
    _again(out, fake_steps, capsys)
    ran, said = _again(out, fake_steps, capsys, **{setting: value})
    kept = STEPS[: STEPS.index(first)]
    assert ran == list(STEPS[len(kept) :])
    assert said.startswith(f"quickstart: reusing {', '.join(kept)} in {tmp_path / 'out'}; redoing {first} (changed: --{setting})")
