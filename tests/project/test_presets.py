"""Method presets in configs/methods load and validate; bad presets get clear errors."""

import json

import paths
import pytest

import hf_efficient_attn as hea

PRESETS = sorted((paths.REPO / "configs" / "methods").glob("*.json"))


def test_there_are_presets():
    assert PRESETS


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_is_valid_and_fills_defaults(path):
    name, options = hea.load_preset(path)
    assert name in hea.list_methods()
    assert set(options) == set(hea.method_options(name))
    assert json.loads(path.read_text())["attn_config"].items() <= options.items()


def test_preset_errors_name_what_is_allowed(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"attn_impl": "mra2", "attn_config": {"blocks": 3}}))
    with pytest.raises(ValueError, match="its options are"):
        hea.load_preset(bad)
    bad.write_text(json.dumps({"method": "mra2"}))
    with pytest.raises(ValueError, match="attn_impl"):
        hea.load_preset(bad)
