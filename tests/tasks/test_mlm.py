"""Continued MLM pretraining: loss over the step's items, deterministic masks, metrics against
scikit-learn, data errors, and tiny real-text runs (loss goes down, resume equals an
uninterrupted run, evaluation is deterministic, accumulation equals one large batch), and each
command-line option read from the data a run would train on (the Trainer captured)."""

import dataclasses
import inspect
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import paths
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from sklearn.metrics import accuracy_score
from training_fixtures import read_json, save_tiny_mlm, small_tokenizer, write_news_files
from transformers import DataCollatorForLanguageModeling, EvalPrediction, TrainerState

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.common.args import ModelArguments
from hf_efficient_attn.tasks.common.data import load_raw_datasets, mean_length, text_column, tokenize_in_blocks
from hf_efficient_attn.tasks.common.loss import global_mean_loss
from hf_efficient_attn.tasks.common.masking import DeterministicallyMaskedDataset, MaskingEpochCallback
from hf_efficient_attn.tasks.common.metrics import masked_token_accuracy
from hf_efficient_attn.tasks.mlm.pretrain import MLMDataArguments, main

SEQ = 64


# ---- loss, masks, metrics -------------------------------------------------------------


def test_loss_over_split_batches_equals_the_whole_batch():
    """Micro-batches (accumulation) or processes each dividing by the step's item count add up
    to the token mean of the whole batch; the model heads' per-batch mean would not."""
    logits = torch.randn(4, 10, 7)
    labels = torch.randint(0, 7, (4, 10))
    labels[torch.rand(4, 10) < 0.7] = -100
    whole = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), ignore_index=-100)
    count = labels.ne(-100).sum()
    parts = sum(global_mean_loss({"logits": logits[i : i + 1]}, labels[i : i + 1], count) for i in range(4))
    torch.testing.assert_close(parts, whole)
    torch.testing.assert_close(global_mean_loss({"logits": logits}, labels), whole)
    scores, targets = torch.randn(6, 1), torch.randn(6)
    torch.testing.assert_close(global_mean_loss({"logits": scores}, targets), F.mse_loss(scores[:, 0], targets))


def masked_examples(n=6, length=SEQ):
    tokenizer = small_tokenizer()
    ids = [[tokenizer.cls_token_id] + list(range(10, 10 + length - 2)) + [tokenizer.sep_token_id] for _ in range(n)]
    special = [[1] + [0] * (length - 2) + [1] for _ in range(n)]
    return Dataset.from_dict({"input_ids": ids, "special_tokens_mask": special, "attention_mask": [[1] * length] * n})


def test_masks_are_a_function_of_seed_epoch_and_example():
    tokenizer = small_tokenizer()
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    examples = masked_examples()
    first = DeterministicallyMaskedDataset(examples, masker, seed=3)
    other_process = DeterministicallyMaskedDataset(examples, masker, seed=3)  # another worker/process
    torch.manual_seed(123)  # the global RNG plays no part
    for index in (0, 5):
        a, b = first[index], other_process[index]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(first[0]["labels"], first[1]["labels"])  # examples differ
    epoch0 = first[2]["labels"]
    first.set_epoch(1)
    assert not torch.equal(first[2]["labels"], epoch0)  # epochs differ
    assert not torch.equal(DeterministicallyMaskedDataset(examples, masker, seed=4)[2]["labels"], epoch0)

    rows = [first[i] for i in range(len(first))]
    labels = torch.stack([r["labels"] for r in rows])
    inputs = torch.stack([r["input_ids"] for r in rows])
    original = torch.tensor(examples["input_ids"])
    assert (labels[:, 0] == -100).all() and (labels[:, -1] == -100).all()  # special tokens never masked
    chosen = labels != -100
    assert torch.equal(labels[chosen], original[chosen])  # labels are the original tokens
    assert torch.equal(inputs[~chosen], original[~chosen])  # unchosen tokens unchanged
    rate = chosen.float().mean().item() * SEQ / (SEQ - 2)
    assert abs(rate - 0.15) < 4 * math.sqrt(0.15 * 0.85 / chosen.numel())
    assert (inputs[chosen] == tokenizer.mask_token_id).float().mean() > 0.6  # mostly [MASK] (80%)


def test_epoch_callback_follows_the_trainer_state():
    dataset = DeterministicallyMaskedDataset(masked_examples(), None, seed=0)
    callback = MaskingEpochCallback(dataset)
    for epoch, expected in ((None, 0), (0.0, 0), (1.0, 1), (2.75, 2)):
        callback.on_epoch_begin(None, TrainerState(epoch=epoch), None)
        assert dataset.epoch == expected


def test_masked_token_accuracy_matches_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 20, (5, 12))
    labels[rng.random((5, 12)) < 0.8] = -100
    predictions = np.where(rng.random((5, 12)) < 0.5, labels, rng.integers(0, 20, (5, 12)))
    counted = labels != -100
    expected = accuracy_score(labels[counted], predictions[counted])
    assert masked_token_accuracy(EvalPrediction(predictions, labels))["accuracy"] == pytest.approx(expected)


def test_text_is_grouped_into_full_blocks_in_order():
    tokenizer = small_tokenizer()
    texts = ["The fire crossed the river on Monday night. " * n for n in (3, 9, 1, 14, 5)]
    blocks = tokenize_in_blocks(DatasetDict(train=Dataset.from_dict({"text": texts})), tokenizer, "text", 16)["train"]
    stream = [t for text in texts for t in tokenizer(text)["input_ids"]]
    assert all(len(ids) == 16 for ids in blocks["input_ids"])
    assert [t for ids in blocks["input_ids"] for t in ids] == stream[: len(stream) // 16 * 16]
    assert mean_length(blocks) == 16
    assert mean_length(Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]}).select([0, 1])) == 2
    assert mean_length(Dataset.from_dict({"input_ids": [[1]]}).select([])) is None  # no examples: no mean (not 0 / 0)
    with pytest.raises(ValueError, match="fewer than one block of --max_seq_length 4096"):
        tokenize_in_blocks(DatasetDict(train=Dataset.from_dict({"text": texts})), tokenizer, "text", 4096)


def test_blocks_are_cut_per_map_batch_as_run_mlm_cuts_them():
    """Transformers' run_mlm.py groups texts with ``Dataset.map``'s default batch, dropping each batch's
    tail: more texts than one batch give the same blocks as that procedure, not one stream's."""
    tokenizer = small_tokenizer()
    batch = inspect.signature(Dataset.map).parameters["batch_size"].default
    texts = [f"Report {n} on the river." for n in range(batch + batch // 2)]
    blocks = tokenize_in_blocks(DatasetDict(train=Dataset.from_dict({"text": texts})), tokenizer, "text", 16)["train"]
    expected = []
    for start in range(0, len(texts), batch):
        stream = [t for ids in tokenizer(texts[start : start + batch])["input_ids"] for t in ids]
        expected += [stream[i : i + 16] for i in range(0, len(stream) // 16 * 16, 16)]
    assert blocks["input_ids"] == expected


# ---- bad input -----------------------------------------------------------------------------


def test_data_file_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="no such file"):
        MLMDataArguments(train_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="the file is empty"):
        MLMDataArguments(train_file=str(empty))
    with pytest.raises(ValueError, match="allowed extensions: txt, json, jsonl, csv"):
        MLMDataArguments(train_file=str(tmp_path / "data.parquet"))
    with pytest.raises(ValueError, match="give a dataset"):
        MLMDataArguments()
    with pytest.raises(ValueError, match="mlm_probability must be between 0 and 1"):
        MLMDataArguments(train_file=str(write_news_files(str(tmp_path))[0]), mlm_probability=1.5)


def test_dataset_without_a_text_column(tmp_path):
    table = tmp_path / "reviews.csv"
    table.write_text("id,review\n1,A fine film.\n2,Too long by half.\n")
    raw = load_raw_datasets(train_file=str(table), validation_split_percentage=50)
    with pytest.raises(ValueError, match=r"no text column 'text'; its columns are \['id', 'review'\]"):
        text_column(raw["train"])
    assert text_column(raw["train"], "review") == "review"
    with pytest.raises(ValueError, match="must hold text"):
        text_column(raw["train"], "id")


def test_a_split_percentage_for_data_with_a_validation_file_is_refused_naming_it(tmp_path):
    """load_raw_datasets (the API the scripts share) refuses --validation_split_percentage for data
    that have a validation file, naming that file: it is what makes the percentage do nothing."""
    train, validation = write_news_files(str(tmp_path), train_articles=4, validation_articles=2)
    with pytest.raises(ValueError, match=rf"these have one \({re.escape(validation)}\); leave it out"):
        load_raw_datasets(train_file=train, validation_file=validation, validation_split_percentage=10)


def test_method_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown attention method 'mra3'"):
        ModelArguments(model_name_or_path=".", attn_impl="mra3")
    with pytest.raises(ValueError, match="--attn_config must be a JSON object"):
        ModelArguments(model_name_or_path=".", attn_impl="mra2", attn_config="block_per_row=16")
    assert ModelArguments(model_name_or_path=".", attn_impl="mra2", attn_config='{"block_per_row": 16}').attn_options == {
        "block_per_row": 16
    }


# ---- tiny real-text runs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    train, validation = write_news_files(str(root))
    model = save_tiny_mlm(str(root / "tiny"))
    no_dropout = save_tiny_mlm(str(root / "tiny-no-dropout"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return {"root": root, "train": train, "validation": validation, "model": model, "no_dropout": no_dropout}


def run(workspace, output_dir, *extra, model="model", files=("train", "validation")):
    """pretrain_mlm.py on the workspace's model and ``files`` (of train, validation)."""
    args = [
        "--model_name_or_path", workspace[model], "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}',
        *[arg for split in files for arg in (f"--{split}_file", workspace[split])],
        "--max_seq_length", str(SEQ), "--output_dir", str(output_dir), "--per_device_eval_batch_size", "8",
        "--learning_rate", "2e-3", "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true",
        "--seed", "7", *extra,
    ]  # fmt: skip
    return main(args)


def test_max_seq_length_above_the_table(workspace, tmp_path):
    with pytest.raises(ValueError, match=r"--max_seq_length 512 exceeds the model's position table \(130 tokens\)"):
        run(workspace, tmp_path, "--do_train", "--max_seq_length", "512")


def test_fp16_on_cpu_is_refused(workspace, tmp_path):
    with pytest.raises(ValueError, match="--fp16 needs a GPU"):
        run(workspace, tmp_path, "--do_train", "--fp16", "--use_cpu")


def test_tiny_run_learns_and_writes_what_run_mlm_writes(workspace, tmp_path, capsys):
    out = tmp_path / "out"
    config = {
        "model_name_or_path": workspace["model"], "attn_impl": "mra2", "attn_config": {"block_size": 16},
        "train_file": workspace["train"], "validation_file": workspace["validation"], "max_seq_length": SEQ,
        "do_train": True, "do_eval": True, "output_dir": str(out), "max_steps": 30, "per_device_train_batch_size": 8,
        "learning_rate": 5e-3, "logging_steps": 1, "report_to": "none", "disable_tqdm": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    main([str(tmp_path / "config.json")])  # a single .json argument is the whole configuration

    losses = [entry["loss"] for entry in read_json(out, "trainer_state.json")["log_history"] if "loss" in entry]
    assert len(losses) == 30 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3
    results = read_json(out, "all_results.json")
    assert results == {**read_json(out, "train_results.json"), **read_json(out, "eval_results.json")}
    assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]))
    assert 0 < results["eval_accuracy"] < 1 and results["eval_loss"] < math.log(len(small_tokenizer()))
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("summary: attention mra2, train ") and "tokens/s" in summary
    assert f"masked-token accuracy {results['eval_accuracy']:.4f}" in summary

    reloaded = hea.AutoModelForMaskedLM.from_pretrained(str(out))
    assert reloaded.config.attn_impl == "mra2" and reloaded.config.attn_config["block_size"] == 16
    eval_only = run(workspace, tmp_path / "again", "--do_eval", "--model_name_or_path", str(out), "--attn_impl", "mra2")
    assert eval_only["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-6)  # reloads as the same model


def test_resume_equals_uninterrupted(workspace, tmp_path, training_steps):
    """7 steps of 8 blocks over a 20-block set (3 steps per epoch); resuming from step 4 (mid-epoch 2)
    trains the 3 remaining steps and reaches the same eval loss as the run that never stopped."""
    common = ["--do_train", "--do_eval", "--max_steps", "7", "--per_device_train_batch_size", "8",
              "--max_train_samples", "20", "--save_steps", "4"]  # fmt: skip
    whole = run(workspace, tmp_path / "whole", *common)
    assert len(training_steps) == 7
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-4", resumed_dir / "checkpoint-4")
    resumed = run(workspace, resumed_dir, *common)  # finds checkpoint-4 in output_dir and resumes
    assert len(training_steps) == 7 + 3  # resumed, not restarted
    assert resumed["epoch"] == whole["epoch"] > 2
    assert resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6, abs=0)
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]


def test_a_rerun_with_another_method_names_the_checkpoints_and_its_advice_resumes(workspace, tmp_path, training_steps):
    """A folder whose checkpoint was made with one method, rerun asking another: one error naming
    both, before any step; rerunning with the checkpoint's method, as it advises, resumes."""
    common = ["--do_train", "--max_steps", "3", "--per_device_train_batch_size", "4", "--max_train_samples", "8",
              "--save_steps", "2"]  # fmt: skip
    out = tmp_path / "out"
    run(workspace, out, *common, "--max_steps", "2")  # checkpoint-2, made with mra2 (block_size 16)
    made = len(training_steps)
    message = (r"checkpoint-2 was saved with --attn_impl mra2 --attn_config '\{.*\}', this run asks --attn_impl "
               r"linformer --attn_config '\{.*\}': rerun with that method to resume, or give another --output_dir")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        run(workspace, out, *common, "--attn_impl", "linformer", "--attn_config", '{"k": 8}')
    assert len(training_steps) == made
    run(workspace, out, *common)  # the checkpoint's method: resumes at step 2
    assert len(training_steps) == made + 1


def test_evaluation_is_deterministic(workspace, tmp_path):
    """The validation masks are fixed: other training seeds and eval batch sizes give the same
    masked-token accuracy (and, for one batch size, the same loss)."""
    base = run(workspace, tmp_path / "a", "--do_eval", "--seed", "1")
    reseeded = run(workspace, tmp_path / "b", "--do_eval", "--seed", "2")
    rebatched = run(workspace, tmp_path / "c", "--do_eval", "--per_device_eval_batch_size", "3")
    assert reseeded["eval_loss"] == base["eval_loss"] and reseeded["eval_accuracy"] == base["eval_accuracy"]
    assert rebatched["eval_accuracy"] == base["eval_accuracy"]
    assert rebatched["eval_loss"] == pytest.approx(base["eval_loss"], rel=0.02)


def test_gradient_accumulation_equals_one_large_batch(workspace, tmp_path):
    """Batch 8 equals 4 x 2 accumulated (dropout off): the logged loss is not multiplied and the
    trained model is the same. (Two processes rely on the same count: see the slow tier.)"""
    common = ["--do_train", "--do_eval", "--max_steps", "4", "--max_train_samples", "32"]
    large = run(workspace, tmp_path / "large", *common, "--per_device_train_batch_size", "8", model="no_dropout")
    accumulated = run(workspace, tmp_path / "acc", *common, "--per_device_train_batch_size", "4",
                      "--gradient_accumulation_steps", "2", model="no_dropout")  # fmt: skip
    assert accumulated["train_loss"] == pytest.approx(large["train_loss"], rel=1e-4)
    assert accumulated["eval_loss"] == pytest.approx(large["eval_loss"], rel=1e-4)


def test_trainer_options_on_cpu(workspace, tmp_path):
    """bf16 autocast, gradient checkpointing through the patched attention, line-by-line
    examples (padded batches), epoch-based evaluation and saving."""
    out = tmp_path / "opts"
    metrics = run(workspace, out, "--do_train", "--do_eval", "--use_cpu", "--bf16", "--activation_checkpointing",
                  "--line_by_line",
                  "--num_train_epochs", "1", "--max_train_samples", "24", "--per_device_train_batch_size", "6",
                  "--eval_strategy", "epoch", "--save_strategy", "epoch")  # fmt: skip
    assert math.isfinite(metrics["eval_loss"]) and metrics["epoch"] == 1
    assert os.path.isdir(out / "checkpoint-4")
    evaluations = [e for e in read_json(out, "trainer_state.json")["log_history"] if "eval_loss" in e]
    assert len(evaluations) == 1


def test_tensorboard_reporting(workspace, tmp_path):
    """Transformers 5 writes TensorBoard events under output_dir (no --logging_dir any more)."""
    pytest.importorskip(
        "tensorboard",
        reason="tensorboard is not installed: it comes with the `train` extra "
        "(pip install -e .[train]), not the `test` one, which stays small",
    )
    run(workspace, tmp_path / "tb", "--do_train", "--max_steps", "2", "--report_to", "tensorboard")
    events = [name for _, _, files in os.walk(tmp_path / "tb") for name in files if name.startswith("events.out.tfevents")]
    assert events


RECIPES = os.path.join(paths.REPO, "configs", "train")


# Recipes of the fine-tuning scripts are named after their task (glue-*.json, tested in test_glue.py).
MLM_RECIPES = sorted(name for name in os.listdir(RECIPES) if not name.startswith(("glue-", "wikihop-")))


@pytest.mark.parametrize("name", MLM_RECIPES)
def test_recipes_name_only_known_flags(name, tmp_path, monkeypatch):
    """Every key of configs/train/*.json is a flag of pretrain_mlm.py; the CPU recipes parse
    whole (the GPU ones ask for bf16, which TrainingArguments refuses without a GPU here)."""
    from transformers import TrainingArguments

    from hf_efficient_attn.tasks.common.args import parse_arguments

    with open(os.path.join(RECIPES, name)) as f:
        recipe = json.load(f)
    types = (ModelArguments, MLMDataArguments, TrainingArguments)
    flags = {f.name for cls in types for f in dataclasses.fields(cls)}
    assert set(recipe) <= flags, sorted(set(recipe) - flags)
    if recipe.get("use_cpu"):
        monkeypatch.chdir(tmp_path)
        for key in ("train_file", "validation_file"):
            os.makedirs(os.path.dirname(recipe[key]), exist_ok=True)
            with open(recipe[key], "w") as f:
                f.write('{"text": "A line."}\n')
        os.makedirs(recipe["model_name_or_path"])  # convert_to_long's output (a missing folder is an error)
        model_args, data_args, training_args = parse_arguments(types, [os.path.join(RECIPES, name)])
        assert data_args.max_seq_length == recipe["max_seq_length"] and training_args.max_steps == recipe["max_steps"]
        assert model_args.attn_impl == recipe.get("attn_impl")


# ---- each command-line option does what it says (the data a run would train on) ---------------


def captured(workspace, monkeypatch, tmp_path, *extra, files=("train", "validation")):
    """What ``run`` would give its Trainer (nothing is trained)."""
    from training_fixtures import Captured, capture_trainer

    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        run(workspace, tmp_path / "captured", *extra, files=files)
    return caught.value.kwargs


def all_rows(dataset):
    return [dataset[i] for i in range(len(dataset))]


def mask_rate(dataset):
    """Share of the non-special tokens chosen for prediction (labels != -100)."""
    chosen = counted = 0
    for index in range(len(dataset)):
        special = torch.tensor(dataset.examples[index]["special_tokens_mask"], dtype=torch.bool)
        chosen += int((dataset[index]["labels"] != -100).sum())
        counted += int((~special).sum())
    return chosen / counted, counted


@pytest.mark.parametrize("probability", [0.15, 0.4])
def test_mlm_probability_sets_the_share_of_masked_tokens(workspace, monkeypatch, tmp_path, probability):
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--mlm_probability",
                       str(probability))  # fmt: skip
    for dataset in (trainer["train_dataset"], trainer["eval_dataset"]):
        rate, counted = mask_rate(dataset)
        assert abs(rate - probability) < 4 * math.sqrt(probability * (1 - probability) / counted), rate


@pytest.mark.parametrize("length", [32, 48])
def test_max_seq_length_is_the_length_of_every_block(workspace, monkeypatch, tmp_path, length):
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--max_seq_length", str(length))
    for dataset in (trainer["train_dataset"], trainer["eval_dataset"]):
        assert {len(row["input_ids"]) for row in all_rows(dataset)} == {length}
        assert {len(ids) for ids in dataset.examples["input_ids"]} == {length}


def test_line_by_line_makes_one_truncated_example_per_line(workspace, monkeypatch, tmp_path):
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--line_by_line", "--max_seq_length", "40")
    with open(workspace["train"]) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    expected = small_tokenizer()(lines, truncation=True, max_length=40)["input_ids"]
    assert trainer["train_dataset"].examples["input_ids"] == expected
    assert max(len(ids) for ids in expected) == 40  # some lines were truncated


def test_sample_limits_keep_the_first_examples(workspace, monkeypatch, tmp_path):
    whole = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval")
    limited = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--max_train_samples", "5",
                       "--max_eval_samples", "3")  # fmt: skip
    assert len(whole["train_dataset"]) > 5 and len(whole["eval_dataset"]) > 3
    assert limited["train_dataset"].examples["input_ids"] == whole["train_dataset"].examples["input_ids"][:5]
    assert limited["eval_dataset"].examples["input_ids"] == whole["eval_dataset"].examples["input_ids"][:3]


@pytest.mark.parametrize("percentage", [10, 25])
def test_carved_validation_rows_leave_the_training_set(workspace, monkeypatch, tmp_path, percentage):
    """Without --validation_file the first --validation_split_percentage % of the training lines
    are the validation set, and only the others are trained on (no example in both)."""
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--line_by_line",
                       "--validation_split_percentage", str(percentage), files=("train",))  # fmt: skip
    with open(workspace["train"]) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    encoded = [tuple(ids) for ids in small_tokenizer()(lines, truncation=True, max_length=SEQ)["input_ids"]]
    count = round(len(lines) * percentage / 100)
    train = [tuple(ids) for ids in trainer["train_dataset"].examples["input_ids"]]
    validation = [tuple(ids) for ids in trainer["eval_dataset"].examples["input_ids"]]
    assert validation == encoded[:count] and train == encoded[count:]
    assert not set(train) & set(validation)


def test_seeds_choose_the_masks_they_say(workspace, monkeypatch, tmp_path):
    """--seed draws the training masks, --data_seed (when given) instead of it; the validation
    masks follow --eval_mask_seed only."""

    def masks(*extra):
        trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--max_train_samples", "6",
                           "--max_eval_samples", "6", *extra)  # fmt: skip
        return [torch.stack([r["labels"] for r in all_rows(trainer[s])]) for s in ("train_dataset", "eval_dataset")]

    train, validation = masks("--seed", "1")
    other_train, other_validation = masks("--seed", "2")
    assert not torch.equal(train, other_train) and torch.equal(validation, other_validation)
    data_seeded, _ = masks("--seed", "1", "--data_seed", "5")
    assert torch.equal(masks("--seed", "2", "--data_seed", "5")[0], data_seeded)
    assert not torch.equal(data_seeded, train)
    reseeded_train, reseeded_validation = masks("--seed", "1", "--eval_mask_seed", "9")
    assert torch.equal(reseeded_train, train) and not torch.equal(reseeded_validation, validation)


def test_text_column_name_is_the_text_trained_on(workspace, monkeypatch, tmp_path):
    texts = [text for text in Path(workspace["train"]).read_text().split("\n") if text]
    rows = [{"title": f"Article {i}", "body": text} for i, text in enumerate(texts)]
    path = tmp_path / "articles.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--line_by_line", "--train_file", str(path),
                       "--text_column_name", "body", files=())  # fmt: skip
    expected = small_tokenizer()([r["body"] for r in rows], truncation=True, max_length=SEQ)["input_ids"]
    assert trainer["train_dataset"].examples["input_ids"] == expected[round(len(rows) * 0.05) :]


def test_dataset_name_and_config_are_what_is_loaded(workspace, monkeypatch, tmp_path):
    import datasets

    calls = []
    texts = Path(workspace["train"]).read_text().split("\n")[:20]

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return DatasetDict(train=Dataset.from_dict({"text": texts[:16]}), validation=Dataset.from_dict(
            {"text": texts[16:]}))  # fmt: skip

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--line_by_line",
                       "--dataset_name", "someone/news", "--dataset_config_name", "en", files=())  # fmt: skip
    assert calls == [("someone/news", "en")]
    tokenizer = small_tokenizer()
    assert trainer["eval_dataset"].examples["input_ids"] == tokenizer(texts[16:], truncation=True,
                                                                      max_length=SEQ)["input_ids"]  # fmt: skip
