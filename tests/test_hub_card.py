"""The model card of a shared variant (issue 9): metadata that huggingface_hub's ``ModelCard.load``
parses, the naming convention, Trainer's metrics in the model-index, each method's paper and
limitations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import hf_efficient_attn as hea
from hf_efficient_attn.hub.card import PAPERS, read_metrics
from hf_efficient_attn.methods.base import AttentionMethod

from hub_fixtures import BERT_BASE, CASES, ROBERTA_BASE


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
    assert set(hea.list_methods()) <= set(PAPERS)
    for name in hea.list_methods():
        case = hub_variants[f"method-{name}"]
        text = (case.folder / "README.md").read_text()
        method = type(next(m for m in case.author.modules() if isinstance(m, AttentionMethod)))
        assert f"arXiv:{PAPERS[name].arxiv}" in text
        assert ("is not softmax attention" in text) == (not method.approximates_softmax), name
        assert ("draws random samples" in text) == method.samples, name
        assert ("depend on the padded length" in text) == (not method.padding_invariant), name
        assert ("sized by the position table" in text) == method.length_bound, name
