"""WikiHop fine-tuning through the command line, on tiny models and synthetic files: outputs,
predictions.json, reload, resume = uninterrupted, each option, gradient accumulation = one large
batch, --padding_free = the padded run, the recipes."""

import dataclasses
import json
import math
import os
import shutil

import numpy as np
import paths
import pytest
import torch
from datasets import Dataset
from tiny import KINDS, default_tier, no_dropout
from training_fixtures import TrainingSet, assert_summary_rate
from transformers import AutoTokenizer
from wikihop_fixtures import LONG, save_tiny_encoder, write_files

from hf_efficient_attn.tasks.wikihop.data import (
    MARKERS,
    ChunkCollator,
    ChunkEncoder,
)
from hf_efficient_attn.tasks.wikihop.finetune import WikiHopDataArguments, main
from hf_efficient_attn.tasks.wikihop.heads import AutoModelForCandidateScoring, candidate_scoring_class
from hf_efficient_attn.tasks.wikihop.qangaroo import synthetic_examples, write_qangaroo_json

# ---- tiny runs through the command line --------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Synthetic files only, so that only the tests of the real examples skip without them."""
    root = tmp_path_factory.mktemp("wikihop")
    train, dev = write_files(str(root), with_real=False)
    return {"train": train, "dev": dev, "model": save_tiny_encoder(str(root / "tiny"))}


def run(workspace, output_dir, *extra):
    args = [
        "--model_name_or_path", workspace["model"], "--train_file", workspace["train"],
        "--validation_file", workspace["dev"], "--max_seq_length", "128", "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--learning_rate", "1e-3",
        "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--seed", "3", *extra,
    ]  # fmt: skip
    return main(args)


def read(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def test_tiny_run_writes_results_and_predictions_and_reloads(workspace, tmp_path, capsys):
    """Training on synthetic examples, evaluation on the two real ones (48 and 10 chunks) and 8 synthetic."""
    _, dev_file = write_files(str(tmp_path), train=0, dev=8)
    out = tmp_path / "out"
    config = {
        "model_name_or_path": workspace["model"], "attn_impl": "mra2", "attn_config": {"block_size": 16},
        "train_file": workspace["train"], "validation_file": dev_file, "max_seq_length": 128,
        "do_train": True, "do_eval": True, "max_steps": 4, "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4, "learning_rate": 1e-3, "report_to": "none", "disable_tqdm": True,
        "output_dir": str(out),
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    training_set = TrainingSet()
    main([str(tmp_path / "config.json")], callbacks=[training_set])  # a single .json argument is the whole configuration

    results = read(out, "all_results.json")
    assert results == {**read(out, "train_results.json"), **read(out, "eval_results.json")}
    assert results["eval_samples"] == 10 and 0 <= results["eval_accuracy"] <= 1
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("summary: attention mra2, train ") and "tokens/s" in summary
    assert f"eval accuracy {results['eval_accuracy']:.4f}" in summary
    assert_summary_rate(summary, results, training_set.examples)  # not the evaluation set's (other lengths)

    with open(dev_file) as f:
        dev = json.load(f)
    predictions = read(out, "predictions.json")
    assert list(predictions) == [e["id"] for e in dev]
    assert all(predictions[e["id"]] in e["candidates"] for e in dev)
    correct = [predictions[e["id"]] == e["answer"] for e in dev]
    assert results["eval_accuracy"] == pytest.approx(np.mean(correct))

    # The saved model is the candidate scorer with its method and markers; it reproduces the predictions.
    model = AutoModelForCandidateScoring.from_pretrained(str(out)).eval()
    assert isinstance(model, candidate_scoring_class(model.config)) and type(model).__name__ == "BertForCandidateScoring"
    assert model.config.attn_impl == "mra2" and model.config.attn_config["block_size"] == 16
    tok = AutoTokenizer.from_pretrained(str(out))
    assert all(m in tok.get_vocab() for m in MARKERS) and model.get_input_embeddings().num_embeddings == len(tok)
    encoder = ChunkEncoder(tok, 128)
    collate = ChunkCollator(tok.pad_token_id)
    rows = Dataset.from_list(dev).map(encoder, batched=True, remove_columns=list(dev[0]))
    with torch.no_grad():
        logits = model(**collate([rows[i] for i in range(len(rows))])).logits
    assert {e["id"]: e["candidates"][int(logits[i].argmax())] for i, e in enumerate(dev)} == predictions

    # Evaluation only, from the saved folder, no --attn_impl: the method comes from its config.
    again = run(workspace, tmp_path / "again", "--do_eval", "--model_name_or_path", str(out), "--validation_file", dev_file)
    assert again["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-6)
    assert again["eval_accuracy"] == results["eval_accuracy"]


def test_resume_equals_uninterrupted(workspace, tmp_path, training_steps):
    """6 steps of 4 over 12 examples (3 steps per epoch); resuming from step 3 trains the 3 remaining
    steps and reaches the same evaluation as the run that never stopped (dropout on: Trainer
    restores the RNG states)."""
    common = ["--do_train", "--do_eval", "--max_steps", "6", "--max_train_samples", "12", "--save_steps", "3",
              "--attn_impl", "mra2", "--max_seq_length", "64"]  # fmt: skip
    whole = run(workspace, tmp_path / "whole", *common)
    assert len(training_steps) == 6
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", resumed_dir / "checkpoint-3")
    resumed = run(workspace, resumed_dir, *common)  # finds checkpoint-3 in output_dir and resumes
    assert len(training_steps) == 6 + 3  # resumed, not restarted
    assert resumed["epoch"] == whole["epoch"] == 2
    assert resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6, abs=0)
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]


def test_trainer_options_on_cpu(workspace, tmp_path):
    """The recipes' options: bf16 autocast, gradient checkpointing through the patched attention,
    per-epoch evaluation and saving; and chunks padded to --max_seq_length, at most 3 per example."""
    out = tmp_path / "opts"
    metrics = run(workspace, out, "--do_train", "--do_eval", "--use_cpu", "--bf16", "--activation_checkpointing",
                  "--attn_impl", "mra2", "--num_train_epochs", "1", "--max_train_samples", "8",
                  "--eval_strategy", "epoch", "--save_strategy", "epoch", "--pad_to_max_length",
                  "--max_chunks", "3")  # fmt: skip
    assert math.isfinite(metrics["eval_loss"]) and metrics["epoch"] == 1
    assert os.path.isdir(out / "checkpoint-2")
    assert len([e for e in read(out, "trainer_state.json")["log_history"] if "eval_loss" in e]) == 1


def test_do_predict_advice_evaluating_on_a_file_writes_its_predictions(workspace, tmp_path):
    """--do_predict is refused before anything is loaded (WikiHop's test answers are hidden); its advice,
    --do_eval on a file, writes predictions.json: one of the candidates of each of the file's examples."""
    message = (
        "--do_predict is not supported: WikiHop's test answers are hidden; use --do_eval on a file instead: it writes "
        "predictions.json for its examples"
    )
    with pytest.raises(ValueError, match=f"^{message}$"):
        run(workspace, tmp_path / "refused", "--do_predict")
    assert not (tmp_path / "refused").exists()
    run(workspace, tmp_path / "out", "--do_eval")
    with open(workspace["dev"]) as f:
        dev = json.load(f)
    predictions = read(tmp_path / "out", "predictions.json")
    assert list(predictions) == [e["id"] for e in dev] and all(predictions[e["id"]] in e["candidates"] for e in dev)


def test_command_line_errors(workspace, tmp_path):
    with pytest.raises(ValueError, match="--do_predict is not supported"):
        run(workspace, tmp_path, "--do_predict")
    with pytest.raises(ValueError, match=r"--max_seq_length 1024 exceeds the model's position table \(512 tokens\)"):
        run(workspace, tmp_path, "--do_train", "--max_seq_length", "1024")
    with pytest.raises(ValueError, match="--do_eval needs a validation split"):
        main(["--model_name_or_path", workspace["model"], "--train_file", workspace["train"], "--do_eval",
              "--output_dir", str(tmp_path), "--report_to", "none"])  # fmt: skip


# ---- recipes ---------------------------------------------------------------------------------------

RECIPES = os.path.join(paths.REPO, "configs", "train")
WIKIHOP_RECIPES = sorted(n for n in os.listdir(RECIPES) if n.startswith("wikihop-"))


@pytest.mark.parametrize("name", WIKIHOP_RECIPES)
def test_recipes(name, tmp_path, monkeypatch):
    """Every key is a flag of finetune_wikihop.py; the RoBERTa-base recipes have the MRA paper's Table 8
    settings (4096 tokens, global batch 32 on 1 or 8 GPUs, lr 5e-5, 15 epochs); the CPU recipe
    parses whole (the GPU ones ask for bf16, which TrainingArguments refuses without a GPU here)."""
    from transformers import TrainingArguments

    from hf_efficient_attn.tasks.common.args import ModelArguments, parse_arguments

    with open(os.path.join(RECIPES, name)) as f:
        recipe = json.load(f)
    types = (ModelArguments, WikiHopDataArguments, TrainingArguments)
    flags = {f.name for cls in types for f in dataclasses.fields(cls)}
    assert set(recipe) <= flags, sorted(set(recipe) - flags)
    if name.startswith("wikihop-roberta-base-4096"):
        processes = 8 if name.endswith("-8gpu.json") else 1
        batch = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] * processes
        settings = (recipe["max_seq_length"], batch, recipe["learning_rate"], recipe["num_train_epochs"])
        assert settings == (4096, 32, 5e-5, 15)
    else:
        assert recipe["use_cpu"]
        monkeypatch.chdir(tmp_path)
        train, dev = write_files("outputs/wikihop", train=1, dev=1, with_real=False)
        assert (train, dev) == (recipe["train_file"], recipe["validation_file"])
        os.makedirs(recipe["model_name_or_path"])  # the earlier recipe's output (a missing folder is an error)
        _, data_args, training_args = parse_arguments(types, [os.path.join(RECIPES, name)])
        assert data_args.max_seq_length == 2048 and training_args.max_steps == recipe["max_steps"]


# ---- each option does what it says; accumulation -----------------------------------------------------


def captured(workspace, monkeypatch, tmp_path, *extra):
    from training_fixtures import Captured, capture_trainer

    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        run(workspace, tmp_path / "captured", *extra)
    return caught.value.kwargs


def test_length_chunk_and_sample_options(workspace, monkeypatch, tmp_path):
    """--max_seq_length is the chunk length (documents chunked, not truncated), --max_chunks keeps
    the first chunks, --pad_to_max_length pads the batch to the length, --max_train/eval_samples
    keep the first examples; the collator's candidate positions are the tokenizer's [ent]s."""
    long_train = write_qangaroo_json(str(tmp_path / "long.json"), synthetic_examples(5, seed=11, **LONG))
    every = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--train_file", long_train,
                     "--max_seq_length", "96")  # fmt: skip
    chunks = [len(ids) for ids in every["train_dataset"]["input_ids"]]
    assert min(chunks) >= 3
    assert {len(c) for ids in every["train_dataset"]["input_ids"] for c in ids[:-1]} == {96}
    capped = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--train_file", long_train,
                      "--max_seq_length", "96", "--max_chunks", "2", "--pad_to_max_length", "--max_train_samples",
                      "3", "--max_eval_samples", "2")  # fmt: skip
    assert list(capped["train_dataset"]["input_ids"]) == [ids[:2] for ids in every["train_dataset"]["input_ids"][:3]]
    assert len(capped["eval_dataset"]) == 2
    batch = capped["data_collator"]([capped["train_dataset"][i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 2, 96)  # the chunks of long examples are full
    ent = batch["input_ids"].gather(2, batch["candidate_positions"][:, None].expand(-1, 2, -1))
    marker = AutoTokenizer.from_pretrained(workspace["model"]).vocab_size  # markers follow the vocabulary
    assert (ent >= marker).all()
    for flags, length in ((["--pad_to_max_length"], 128), ([], None)):  # short examples: one chunk of < 128 tokens
        short = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", *flags)
        features = [short["train_dataset"][i] for i in range(3)]
        longest = max(len(f["input_ids"][0]) for f in features)
        assert longest < 128 and {len(f["input_ids"]) for f in features} == {1}
        assert short["data_collator"](features)["input_ids"].shape == (3, 1, length or longest)


def test_gradient_accumulation_equals_one_large_batch(workspace, tmp_path):
    """Batch 8 equals 4 x 2 accumulated (dropout off): the same training loss and evaluation."""
    model = save_tiny_encoder(str(tmp_path / "no-dropout"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    common = ["--do_train", "--do_eval", "--max_steps", "2", "--max_train_samples", "16", "--max_eval_samples", "4",
              "--model_name_or_path", model, "--max_seq_length", "64"]  # fmt: skip
    large = run(workspace, tmp_path / "large", *common, "--per_device_train_batch_size", "8")
    accumulated = run(workspace, tmp_path / "acc", *common, "--per_device_train_batch_size", "4",
                      "--gradient_accumulation_steps", "2")  # fmt: skip
    assert accumulated["train_loss"] == pytest.approx(large["train_loss"], rel=1e-4)
    assert accumulated["eval_loss"] == pytest.approx(large["eval_loss"], rel=1e-4)


# ---- --padding_free -----------------------------------------------------------------------------------


def test_padding_free_packs_each_batch_and_keeps_logits_and_loss(workspace, monkeypatch, tmp_path):
    """--padding_free: each batch is one packed row of its examples' chunks (several per example
    here), whose logits and loss equal those of the same examples padded; it needs an attention
    method of this package (the tiny checkpoint saves none)."""
    long_train = write_qangaroo_json(str(tmp_path / "long.json"), synthetic_examples(4, seed=11, **LONG))
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--train_file", long_train, "--max_seq_length",
                       "96", "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}', "--padding_free")  # fmt: skip
    features = [trainer["train_dataset"][i] for i in range(4)]
    chunks = [chunk for f in features for chunk in f["input_ids"]]
    assert len(chunks) >= 12
    packed = trainer["data_collator"](features)
    assert packed["input_ids"].shape == (1, sum(map(len, chunks))) and len(packed["cu_seq_lens_q"]) == len(chunks) + 1
    padded = ChunkCollator(trainer["processing_class"].pad_token_id)(features)
    model = trainer["model"].eval()
    with torch.no_grad():
        packed_out, padded_out = model(**packed), model(**padded)
    torch.testing.assert_close(packed_out.logits, padded_out.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed_out.loss, padded_out.loss, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="--padding_free needs an attention method of this package"):
        run(workspace, tmp_path / "plain", "--do_train", "--padding_free")


@pytest.mark.parametrize("model_type", ["bert", "roberta", *default_tier(*KINDS)])
def test_padding_free_run_equals_the_padded_run(workspace, tmp_path, model_type):
    """Two steps of training and an evaluation, packed and padded (dropout off; 64-token chunks, so
    2 chunks per example): the same training loss, evaluation loss and accuracy; on BERT and every
    architecture of issue 55 (one of each kind in the default tier)."""
    model = save_tiny_encoder(str(tmp_path / "no-dropout"), model_type=model_type, **no_dropout(model_type))
    common = ["--do_train", "--do_eval", "--max_steps", "2", "--max_train_samples", "8", "--max_eval_samples", "4",
              "--model_name_or_path", model, "--max_seq_length", "64", "--attn_impl", "mra2"]  # fmt: skip
    padded = run(workspace, tmp_path / "padded", *common)
    packed = run(workspace, tmp_path / "packed", *common, "--padding_free")
    assert packed["train_loss"] == pytest.approx(padded["train_loss"], rel=1e-4)
    assert packed["eval_loss"] == pytest.approx(padded["eval_loss"], rel=1e-4)
    assert packed["eval_accuracy"] == padded["eval_accuracy"]
