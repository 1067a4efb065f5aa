"""The model card of a shared variant (issue 9): metadata that huggingface_hub's ``ModelCard.load``
parses, the naming convention, Trainer's metrics in the model-index and the results table, the
architecture, parameter and training lines, each method's paper and limitations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hub_fixtures import BERT_BASE, CASES, ROBERTA_BASE
from huggingface_hub import ModelCard

import hf_efficient_attn as hea
from hf_efficient_attn.hub import card
from hf_efficient_attn.hub.card import measured_stage, read_metrics, stage_lines
from hf_efficient_attn.integration.bridge import method_modules


@pytest.mark.parametrize("case", CASES)
def test_card_metadata_parses_with_huggingface_hub(hub_variants, case):
    shared_case = hub_variants[case]
    card = ModelCard.load(shared_case.folder / "README.md")
    config = json.loads((shared_case.folder / "config.json").read_text())
    repo_id = re.search(r'from_pretrained\("([^"]+)"', card.text).group(1)
    assert card.data.library_name == "transformers"
    assert card.data.base_model == (BERT_BASE if config["model_type"] == "bert" else ROBERTA_BASE)
    assert card.data.license in ("apache-2.0", "mit")
    assert (
        card.data.pipeline_tag
        == {"AutoModelForMaskedLM": "fill-mask", "AutoModelForSequenceClassification": "text-classification"}[
            shared_case.auto_class
        ]
    )
    assert config["attn_impl"] in card.data.tags and "hf_efficient_attn" in card.data.tags
    assert json.dumps(config["attn_config"], indent=2, sort_keys=True) in card.text
    assert f'hea.{shared_case.auto_class}.from_pretrained("{repo_id}")' in card.text
    assert f'{shared_case.auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)' in card.text
    offset = 2 if config["model_type"] == "roberta" else 0  # RoBERTa's position ids start after the padding id
    assert f"Maximum input length: **{config['max_position_embeddings'] - offset} tokens**" in card.text


def test_naming_convention_names_repos_given_only_a_namespace(hub_variants):
    assert "someone/bert-base-uncased-mra2-128" in (hub_variants[CASES[0]].folder / "README.md").read_text()
    assert "someone/roberta-base-mra2-4096" in (hub_variants[CASES[3]].folder / "README.md").read_text()
    assert "someone/bert-base-uncased-linformer-128-sst2" in (hub_variants[CASES[2]].folder / "README.md").read_text()
    assert "someone/roberta-performer" in (hub_variants[CASES[1]].folder / "README.md").read_text()  # a full id stays


def test_card_model_index_carries_the_trainer_metrics(hub_variants):
    """The Linformer card's model-index holds eval_results.json's quality metrics (runtime etc. left out)."""
    case = hub_variants["bert-linformer-trained"]
    run_dir = Path(case.author.name_or_path)
    results = json.loads((run_dir / "eval_results.json").read_text())
    state = json.loads((run_dir / "trainer_state.json").read_text())
    card = ModelCard.load(case.folder / "README.md")
    got = {(r.metric_type, r.metric_value) for r in card.data.eval_results}
    assert got == {("accuracy", results["eval_accuracy"]), ("loss", results["eval_loss"])}
    for result in card.data.eval_results:
        assert (result.task_type, result.dataset_type, result.dataset_config, result.dataset_split) == (
            "text-classification",
            "glue",
            "sst2",
            "validation",
        )
    assert card.data.datasets == ["glue"]
    assert f"{state['global_step']} steps" in card.text
    assert "newly initialised" not in card.text  # trained: the untrained-parameters warning is gone
    assert "newly initialised" in (hub_variants["method-linformer"].folder / "README.md").read_text()


def test_read_metrics_follows_the_trainer_files(tmp_path):
    (tmp_path / "all_results.json").write_text(
        json.dumps(
            {
                "epoch": 3.0,
                "train_loss": 0.5,
                "train_runtime": 9.0,
                "eval_accuracy": 0.75,
                "eval_samples": 8,
                "eval_runtime": 1.0,
                "eval_samples_per_second": 8.0,
                "test_f1": 0.5,
                "total_flos": 12.0,
                "perplexity": 7.5,
            }
        )
    )
    assert sorted(read_metrics(tmp_path / "all_results.json")) == [
        ("test", "f1", 0.5),
        ("validation", "accuracy", 0.75),
        ("validation", "perplexity", 7.5),
    ]
    (tmp_path / "test_results.json").write_text(json.dumps({"perplexity": 3.0, "test_runtime": 1.0}))
    assert read_metrics(tmp_path / "test_results.json") == [("test", "perplexity", 3.0)]
    (tmp_path / "train_results.json").write_text(json.dumps({"train_loss": 0.5, "epoch": 1.0}))
    with pytest.raises(ValueError, match="no evaluation metric"):
        read_metrics(tmp_path / "train_results.json")
    (tmp_path / "eval_results.json").write_text("[0.5]")
    with pytest.raises(ValueError, match="JSON object"):
        read_metrics(tmp_path / "eval_results.json")


def test_every_method_has_its_paper_and_limitations_follow_its_properties(hub_variants):
    for name in hea.list_methods():
        case = hub_variants[f"method-{name}"]
        text = (case.folder / "README.md").read_text()
        method = type(method_modules(case.author)[0])
        assert f"arXiv:{method.paper.arxiv}" in text and method.paper.title in text
        assert ("is not softmax attention" in text) == (not method.approximates_softmax), name
        assert ("draws random samples" in text) == method.samples, name
        assert ("depend on the padded length" in text) == (not method.padding_invariant), name
        assert ("sized by the position table" in text) == method.length_bound, name


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The cells of the rows of the table under ``header`` (a markdown table line)."""
    lines = text.splitlines()
    start = lines.index(header) + 2  # the header, then the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_card_tables_and_lines_carry_the_runs_values(hub_variants):
    """The results table holds each evaluation metric of eval_results.json under its name and split;
    the architecture, length, parameter and training lines hold the model's and trainer_state's values
    (all read here from the files themselves)."""
    case = hub_variants["bert-linformer-trained"]
    run_dir = Path(case.author.name_or_path)
    results = json.loads((run_dir / "eval_results.json").read_text())
    state = json.loads((run_dir / "trainer_state.json").read_text())
    config = json.loads((case.folder / "config.json").read_text())
    text = ModelCard.load(case.folder / "README.md").text

    rows = markdown_table(text, "| metric | split | value |")
    expected = {"accuracy": results["eval_accuracy"], "loss": results["eval_loss"]}
    assert sorted(name for name, _, _ in rows) == sorted(expected)
    for name, split, value in rows:
        assert split == "validation" and float(value) == pytest.approx(expected[name], rel=1e-3), (name, value)
    assert "On `glue` (`sst2`), from `eval_results.json`:" in text

    assert (
        f"Architecture: `BertForSequenceClassification` (bert), {config['num_hidden_layers']} layers, hidden size "
        f"{config['hidden_size']}, {config['num_attention_heads']} heads." in text
    )
    assert f"(position table of {config['max_position_embeddings']} entries)" in text
    learned = sum(p.numel() for n, p in case.author.named_parameters() if ".efficient_attn." in n)
    assert learned > 0 and f"It adds {learned} learnable parameters" in text
    last = [entry for entry in state["log_history"] if "loss" in entry][-1]
    assert f"{state['global_step']} steps ({state['epoch']:.4g} epochs), {state['train_batch_size']} examples" in text
    assert f"Last logged training loss: {last['loss']:.4g} (step {last['step']})." in text


def test_card_of_a_results_file_without_the_hub_fixtures(tmp_path):
    """build_model_card alone (fast): metadata, model-index, results table and training lines hold
    the values of the files given, each under its own name, split and dataset."""
    import transformers as T
    from hub_fixtures import tiny_config

    from hf_efficient_attn.hub.card import build_model_card

    model = hea.patch_model(T.RobertaForSequenceClassification(tiny_config("roberta", num_labels=3)), "linformer",
                            {"k": 8})  # fmt: skip
    results = {"eval_accuracy": 0.6875, "eval_f1": 0.4321, "eval_loss": 0.9123, "eval_runtime": 1.5,
               "eval_samples": 16, "epoch": 2.0, "test_accuracy": 0.5}  # fmt: skip
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    state = {"global_step": 12, "epoch": 2.0, "train_batch_size": 4,
             "log_history": [{"loss": 1.25, "step": 6}, {"loss": 0.75, "step": 12}]}  # fmt: skip
    card = build_model_card(model, repo_id="me/tiny-rte", base_model=ROBERTA_BASE, license="mit",
                            results_file=tmp_path / "all_results.json", dataset_name="nyu-mll/glue",
                            dataset_config_name="rte", trainer_state=state)  # fmt: skip
    card = ModelCard(str(card))  # what the Hub parses
    data = card.data
    assert (data.base_model, data.license, data.model_name) == (ROBERTA_BASE, "mit", "tiny-rte")
    assert data.pipeline_tag == "text-classification" and data.datasets == ["nyu-mll/glue"]
    assert set(data.tags) >= {"hf_efficient_attn", "linformer", "roberta"}
    expected = {("accuracy", "validation"): 0.6875, ("f1", "validation"): 0.4321, ("loss", "validation"): 0.9123,
                ("accuracy", "test"): 0.5}  # fmt: skip
    got = {(r.metric_type, r.dataset_split): r.metric_value for r in data.eval_results}
    assert got == expected
    assert {(r.dataset_type, r.dataset_config, r.task_type) for r in data.eval_results} == {
        ("nyu-mll/glue", "rte", "text-classification")}  # fmt: skip
    rows = markdown_table(card.text, "| metric | split | value |")
    assert {(name, split): float(value) for name, split, value in rows} == expected
    assert "12 steps (2 epochs), 4 examples per device per step" in card.text
    assert "Last logged training loss: 0.75 (step 12)." in card.text
    assert f"Maximum input length: **{model.config.max_position_embeddings - 2} tokens**" in card.text
    config = model.config
    assert (f"Architecture: `RobertaForSequenceClassification` (roberta), {config.num_hidden_layers} layers, hidden "
            f"size {config.hidden_size}, {config.num_attention_heads} heads.") in card.text  # fmt: skip
    # Linformer's default layerwise sharing: one k x length projection for E and F of every layer.
    assert f"It adds {8 * model.config.max_position_embeddings} learnable parameters" in card.text


def test_stage_line_tells_steps_batch_epochs_and_training_examples_apart():
    """A run of 10 steps over a training set of one example, one example a step, was written "10 steps
    (10 epochs) of 1 examples", which reads as a data set of one example seen ten times each step or as
    nothing at all: the line says each number with what it counts; only the files trained and evaluated
    on are named (a --test_file is only predicted on)."""
    stage = {"stage": "masked-LM pretraining", "script": "pretrain_mlm.py", "attn_impl": "mra2", "steps": 10,
             "epochs": 10.0, "global_batch_size": 1, "train_samples": 1, "max_seq_length": 4096, "learning_rate": 5e-5,
             "data": {"files": {"train_file": "notes.txt", "test_file": "later.txt"}}, "eval": {"eval_loss": 2.5}}  # fmt: skip
    (line,) = stage_lines({"stages": [stage]})
    assert "`pretrain_mlm.py`, attention `mra2`): 10 steps of 1 example (10 epochs over 1 training example), " in line
    assert "each example up to 4096 tokens" in line and "later.txt" not in line
    assert "on local files (`notes.txt` for training, a part of it held out for evaluation; not on the Hub)" in line
    larger = {**stage, "steps": 12, "epochs": 0.5, "global_batch_size": 8, "train_samples": 192, "eval": {}}
    (line,) = stage_lines({"stages": [larger]})
    assert "12 steps of 8 examples (0.5 epochs over 192 training examples)" in line
    assert "on local files (`notes.txt` for training; not on the Hub)" in line  # no evaluation, no held-out part


def test_a_stage_with_exact_attention_says_exact():
    """provenance.json records exact attention as ``attn_impl: null`` (the config field unset): each
    stage's line names it ``exact``, for a conversion and for a training stage alike."""
    conversion = {"stage": "conversion", "script": "convert_to_long.py", "attn_impl": None, "model": "roberta-base",
                  "tokens_before": 512, "tokens_after": 4096}  # fmt: skip
    training = {"stage": "fine-tuning", "script": "finetune_glue.py", "attn_impl": None, "steps": 2, "epochs": 1.0,
                "global_batch_size": 2, "max_seq_length": 128, "learning_rate": 2e-5, "data": {}}  # fmt: skip
    for line in stage_lines({"stages": [conversion, training]}):
        assert "attention `exact`" in line and "None" not in line


def test_each_split_is_measured_on_its_own_files():
    """The model-index names, for each split's metrics, the local files that split reads (MNLI's
    mismatched file beside the matched one), and the held-out part of the training file for a split
    that has none of its own."""
    files = {"train_file": "train.csv", "validation_file": "dev.csv", "validation_mismatched_file": "dev_mm.csv",
             "test_file": "test.csv", "test_mismatched_file": "test_mm.csv"}  # fmt: skip
    metrics = [("validation", "accuracy", 0.5), ("test", "accuracy", 0.25)]
    validation, test = card.eval_results(metrics, "text-classification", {"files": files})
    assert validation.dataset_args == {"data_files": ["dev.csv", "dev_mm.csv"]}
    assert test.dataset_args == {"data_files": ["test.csv", "test_mm.csv"]}
    (held_out,) = card.eval_results(metrics[1:], "text-classification", {"files": {"train_file": "train.csv"}})
    assert held_out.dataset_args is None and "train.csv, held-out part" in held_out.dataset_name


def test_results_are_matched_to_the_last_stage_that_recorded_them(tmp_path):
    """A results file is described by the data of the last training stage whose recorded evaluation it
    holds (an earlier stage that recorded a part of it, or a later one that recorded other values,
    is not the one that wrote it); none matching: None."""
    results = tmp_path / "all_results.json"
    results.write_text(json.dumps({"eval_accuracy": 0.5, "eval_loss": 1.0, "train_loss": 2.0}))
    stages = [
        {"eval": {"eval_accuracy": 0.5}, "data": {"train_file": "first.csv"}},
        {"eval": {"eval_accuracy": 0.5, "eval_loss": 1.0}, "data": {"train_file": "second.csv"}},
        {"eval": {"eval_accuracy": 0.7}, "data": {"train_file": "third.csv"}},
        {"data": {"train_file": "unevaluated.csv"}},
    ]
    assert measured_stage(results, {"stages": stages})["data"] == {"train_file": "second.csv"}
    assert measured_stage(results, {"stages": stages[2:]}) is None


@pytest.mark.parametrize("number, words", [(0, "0 steps"), (1, "1 step"), (2, "2 steps")])
def test_counts_on_the_card_are_singular_for_one_only(number, words):
    assert card._count(number, "step") == words
