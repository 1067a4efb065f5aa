"""Folders saved by an earlier release load as themselves: tests/integration/fixtures/saved_0.2.0/ holds tiny
variants saved by hf_efficient_attn 0.2.0 (index.json: which release, auto class, method and
options), with the outputs that release computed on a padded batch. Today's code, through the
package's auto classes and through plain Transformers, must rebuild the same method with the same
options and reproduce those outputs, and saving again must write the same config."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.integration.patching import is_patched

SAVED = Path(__file__).parent / "fixtures" / "saved_0.2.0"
INDEX = json.loads((SAVED / "index.json").read_text())["folders"]


@pytest.mark.parametrize("route", ["hf_efficient_attn", "transformers"])
@pytest.mark.parametrize("name", sorted(INDEX))
def test_a_folder_saved_by_the_last_release_loads_as_itself(name, route):
    saved = INDEX[name]
    folder = SAVED / name
    model = getattr(hea if route == "hf_efficient_attn" else transformers, saved["auto_class"]).from_pretrained(folder)
    model.eval()
    assert is_patched(model)
    assert (model.config.attn_impl, model.config.attn_config) == (saved["attn_impl"], saved["attn_config"])
    methods = method_modules(model)
    assert methods and {m.name for m in methods} == {saved["attn_impl"]}
    assert all(m.options.to_dict() == saved["attn_config"] for m in methods)
    expected = load_file(str(folder / "expected_outputs.safetensors"))
    with torch.no_grad():
        out = model(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"])
    real = expected["attention_mask"].bool()
    if saved["output"] == "logits" and out.logits.dim() == 2:  # a classifier: one row per sequence
        real = torch.ones(len(real), dtype=torch.bool)
    key = saved["output"]
    torch.testing.assert_close(out[key][real], expected[key][real], atol=1e-5, rtol=1e-4)


def test_saving_again_writes_the_same_config(tmp_path):
    for name, saved in INDEX.items():
        model = getattr(hea, saved["auto_class"]).from_pretrained(SAVED / name)
        model.save_pretrained(tmp_path / name)
        before, after = (json.loads((f / "config.json").read_text()) for f in (SAVED / name, tmp_path / name))
        before.pop("transformers_version"), after.pop("transformers_version")
        assert after == before, name
