"""Uploading a shared variant and push_to_hub.py (issue 9): ``HfApi`` mocked, a token required
unless --dry_run, clear errors on bad input that write nothing."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from hub_fixtures import BERT_BASE, REPO, ROBERTA_BASE, bert_tokenizer, tiny_config
from huggingface_hub import ModelCard

import hf_efficient_attn as hea
from hf_efficient_attn.hub import cli, push, push_variant
from hf_efficient_attn.hub.export import resolve_repo_id, variant_name


class FakeHfApi:
    """Records the calls ``upload_variant`` makes; ``upload_folder`` snapshots the folder's bytes."""

    calls: list = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        files = {p.name: p.read_bytes() for p in Path(kwargs["folder_path"]).iterdir()}
        self.calls.append(("upload_folder", kwargs, files))
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def test_push_uploads_the_dry_run_folder_through_huggingface_hub(hub_variants, tmp_path, monkeypatch):
    """With HfApi mocked: create_repo / create_branch / upload_folder get the repo id, private,
    revision and commit message, and the uploaded folder is byte for byte the dry-run folder.
    Not covered (network): authentication, the Hub's card validation and the transfer itself."""
    validated = []
    monkeypatch.setattr(push, "HfApi", FakeHfApi)
    monkeypatch.setattr(push, "get_token", lambda: "hf_test")
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: validated.append(card.data.model_name))
    FakeHfApi.calls = []
    src = str(Path(hub_variants["bert-linformer-trained"].author.name_or_path))
    options = dict(base_model=BERT_BASE, license="apache-2.0", results_file=f"{src}/eval_results.json", dataset_name="glue")
    url = push_variant(src, "someone", private=True, revision="v1", commit_message="first upload", **options)
    repo_id = "someone/bert-base-uncased-linformer-128"
    assert url == f"https://huggingface.co/{repo_id}/commit/abc"
    assert validated == ["bert-base-uncased-linformer-128"]
    (_, created, create_kwargs), (_, branched, branch_kwargs), (_, upload_kwargs, uploaded) = FakeHfApi.calls
    assert created == branched == upload_kwargs["repo_id"] == repo_id
    assert create_kwargs == {"private": True, "exist_ok": True, "repo_type": "model"}
    assert branch_kwargs == {"branch": "v1", "exist_ok": True}
    assert (upload_kwargs["revision"], upload_kwargs["commit_message"], upload_kwargs["repo_type"]) == (
        "v1",
        "first upload",
        "model",
    )
    assert not Path(upload_kwargs["folder_path"]).exists()  # the temporary folder is removed afterwards
    dry = Path(push_variant(src, "someone", dry_run=tmp_path / "dry", **options))
    assert uploaded == {p.name: p.read_bytes() for p in dry.iterdir()}


def test_the_scripts_upload_flags_reach_the_hub(tmp_path, monkeypatch):
    """push_to_hub.py's --private, --revision and --commit_message reach create_repo / create_branch /
    upload_folder (HfApi mocked), the --model_dir variant goes to --repo_id; with --dry_run nothing is
    uploaded and the folder is written there."""
    monkeypatch.setattr(push, "HfApi", FakeHfApi)
    monkeypatch.setattr(push, "get_token", lambda: "hf_test")
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: None)
    torch.manual_seed(0)
    model = hea.patch_model(T.BertForMaskedLM(tiny_config("bert")), "performer", {"num_features": 16})
    model.save_pretrained(tmp_path / "variant")
    bert_tokenizer().save_pretrained(tmp_path / "variant")
    flags = ["--model_dir", str(tmp_path / "variant"), "--repo_id", "someone/tiny", "--license", "mit"]
    FakeHfApi.calls = []
    cli.main([*flags, "--private", "--revision", "v2", "--commit_message", "my message"])
    (_, created, create_kwargs), (_, branched, branch_kwargs), (_, upload_kwargs, uploaded) = FakeHfApi.calls
    assert created == branched == upload_kwargs["repo_id"] == "someone/tiny" and create_kwargs["private"] is True
    assert branch_kwargs["branch"] == upload_kwargs["revision"] == "v2"
    assert upload_kwargs["commit_message"] == "my message"
    assert json.loads(uploaded["config.json"])["attn_config"]["num_features"] == 16

    FakeHfApi.calls = []
    assert cli.main([*flags, "--dry_run", str(tmp_path / "dry")]) == str(tmp_path / "dry")
    assert FakeHfApi.calls == [] and (tmp_path / "dry" / "model.safetensors").is_file()


def test_push_needs_a_token_unless_dry_run(monkeypatch, tmp_path):
    monkeypatch.setattr(push, "get_token", lambda: None)
    with pytest.raises(ValueError, match="HF_TOKEN"):
        push_variant(str(tmp_path), "someone/x")


def test_bad_input_gets_clear_errors(hub_variants, tmp_path):
    src = hub_variants["roberta-performer-converted"].author.name_or_path  # a plain checkpoint
    ok = dict(base_model=ROBERTA_BASE, license="mit")
    with pytest.raises(ValueError, match="plain checkpoint.*--attn_impl.*mra2"):
        push_variant(src, "someone", dry_run=tmp_path / "a", **ok)
    with pytest.raises(ValueError, match="unknown attention method"):
        push_variant(src, "someone", attn_impl="fast", dry_run=tmp_path / "b", **ok)
    with pytest.raises(ValueError, match="give --repo_id someone/NAME or --base_model"):  # nothing to name it after
        push_variant(src, "someone", attn_impl="vmean", license="mit", dry_run=tmp_path / "d")
    with pytest.raises(ValueError, match="--dataset_name"):
        results = Path(hub_variants["bert-linformer-trained"].author.name_or_path) / "eval_results.json"
        push_variant(src, "someone", attn_impl="vmean", results_file=str(results), dry_run=tmp_path / "e", **ok)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        push_variant(src, "someone", attn_impl="vmean", dry_run=tmp_path / "full", **ok)
    with pytest.raises(ValueError, match="Repo id"):
        push_variant(src, "someone/bad name", attn_impl="vmean", dry_run=tmp_path / "f", **ok)
    T.RobertaForMaskedLM(tiny_config("roberta")).save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(ValueError, match="--tokenizer_name"):
        push_variant(str(tmp_path / "no-tokenizer"), "someone", attn_impl="vmean", dry_run=tmp_path / "g", **ok)
    with pytest.raises(ValueError, match="--attn_config must be a JSON object"):
        cli.main(["--model_dir", src, "--repo_id", "someone", "--attn_impl", "mra2", "--attn_config", "[1]"])
    assert not any((tmp_path / d).exists() for d in "abdefg")  # nothing written on bad input


def test_variant_name_and_repo_id():
    assert variant_name("FacebookAI/roberta-base", "mra2", 4096) == "roberta-base-mra2-4096"
    assert variant_name("roberta-base", "mra2_s", 4096, "sst2") == "roberta-base-mra2_s-4096-sst2"
    assert resolve_repo_id("someone", "roberta-base-mra2-4096") == "someone/roberta-base-mra2-4096"
    assert resolve_repo_id("org/my-name", "ignored") == "org/my-name"


def test_script_help_names_the_upload_flags(monkeypatch, capsys):
    """The script's --help, run here (tests/project/test_cli_startup.py runs every script's in a fresh process)."""
    monkeypatch.setattr(sys, "argv", ["push_to_hub.py", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "push_to_hub.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--dry_run" in out and "--results_file" in out
