"""Keyword arguments of the public Python API that no other test pins down: each one changes what the
call does (an ignored or misrouted value fails here). Loading is spied on where Transformers itself
would need the Hub: what ``AutoConfig.from_pretrained`` and the Transformers auto class receive."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import transformers as T
from hub_fixtures import bert_tokenizer
from tiny import REAL, batch, hidden, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.hub.card import DEFAULT_TEMPLATE, build_model_card
from hf_efficient_attn.hub.export import prepare_upload
from hf_efficient_attn.integration import auto
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, get_method_class
from hf_efficient_attn.serving import onnx as serving

# ------------------------------------------------------------------- hea.AutoModel.from_pretrained


@pytest.fixture
def loading(monkeypatch):
    """``hea.AutoModel.from_pretrained`` with the config resolution and the weights' loader spied on:
    the keyword arguments each received (the config is a tiny BERT's)."""
    seen = SimpleNamespace(config=None, model=None)

    def config_from_pretrained(path, return_unused_kwargs, **kwargs):
        seen.config = dict(path=path, **kwargs)
        return tiny_config("bert"), {}

    class Weights:
        @staticmethod
        def from_pretrained(path, *args, **kwargs):
            seen.model = dict(path=path, **kwargs)
            return "model"

    monkeypatch.setattr(auto.AutoConfig, "from_pretrained", config_from_pretrained)
    monkeypatch.setattr(hea.AutoModel, "_auto_class", Weights)
    return seen


HUB_KEYWORDS = dict(
    revision="v2.1",
    cache_dir="/tmp/elsewhere",
    force_download=True,
    local_files_only=True,
    proxies={"https": "proxy:1"},
    subfolder="encoder",
    token="hf_secret",
)


@pytest.mark.parametrize("keyword", list(HUB_KEYWORDS))
def test_hub_keywords_reach_the_config_and_the_weights(loading, keyword):
    """A hub option (``revision=``, ``subfolder=``, ...) locates both files: config and weights come
    from the same revision / folder / cache."""
    hea.AutoModel.from_pretrained("someone/model", attn_impl="mra2", **{keyword: HUB_KEYWORDS[keyword]})
    assert loading.config["path"] == loading.model["path"] == "someone/model"
    assert loading.config[keyword] == loading.model[keyword] == HUB_KEYWORDS[keyword]


@pytest.mark.parametrize(
    "keyword, value", [("dtype", torch.bfloat16), ("torch_dtype", torch.float16), ("quantization_config", {"load_in_8bit": True})]
)
def test_model_keywords_reach_the_weights_only(loading, keyword, value):
    hea.AutoModel.from_pretrained("someone/model", attn_impl="mra2", **{keyword: value})
    assert loading.model[keyword] == value and keyword not in loading.config


def test_attn_implementation_and_config_keywords(loading):
    """``attn_implementation=`` naming a method loads it (and reaches the loader); ``config=`` replaces
    the checkpoint's config (which is then not read)."""
    hea.AutoModel.from_pretrained("someone/model", attn_implementation="yoso")
    assert loading.model["attn_implementation"] == "yoso" and loading.model["config"].attn_impl == "yoso"
    loading.config = None
    given = tiny_config("bert", hidden_dropout_prob=0.3)
    hea.AutoModel.from_pretrained("someone/model", config=given, attn_impl="mra2")
    assert loading.config is None
    assert loading.model["config"].hidden_dropout_prob == 0.3 and loading.model["config"].attn_impl == "mra2"


# ----------------------------------------------------------------------- from_config, patch_model


def test_from_config_keywords():
    """from_config builds the given config's model with attn_impl and attn_config; attn_implementation
    may name the method instead."""
    model = hea.AutoModel.from_config(tiny_config("bert", num_hidden_layers=3), attn_impl="yoso",
                                      attn_config={"num_hash": 4})  # fmt: skip
    assert len(model.encoder.layer) == 3 and model.config.attn_impl == "yoso"
    assert [m.options.num_hash for m in method_modules(model)] == [4] * 3
    named = hea.AutoModel.from_config(tiny_config("bert"), attn_implementation="performer")
    assert named.config.attn_impl == "performer" and {m.name for m in method_modules(named)} == {"performer"}


def test_patch_model_attn_impl_and_attn_config():
    model = hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "yoso", {"num_hash": 4})
    assert {m.name for m in method_modules(model)} == {"yoso"}
    assert [m.options.num_hash for m in method_modules(model)] == [4, 4] and model.config.attn_config["num_hash"] == 4


def test_patch_model_takes_a_resolved_choice():
    """A MethodChoice is used as it is (the options saved in the config do not update it); with
    attn_config beside it, ValueError."""
    saved = hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "yoso", {"num_hash": 4, "hash_code_len": 6})
    model = hea.patch_model(saved, MethodChoice.of("yoso", {"num_hash": 2}))
    assert [(m.options.num_hash, m.options.hash_code_len) for m in method_modules(model)] == [(2, 9)] * 2
    assert model.config.attn_config == MethodChoice.of("yoso", {"num_hash": 2}).attn_config
    with pytest.raises(ValueError, match="not with a resolved MethodChoice"):
        hea.patch_model(model, MethodChoice.of("yoso"), {"num_hash": 4})


def test_unpatch_restore_chooses_the_attention_that_runs():
    model = T.AutoModel.from_config(tiny_config("bert"), attn_implementation="eager")
    hea.unpatch_model(hea.patch_model(model, "mra2"), restore="sdpa")
    assert model.config._attn_implementation == "sdpa"
    hea.unpatch_model(hea.patch_model(model, "mra2"))  # by default: the implementation it had before
    assert model.config._attn_implementation == "sdpa"
    hea.unpatch_model(hea.patch_model(model, "mra2"), restore="eager")
    assert model.config._attn_implementation == "eager"


# ---------------------------------------------------------------------- efficient_attention, masks


@pytest.mark.parametrize("name", ["linformer", "mra2", "performer", "yoso"])
def test_method_options_are_those_of_the_method_named(name):
    """Each method's options dataclass, read field by field (the methods' options differ): default and help."""
    fields = dataclasses.fields(get_method_class(name).options_cls)
    options = hea.method_options(name)
    assert list(options) == [f.name for f in fields]
    assert [(o.default, o.help) for o in options.values()] == [(f.default, f.metadata["help"]) for f in fields]


def test_method_and_options_of_efficient_attention():
    """At n = 256 MRA-2's default budget (4 of 8 blocks per row) approximates; ``method="softmax"`` is
    exact, and MRA-2 with every block per row (an option passed as a keyword) is exact too."""
    q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))
    exact = softmax_reference(q, k, v)
    torch.testing.assert_close(hea.efficient_attention(q, k, v, method="softmax"), exact, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hea.efficient_attention(q, k, v, method="mra2"), exact, atol=1e-3)
    full = hea.efficient_attention(q, k, v, method="mra2", block_per_row=8)
    torch.testing.assert_close(full, exact, atol=1e-4, rtol=1e-4)


def test_a_4d_additive_float_mask_is_read_as_zero_for_real_tokens():
    """Some callers hand the model an additive (batch, 1, 1, n) float mask (0 = attend, the dtype's
    minimum = padding): the bridge reads it as the padding mask it is, so the outputs equal those of
    the 0/1 attention_mask (which padding changes)."""
    model = hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "softmax").eval()
    ids, mask = batch()
    additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    expected = hidden(model, ids, mask)
    assert not torch.allclose(hidden(model, ids, torch.ones_like(mask))[1, :REAL], expected[1, :REAL])
    got = hidden(model, ids, additive)
    torch.testing.assert_close(got[1, :REAL], expected[1, :REAL])
    torch.testing.assert_close(got[0], expected[0])


# ------------------------------------------------------------------------------- hub and serving


def test_model_card_template_path(tmp_path):
    model = hea.patch_model(T.BertModel(tiny_config("bert")), "vmean")
    template = tmp_path / "card.md"
    template.write_text("---\n{{ card_data }}\n---\n\nOur own card for {{ repo_id }} ({{ attn_impl }}).\n")
    card = build_model_card(model, repo_id="me/x", base_model=None, license="mit", template_path=template)
    assert "Our own card for me/x (vmean)." in card.text
    assert "Our own card" not in DEFAULT_TEMPLATE.read_text()


def test_prepare_upload_tokenizer_name(tmp_path):
    """A model folder without a tokenizer takes the one of ``tokenizer_name``."""
    model = hea.patch_model(T.BertModel(tiny_config("bert", vocab_size=len(bert_tokenizer()))), "vmean")
    model.save_pretrained(tmp_path / "model")
    bert_tokenizer().save_pretrained(tmp_path / "tokenizer")
    prepare_upload(str(tmp_path / "model"), tmp_path / "up", repo_id="me/x", tokenizer_name=str(tmp_path / "tokenizer"),
                   license="mit")  # fmt: skip
    text = "the cat was on the mat"
    assert T.AutoTokenizer.from_pretrained(tmp_path / "up")(text)["input_ids"] == bert_tokenizer()(text)["input_ids"]


@pytest.fixture
def variant(tmp_path):
    torch.manual_seed(0)
    model = hea.AutoModelForMaskedLM.from_config(tiny_config("bert", vocab_size=len(bert_tokenizer())),
                                                 attn_impl="mra2", attn_config={"block_per_row": 1})  # fmt: skip
    model.save_pretrained(tmp_path / "variant")
    bert_tokenizer().save_pretrained(tmp_path / "variant")
    return model.eval(), tmp_path / "variant"


def test_export_onnx_keywords_reach_the_exporter(variant, tmp_path, monkeypatch):
    """model, path, seq_len (the length of the example inputs) and opset reach ``torch.onnx.export``."""
    exported = []
    monkeypatch.setattr(serving.torch.onnx, "export", lambda model, args, path, **kwargs: exported.append((model, path, kwargs)))
    model, _ = variant
    serving.export_onnx(model, tmp_path / "m.onnx", 48, opset=17)
    ((got, path, kwargs),) = exported
    assert got is model and path == str(tmp_path / "m.onnx") and kwargs["opset_version"] == 17
    assert kwargs["kwargs"]["input_ids"].shape[1] == 48


def test_export_folder_keywords(variant, tmp_path, monkeypatch):
    """model_dir's model is exported at seq_len with opset into output_dir and checked at seq_len and
    at each of check_lengths, each check with its own batch (seed)."""
    exports, checks = [], []
    monkeypatch.setattr(serving, "export_onnx", lambda model, path, n, opset: exports.append((model, path, n, opset)))
    monkeypatch.setattr(
        serving, "validate", lambda model, path, n, seed: checks.append((path, n, seed)) or serving.Validation(n, {"logits": 0.0})
    )
    model, folder = variant
    serving.export_folder(str(folder), tmp_path / "out", seq_len=40, check_lengths=[20, 90], opset=18)
    ((exported, path, n, opset),) = exports
    assert exported.config.attn_config == model.config.attn_config and path == tmp_path / "out" / serving.ONNX_FILE
    assert (n, opset) == (40, 18)
    assert checks == [(path, 40, 0), (path, 20, 1), (path, 90, 2)]
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / "tokenizer_config.json").is_file()


def test_validate_keywords(variant, tmp_path, monkeypatch):
    """validate runs the session of ``path`` on a padded batch of ``seq_len`` tokens drawn from
    ``seed``, and compares it with ``model``: a session that serves another model differs."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    model, _ = variant
    served = SimpleNamespace(feeds=[], paths=[], model=model)

    class Session:
        def __init__(self, path, options, providers):
            served.paths.append(path)

        def get_outputs(self):
            return [SimpleNamespace(name="logits")]

        def run(self, names, feed):
            served.feeds.append(feed)
            with torch.no_grad():
                return [served.model(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()]

    monkeypatch.setattr(onnxruntime, "InferenceSession", Session)
    assert serving.validate(model, tmp_path / "m.onnx", 24, seed=3).passed
    assert served.paths == [str(tmp_path / "m.onnx")] and served.feeds[0]["input_ids"].shape == (2, 24)
    expected = serving.padded_batch(model, 24, seed=3)["input_ids"].numpy()
    assert (served.feeds[0]["input_ids"] == expected).all()
    assert not (serving.padded_batch(model, 24, seed=4)["input_ids"].numpy() == expected).all()
    served.model = hea.AutoModelForMaskedLM.from_config(model.config).eval()  # other weights
    assert not serving.validate(model, tmp_path / "m.onnx", 24, seed=3).passed
