"""The model flags (``ModelArguments``) and the ``TrainingArguments`` the package reads itself, for
pretrain_mlm, finetune_glue, finetune_wikihop, compare_methods and (model flags) convert_to_long:
each run stops where it trains, evaluates or predicts, and what it would have used is read there.

The Hub flags are checked on a Hub cache written here (offline): ``--model_revision v1`` must give
the config, the tokenizer and the weights of that revision, not of ``main``.
"""

import inspect
import json
import logging
import os
import shutil

import datasets.utils.logging
import pytest
import torch
import transformers as T
import transformers.utils.hub
from glue_fixtures import write_task_files
from safetensors.torch import load_file
from training_fixtures import default_library_logging, save_tiny_mlm, small_tokenizer, tiny_config, write_news_files
from wikihop_fixtures import write_files as write_wikihop_files

from hf_efficient_attn.integration.auto import _EfficientAutoModel
from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.common import driver
from hf_efficient_attn.tasks.convert import main as convert_main
from hf_efficient_attn.tasks.mlm import compare, compare_stage, pretrain
from hf_efficient_attn.tasks.wikihop import finetune as wikihop

MAINS = {"pretrain_mlm": pretrain.main, "finetune_glue": glue.main, "finetune_wikihop": wikihop.main,
         "compare_methods": compare.main}  # fmt: skip
TRAINING = list(MAINS)
REPO_ID = "flags/tiny"
REVISIONS = {"main": "a" * 40, "v1": "b" * 40}


def with_marker_token(folder, token):
    """Add ``token`` to the tokenizer saved in ``folder``: which tokenizer was loaded shows."""
    tokenizer = T.AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens([token])
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Data of each script; a local model, a config-only and a tokenizer-only folder; a Hub cache
    holding ``flags/tiny`` at ``main`` and ``v1`` (other weights, config and tokenizer)."""
    root = tmp_path_factory.mktemp("flags")
    train, validation = write_news_files(str(root), train_articles=30, validation_articles=6)
    (root / "wikihop").mkdir()
    wikihop_train, wikihop_dev = write_wikihop_files(str(root / "wikihop"), train=8, dev=4, with_real=False)
    model = save_tiny_mlm(str(root / "model"))
    tiny_config(source="config_name").save_pretrained(root / "config")
    small_tokenizer().save_pretrained(root / "tokenizer")
    with_marker_token(str(root / "tokenizer"), "tokenizerflag")
    snapshots = root / "cache" / f"models--{REPO_ID.replace('/', '--')}"
    for seed, (revision, commit) in enumerate(REVISIONS.items()):
        save_tiny_mlm(str(snapshots / "snapshots" / commit), seed=seed, snapshot=revision)
        with_marker_token(str(snapshots / "snapshots" / commit), f"{revision}flag")
        (snapshots / "refs").mkdir(exist_ok=True)
        (snapshots / "refs" / revision).write_text(commit)
    return {
        "root": root,
        "train": train,
        "validation": validation,
        "wikihop_train": wikihop_train,
        "wikihop_dev": wikihop_dev,
        "glue": write_task_files(str(root / "cola"), "cola"),
        "model": model,
        "config": str(root / "config"),
        "tokenizer": str(root / "tokenizer"),
        "cache": str(root / "cache"),
        "snapshots": {revision: str(snapshots / "snapshots" / commit) for revision, commit in REVISIONS.items()},
    }


def script_args(script, w, output_dir, *extra):
    """The script's data flags on the workspace's files, ``--output_dir`` and ``extra``."""
    data = {
        "pretrain_mlm": ["--train_file", w["train"], "--validation_file", w["validation"], "--max_seq_length", "64"],
        "finetune_glue": ["--task_name", "cola", "--train_file", w["glue"]["train"], "--validation_file",
                          w["glue"]["validation"], "--test_file", w["glue"]["test"], "--max_seq_length", "64"],
        "finetune_wikihop": ["--train_file", w["wikihop_train"], "--validation_file", w["wikihop_dev"],
                             "--max_seq_length", "128"],
        "compare_methods": ["--methods", "mra2,softmax", "--train_file", w["train"], "--validation_file",
                            w["validation"], "--max_seq_length", "64", "--max_steps", "2", "--head_warmup_steps", "0"],
    }[script]  # fmt: skip
    return [*data, "--output_dir", str(output_dir), "--report_to", "none", "--disable_tqdm", "true", *extra]


class Stopped(Exception):
    """Raised by Trainer's ``train`` / ``evaluate`` / ``predict`` (:func:`run_until_trainer`)."""

    def __init__(self, stage, trainer, kwargs):
        super().__init__(stage)
        self.stage, self.trainer, self.kwargs = stage, trainer, kwargs


def run_until_trainer(script, argv, monkeypatch, **keywords) -> Stopped:
    """Run ``script`` (its ``main(argv, **keywords)``) until its Trainer first trains, evaluates or
    predicts (compare_methods: its first method, in this process); that Trainer, the stage and its
    keyword arguments."""
    for stage in ("train", "evaluate", "predict"):

        def stop(self, *args, stage=stage, **kwargs):
            raise Stopped(stage, self, kwargs)

        monkeypatch.setattr(T.Trainer, stage, stop)
    monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)
    with pytest.raises(Stopped) as stopped:
        MAINS[script](argv, **keywords)
    return stopped.value


def query_weight(model):
    return model.base_model.encoder.layer[0].attention.self.query.weight.detach()


def saved_query_weight(folder):
    weights = load_file(os.path.join(folder, "model.safetensors"))
    return next(t for name, t in weights.items() if name.endswith("encoder.layer.0.attention.self.query.weight"))


def loaded(script, w, output_dir, model_flags, monkeypatch):
    """(config, tokenizer, first-layer query weight) of the model ``script`` would train (convert_to_long:
    of the model it saved), given ``model_flags``."""
    if script == "convert_to_long":
        convert_main([*model_flags, "--output_dir", str(output_dir), "--max_length", "256"])
        # (read with classes that test_local_model_flags_reach_what_they_name does not spy on)
        return (T.PretrainedConfig.from_pretrained(output_dir), T.PreTrainedTokenizerFast.from_pretrained(output_dir),
                saved_query_weight(output_dir))  # fmt: skip
    trainer = run_until_trainer(script, script_args(script, w, output_dir, "--do_train", *model_flags),
                                monkeypatch).trainer  # fmt: skip
    return trainer.model.config, trainer.processing_class, query_weight(trainer.model)


@pytest.mark.parametrize("script", [*TRAINING, "convert_to_long"])
def test_revision_cache_dir_and_token_reach_config_tokenizer_and_weights(script, workspace, tmp_path, monkeypatch):
    """A Hub id with --cache_dir, --model_revision v1 and --token: config, tokenizer and weights all
    come from v1 (the weights differ from main's), every file is fetched with the token, and the
    training scripts' datasets are cached in --cache_dir too."""
    cache = shutil.copytree(workspace["cache"], tmp_path / "cache")
    fetched = []
    download = transformers.utils.hub.hf_hub_download
    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download",
                        lambda *a, **k: fetched.append(k) or download(*a, **k))  # fmt: skip
    flags = ["--model_name_or_path", REPO_ID, "--cache_dir", str(cache), "--model_revision", "v1", "--token", "hf_flag"]
    config, tokenizer, weight = loaded(script, workspace, tmp_path / "out", flags, monkeypatch)

    assert config.snapshot == "v1"
    assert "v1flag" in tokenizer.get_vocab() and "mainflag" not in tokenizer.get_vocab()
    assert torch.equal(weight, saved_query_weight(workspace["snapshots"]["v1"]))
    assert not torch.equal(weight, saved_query_weight(workspace["snapshots"]["main"]))
    assert fetched and all(call["token"] == "hf_flag" for call in fetched)
    if script != "convert_to_long":
        assert set(os.listdir(cache)) - {f"models--{REPO_ID.replace('/', '--')}"}  # the datasets' cache


def spy_loaders(monkeypatch) -> dict[str, list[dict]]:
    """The keyword arguments of every config, tokenizer and model load, by kind."""
    calls = {"config": [], "tokenizer": [], "model": []}

    def spy(owner, kind):
        original = owner.from_pretrained.__func__

        def recorded(cls, *args, **kwargs):
            calls[kind].append(kwargs)
            return original(cls, *args, **kwargs)

        monkeypatch.setattr(owner, "from_pretrained", classmethod(recorded))

    spy(T.AutoConfig, "config")
    spy(T.AutoTokenizer, "tokenizer")
    spy(_EfficientAutoModel, "model")  # the training scripts' hea.AutoModel*
    spy(T.AutoModelForMaskedLM, "model")  # convert_to_long's
    return calls


@pytest.mark.parametrize("script", [*TRAINING, "convert_to_long"])
def test_local_model_flags_reach_what_they_name(script, workspace, tmp_path, monkeypatch):
    """--config_name gives the config, --tokenizer_name the tokenizer (the data are encoded with it),
    --model_name_or_path the weights, --attn_impl/--attn_config the method; --trust_remote_code
    reaches every load."""
    calls = spy_loaders(monkeypatch)
    method = ["--attn_config", '{"mra2": {"block_size": 16}}'] if script == "compare_methods" else [
        "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}']  # fmt: skip
    flags = [
        "--model_name_or_path",
        workspace["model"],
        "--config_name",
        workspace["config"],
        "--tokenizer_name",
        workspace["tokenizer"],
        "--trust_remote_code",
        "true",
        *method,
    ]
    config, tokenizer, weight = loaded(script, workspace, tmp_path / "out", flags, monkeypatch)

    assert config.source == "config_name"
    assert "tokenizerflag" in tokenizer.get_vocab()
    assert torch.equal(weight, saved_query_weight(workspace["model"]))
    assert (config.attn_impl, config.attn_config["block_size"]) == ("mra2", 16)
    assert all(calls.values()) and all(call["trust_remote_code"] is True for kind in calls for call in calls[kind])


@pytest.mark.parametrize("script", [*TRAINING, "convert_to_long"])
def test_use_fast_tokenizer_false_is_refused_as_transformers_5_ignores_it(script, workspace, tmp_path, monkeypatch):
    """Transformers 5's AutoTokenizer always loads the fast tokenizer (it drops use_fast): false is refused
    before anything loads, with the way out; true (the default) loads as before."""
    flags = ["--model_name_or_path", workspace["model"], "--use_fast_tokenizer", "false"]
    message = r"^--use_fast_tokenizer false has no effect with Transformers 5, .*leave the flag out"
    with monkeypatch.context() as patched, pytest.raises(ValueError, match=message):
        patched.setattr(T.AutoConfig, "from_pretrained", lambda *a, **k: pytest.fail("loaded before the check"))
        if script == "convert_to_long":
            convert_main([*flags, "--output_dir", str(tmp_path / "out")])
        else:
            MAINS[script](script_args(script, workspace, tmp_path / "out", "--do_train", *flags))
    assert T.AutoTokenizer.from_pretrained(workspace["model"]).is_fast  # the default: what Transformers 5 loads


def test_tokenizer_name_encodes_the_data(workspace, tmp_path, monkeypatch):
    """The training blocks are the --tokenizer_name tokenizer's encoding (its marker word is one token)."""
    marked = tmp_path / "marked.txt"
    marked.write_text(" ".join(["tokenizerflag is here."] * 40) + "\n")
    flags = [
        "--model_name_or_path",
        workspace["model"],
        "--tokenizer_name",
        workspace["tokenizer"],
        "--do_train",
        "--train_file",
        str(marked),
    ]
    trainer = run_until_trainer("pretrain_mlm", script_args("pretrain_mlm", workspace, tmp_path, *flags),
                                monkeypatch).trainer  # fmt: skip
    marker = T.AutoTokenizer.from_pretrained(workspace["tokenizer"]).convert_tokens_to_ids("tokenizerflag")
    assert marker in trainer.train_dataset.examples["input_ids"][0]


#: TrainingArguments values that the scripts must hand on, unchanged, to the Trainer that trains (compare_methods
#: refuses those it decides for every method itself: compare.DECIDED_FLAGS).
HANDED_ON = {"per_device_train_batch_size": 3, "num_train_epochs": 2.0, "max_steps": 5, "learning_rate": 3e-4,
             "gradient_accumulation_steps": 2, "bf16": True, "eval_steps": 3, "save_total_limit": 2, "seed": 11,
             "data_seed": 13, "dataloader_num_workers": 1, "log_level": "info", "disable_tqdm": True,
             "eval_strategy": "steps", "save_strategy": "epoch", "save_steps": 7, "eval_on_start": True,
             "optim": "adamw_torch", "optim_args": "foreach=false", "weight_decay": 0.01, "adam_beta1": 0.8,
             "adam_beta2": 0.99, "adam_epsilon": 1e-6, "max_grad_norm": 0.5, "lr_scheduler_type": "cosine",
             "lr_scheduler_kwargs": {"num_cycles": 2}, "warmup_steps": 2}  # fmt: skip


@pytest.mark.parametrize("script", TRAINING)
def test_training_flags_reach_the_trainer(script, workspace, tmp_path, monkeypatch):
    """Each flag of HANDED_ON reaches the Trainer that trains (compare_methods: each method's, into
    ``output_dir/<method>``, training and evaluating without --do_train/--do_eval); an explicit
    --resume_from_checkpoint is what training resumes from; GLUE pads to multiples of 8 under bf16;
    --log_level info sets Transformers' and datasets' logging to info (default: their warnings, as
    tests/project/test_run_output.py checks) and --disable_tqdm turns their progress bars off too."""
    decided = compare.DECIDED_FLAGS if script == "compare_methods" else {}
    handed_on = {name: value for name, value in HANDED_ON.items() if name not in decided}
    flags = [arg for name, value in handed_on.items()
             for arg in (f"--{name}", json.dumps(value) if isinstance(value, dict) else str(value).lower())]  # fmt: skip
    flags += ["--use_cpu", "--model_name_or_path", workspace["model"]]
    checkpoint = tmp_path / "elsewhere" / "checkpoint-3"
    if script != "compare_methods":
        checkpoint.mkdir(parents=True)
        flags += ["--do_train", "--do_eval", "--resume_from_checkpoint", str(checkpoint)]
        if script != "pretrain_mlm":  # the masked-LM scripts refuse persistent workers (see below)
            flags += ["--dataloader_persistent_workers", "true"]
        if script == "finetune_glue":  # padded per batch, so that the multiple shows
            flags += ["--pad_to_max_length", "false"]
    with default_library_logging():
        stopped = run_until_trainer(script, script_args(script, workspace, tmp_path / "out", *flags), monkeypatch)
        libraries = (T.utils.logging, datasets.utils.logging)
        assert [(library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries] == [
            (logging.INFO, False)
        ] * 2

    args = stopped.trainer.args
    assert stopped.stage == "train" and stopped.trainer.eval_dataset is not None
    assert {name: getattr(args, name) for name in handed_on} == handed_on
    if script == "compare_methods":
        assert args.output_dir == str(tmp_path / "out" / "mra2") and args.do_train and args.do_eval
    else:
        assert args.output_dir == str(tmp_path / "out")
        assert stopped.kwargs["resume_from_checkpoint"] == str(checkpoint)
        assert args.dataloader_persistent_workers is (script != "pretrain_mlm")
    if script == "finetune_glue":
        assert stopped.trainer.data_collator.pad_to_multiple_of == 8


#: The scripts whose ``main`` takes ``callbacks``: Trainer callbacks a Python caller adds to the run.
WITH_CALLBACKS = [script for script, main in MAINS.items() if "callbacks" in inspect.signature(main).parameters]


@pytest.mark.parametrize("script", WITH_CALLBACKS)
def test_callbacks_given_to_main_reach_the_trainer(script, workspace, tmp_path, monkeypatch):
    """``main(argv, callbacks=[...])`` adds the caller's callbacks to the Trainer that trains."""
    callback = T.TrainerCallback()
    argv = script_args(script, workspace, tmp_path / "out", "--model_name_or_path", workspace["model"], "--do_train")
    stopped = run_until_trainer(script, argv, monkeypatch, callbacks=[callback])
    assert stopped.stage == "train" and callback in stopped.trainer.callback_handler.callbacks


@pytest.mark.parametrize(
    "script, flags, stage",
    [
        ("pretrain_mlm", ["--do_train"], "train"),
        ("pretrain_mlm", ["--do_eval"], "evaluate"),
        ("finetune_glue", ["--do_train"], "train"),
        ("finetune_glue", ["--do_eval"], "evaluate"),
        ("finetune_glue", ["--do_predict"], "predict"),
        ("finetune_wikihop", ["--do_train"], "train"),
        ("finetune_wikihop", ["--do_eval"], "evaluate"),
    ],
)
def test_do_flags_choose_the_stages(script, flags, stage, workspace, tmp_path, monkeypatch):
    """--do_train, --do_eval, --do_predict alone: that stage runs first, with only its data."""
    argv = script_args(script, workspace, tmp_path, "--model_name_or_path", workspace["model"], *flags)
    stopped = run_until_trainer(script, argv, monkeypatch)
    assert stopped.stage == stage
    assert (stopped.trainer.train_dataset is not None) == (stage == "train")
    assert (stopped.trainer.eval_dataset is not None) == (stage == "evaluate")


@pytest.mark.parametrize(
    "script, flags, message",
    [
        *[(script, ["--do_train", "--fp16"], "--fp16 needs a GPU") for script in TRAINING],
        *[(script, ["--do_train", "--report_to", "tensorboard"], "--report_to tensorboard needs the tensorboard")
          for script in TRAINING],
        *[(script, ["--do_train", "--dataloader_num_workers", "2", "--dataloader_persistent_workers", "true"],
           "--dataloader_persistent_workers keeps each worker's copy")
          for script in ("pretrain_mlm", "compare_methods")],
        ("pretrain_mlm", [], "nothing to do: pass --do_train and/or --do_eval$"),
        *[(script, ["--do_train", "--do_predict"], "--do_predict: this script has no prediction stage; it runs --do_train "
           "and/or --do_eval$") for script in ("pretrain_mlm", "compare_methods")],
        ("finetune_wikihop", ["--do_train", "--do_predict"], "--do_predict is not supported"),
        ("compare_methods", ["--resume_from_checkpoint", "{folder}"], "--resume_from_checkpoint does not apply"),
        ("compare_methods", ["--attn_impl", "mra2"], "--attn_impl does not apply to a comparison: list the methods in "
         "--methods$"),
        *[(script, ["--do_train", "--label_smoothing_factor", "0.1"], "--label_smoothing_factor has no effect here")
          for script in TRAINING],
        *[(script, ["--do_train", "--prediction_loss_only", "true"], "--prediction_loss_only would drop the predictions")
          for script in TRAINING],
        *[(script, ["--do_train", "--batch_eval_metrics", "true"], "--batch_eval_metrics would score each evaluation "
           "batch on its own") for script in TRAINING],
        *[("compare_methods", [flag, value], f"{flag} does not apply to a comparison: every method evaluates at step 0, "
           "then evaluates and saves a checkpoint every --eval_steps steps")
          for flag, value in (("--eval_strategy", "steps"), ("--save_strategy", "no"), ("--save_steps", "3"),
                              ("--eval_on_start", "true"))],
        ("compare_methods", ["--num_train_epochs", "2"], "--num_train_epochs does not apply to a comparison: every method "
         "trains --max_steps steps$"),
        *[(script, ["--do_train", "--validation_split_percentage", "10"], "--validation_split_percentage has no effect "
           "here: .* and these have one \\(.*validation.txt\\); leave it out$")
          for script in ("pretrain_mlm", "compare_methods")],
    ],
)  # fmt: skip
def test_run_flags_are_read_before_loading(script, flags, message, workspace, tmp_path, monkeypatch):
    """--fp16 on CPU, a --report_to tracker not installed, persistent workers (the masks would stop
    changing between epochs), --do_predict where there is no prediction, compare_methods' explicit
    --resume_from_checkpoint (each method resumes from its own folder) and --attn_impl (it compares
    --methods), --label_smoothing_factor (Trainer skips its smoother when a script gives its own
    loss), --prediction_loss_only (the scripts score predictions) and --batch_eval_metrics (they score
    the whole set at once) are refused before any load; so are the flags compare_methods decides for
    every method itself (the evaluation and saving schedule, the epochs), and a
    --validation_split_percentage beside a --validation_file (nothing to carve)."""
    monkeypatch.setattr(T.integrations, "is_tensorboard_available", lambda: False)
    for module in (pretrain, glue, wikihop, compare):
        monkeypatch.setattr(module, "load_config", lambda *a, **k: pytest.fail("a model was loaded before the check"))
    flags = [flag.format(folder=tmp_path) for flag in flags]
    argv = script_args(script, workspace, tmp_path / "out", "--model_name_or_path", workspace["model"], *flags)
    with pytest.raises(ValueError, match=message):
        MAINS[script](argv)


def test_batch_eval_metrics_advice_leaving_it_out_scores_the_whole_set(workspace, tmp_path):
    """--batch_eval_metrics is refused (Trainer would call the metrics once per batch, which the scripts'
    metrics, taking the whole set, do not support); its advice, leaving it out, evaluates and writes the
    masked-token accuracy of the whole set."""
    argv = script_args("pretrain_mlm", workspace, tmp_path, "--model_name_or_path", workspace["model"], "--do_eval")
    message = "--batch_eval_metrics would score each evaluation batch on its own, .*; leave it out$"
    with pytest.raises(ValueError, match=message):
        pretrain.main([*argv, "--batch_eval_metrics", "true"])
    metrics = pretrain.main(argv)
    assert 0 <= metrics["eval_accuracy"] <= 1 and metrics["eval_samples"] > 1
    assert (tmp_path / "eval_results.json").is_file()


@pytest.mark.parametrize("script", TRAINING)
def test_seed_draws_what_it_seeds(script, workspace, tmp_path, monkeypatch):
    """--seed draws what a run draws first: the newly initialised head (finetune_glue, finetune_wikihop),
    the training masks (the masked-LM scripts; --data_seed left out). The same seed draws the same,
    another seed something else."""

    def drawn(seed):
        argv = script_args(script, workspace, tmp_path / str(seed), "--model_name_or_path", workspace["model"],
                           "--do_train", "--seed", str(seed))  # fmt: skip
        trainer = run_until_trainer(script, argv, monkeypatch).trainer
        if script in ("pretrain_mlm", "compare_methods"):
            return {f"labels{i}": trainer.train_dataset[i]["labels"] for i in range(8)}
        loaded = set(load_file(os.path.join(workspace["model"], "model.safetensors")))
        return {name: t.detach().clone() for name, t in trainer.model.state_dict().items() if name not in loaded}

    first, again, other = drawn(1), drawn(1), drawn(2)
    assert first and all(torch.equal(first[name], again[name]) for name in first)
    assert any(not torch.equal(first[name], other[name]) for name in first)


@pytest.mark.parametrize("script", TRAINING)
def test_pin_memory_is_turned_off_on_cpu_only(script, workspace, tmp_path, monkeypatch):
    """Every training script turns --dataloader_pin_memory (default: on) off on CPU, where it is of no
    use, and (start_run, which each calls) keeps it on an accelerator. (Transformers turns it off
    itself only with --use_cpu.)"""
    argv = script_args(script, workspace, tmp_path / "out", "--model_name_or_path", workspace["model"], "--do_train",
                       "--dataloader_pin_memory", "true")  # fmt: skip
    trainer = run_until_trainer(script, argv, monkeypatch).trainer
    assert trainer.args.device.type == "cpu" and trainer.args.dataloader_pin_memory is False
    on_gpu = T.TrainingArguments(output_dir=str(tmp_path), report_to="none", dataloader_pin_memory=True)
    monkeypatch.setattr(T.TrainingArguments, "device", property(lambda self: torch.device("cuda", 0)))
    driver.start_run(on_gpu)
    assert on_gpu.dataloader_pin_memory is True
