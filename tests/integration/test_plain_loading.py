"""A saved variant runs as itself wherever the ecosystem loads it: plain Transformers auto classes,
pipelines and sentence-transformers after ``import hf_efficient_attn``; never silently as exact
attention in a process without the plugin."""

import copy
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T
from hub_fixtures import bert_tokenizer, forward, padded_batch, small_options, tiny_config

import hf_efficient_attn as hea

#: Options that give the methods their own learnable parameters where they have any.
WITH_PARAMETERS = {"conv_window": 3, "conv_kernel_size": 3}
HEADS = [
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForPreTraining",
    "AutoModelForSequenceClassification",
    "AutoModelForMultipleChoice",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
]


def save_variant(folder, method, head="AutoModelForMaskedLM"):
    """A tiny BERT variant with ``method`` saved by save_pretrained, with a tokenizer. The method's
    own parameters are moved away from their initial values, so that only loading them reproduces it."""
    torch.manual_seed(0)
    options = small_options(method, **WITH_PARAMETERS)
    # A large initializer_range makes attention peaked, so that every method differs from exact.
    config = tiny_config("bert", num_labels=2, initializer_range=0.5)  # 2: question answering's start and end
    model = getattr(hea, head).from_config(config, attn_impl=method, attn_config=options)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".efficient_attn." in name:
                param.add_(torch.randn_like(param))
    model.save_pretrained(folder)
    bert_tokenizer().save_pretrained(folder)
    return model


def outputs(model, inputs):
    """First output and last hidden state, padded rows' real tokens only compared by the caller."""
    return forward(model, inputs)


def assert_same_model(a, b, inputs, real):
    for x, y in zip(outputs(a, inputs), outputs(b, inputs)):
        torch.testing.assert_close(x[0], y[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x[1, :real], y[1, :real], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """A saved MLM variant of every method (folder, model as saved)."""
    root = tmp_path_factory.mktemp("variants")
    return {m: (root / m, save_variant(root / m, m)) for m in hea.list_methods()}


@pytest.mark.parametrize("method", hea.list_methods())
@pytest.mark.parametrize("head", ["AutoModel", "AutoModelForMaskedLM"])
def test_plain_auto_class_runs_the_saved_method(variants, method, head):
    folder, _ = variants[method]
    plain = getattr(T, head).from_pretrained(folder)
    plugin = getattr(hea, head).from_pretrained(folder)
    assert plain.config.attn_impl == method and plain.config.attn_config == plugin.config.attn_config
    inputs = padded_batch(plain.config, 48, 30)
    assert_same_model(plain, plugin, inputs, 30)
    if method != "softmax":  # and it is the method, not exact attention
        exact = getattr(T, head).from_pretrained(folder, attn_implementation="sdpa")
        assert not torch.allclose(outputs(exact, inputs)[1][0], outputs(plain, inputs)[1][0], atol=1e-4)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("method", ["mra2", "linformer"])
def test_every_head_class_loads_as_the_method(tmp_path, head, method):
    save_variant(tmp_path, method, head)
    plain, plugin = getattr(T, head).from_pretrained(tmp_path), getattr(hea, head).from_pretrained(tmp_path)
    assert type(plain) is type(plugin) and plain.config.attn_impl == method
    inputs = padded_batch(plain.config, 40, 25)
    if head in ("AutoModelForMultipleChoice", "AutoModelForQuestionAnswering"):
        if head == "AutoModelForMultipleChoice":
            inputs = {k: v[:, None] for k, v in inputs.items()}  # (batch, choices, length)
        with torch.no_grad():
            a, b = plain.eval()(**inputs), plugin.eval()(**inputs)
        key = "logits" if head == "AutoModelForMultipleChoice" else "start_logits"
        torch.testing.assert_close(a[key], b[key])
        return
    assert_same_model(plain, plugin, inputs, 25)


def test_saved_config_is_a_valid_transformers_config(variants):
    folder, model = variants["mra2"]
    saved = json.loads((folder / "config.json").read_text())
    assert saved["attn_implementation"] == "hf_efficient_attn:mra2"
    assert saved["attn_impl"] == "mra2" and saved["attn_config"] == model.config.attn_config
    config = T.BertConfig.from_pretrained(folder)
    assert type(T.AutoConfig.from_pretrained(folder)) is T.BertConfig
    assert config.attn_impl == "mra2" and config._attn_implementation == "hf_efficient_attn:mra2"


@pytest.mark.parametrize("method", ["mra2", "linformer", "yoso"])
def test_pipelines_run_the_saved_method(variants, method):
    folder, _ = variants[method]
    model = hea.AutoModelForMaskedLM.from_pretrained(folder).eval()
    text = "the cat was on the [MASK], and she was not"
    encoded = bert_tokenizer()(text, return_tensors="pt")
    with torch.no_grad():
        result = model(**encoded, output_hidden_states=True)
    features = T.pipeline("feature-extraction", model=str(folder))(text, return_tensors=True)
    torch.testing.assert_close(features[0], result.hidden_states[-1][0], atol=1e-5, rtol=1e-5)
    position = int((encoded["input_ids"][0] == bert_tokenizer().mask_token_id).nonzero())
    probabilities = result.logits[0, position].softmax(-1)
    for guess in T.pipeline("fill-mask", model=str(folder), top_k=5)(text):
        assert guess["score"] == pytest.approx(float(probabilities[guess["token"]]), abs=1e-6)


@pytest.mark.parametrize("method", ["mra2", "linformer", "yoso"])
def test_sentence_transformers_runs_the_saved_method(variants, method):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    folder, _ = variants[method]
    texts = ["the cat was on the mat and she was not " * 4, "she was not on the mat"]  # several MRA blocks
    embedded = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_tensor=True)
    model = hea.AutoModel.from_pretrained(folder).eval()
    encoded = bert_tokenizer()(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    weights = encoded["attention_mask"][..., None].float()
    torch.testing.assert_close(embedded, (hidden * weights).sum(1) / weights.sum(1), atol=1e-5, rtol=1e-5)


def test_naming_transformers_attention_runs_it_and_drops_the_saved_method(variants, tmp_path, caplog):
    folder, _ = variants["mra2"]
    with caplog.at_level(logging.WARNING, logger="hf_efficient_attn"):
        exact = T.AutoModel.from_pretrained(folder, attn_implementation="sdpa")
    assert "'mra2' saved in the config is not used" in caplog.text
    assert not hasattr(exact.config, "attn_impl")
    assert type(exact) is T.BertModel  # Transformers' own class, as unpatch_model leaves one
    exact.save_pretrained(tmp_path)
    assert "attn_impl" not in (tmp_path / "config.json").read_text()
    reference = hea.unpatch_model(hea.AutoModel.from_pretrained(folder))
    inputs = padded_batch(exact.config, 40, 25)
    assert_same_model(exact, reference, inputs, 25)


#: Runs in a fresh process where the plugin cannot be imported: every plain loading route refuses.
WITHOUT_PLUGIN = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_efficient_attn"] = None  # `import hf_efficient_attn` now raises ImportError
    import transformers
    folder = sys.argv[1]
    routes = {
        "AutoModel": lambda: transformers.AutoModel.from_pretrained(folder),
        "AutoModelForMaskedLM": lambda: transformers.AutoModelForMaskedLM.from_pretrained(folder),
        "pipeline": lambda: transformers.pipeline("fill-mask", model=folder),
        "sentence-transformers": lambda: __import__("sentence_transformers").SentenceTransformer(folder),
    }
    seen = {}
    for route, load in routes.items():
        try:
            load()
        except Exception as err:
            seen[route] = f"{type(err).__name__}: {err}"
        else:
            seen[route] = "LOADED"
    print(json.dumps(seen))
    """
)


# linformer (a method with parameters) in the slow tier: each route is a fresh process.
@pytest.mark.parametrize("method", ["mra2", pytest.param("linformer", marks=pytest.mark.slow)])
def test_without_the_plugin_every_route_refuses_naming_it(variants, method):
    """Seconds: a process where the plugin cannot be imported (this one has it) loads Transformers and
    sentence-transformers afresh; the four routes share it."""
    folder, _ = variants[method]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_PLUGIN, str(folder)], env=env, capture_output=True, text=True, timeout=600, cwd=folder
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert len(seen) == 4
    for route, error in seen.items():
        assert f'attn_implementation="hf_efficient_attn:{method}"` is not supported' in error, (route, error)


def test_deepcopy_of_a_loaded_variant_is_the_same_model(variants):
    folder, _ = variants["linformer"]
    model = T.AutoModel.from_pretrained(folder)
    inputs = padded_batch(model.config, 40, 25)
    assert_same_model(copy.deepcopy(model), model, inputs, 25)
