"""hea.AutoModel*.from_pretrained / from_config: every keyword behaves as in Transformers, the method
is chosen by one clear rule, and what a method adds loads like any other weight."""

import json

import pytest
import torch
import transformers as T
from tiny import REAL, batch, hidden, option_defaults, tiny_config
from transformers.utils import logging

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules


@pytest.fixture(scope="module")
def plain_bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain_bert")
    torch.manual_seed(0)
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(path)
    return path


@pytest.mark.parametrize("attn_impl", ["mra2", None])
def test_config_keywords_reach_the_config(plain_bert, attn_impl):
    model = hea.AutoModelForSequenceClassification.from_pretrained(
        plain_bert, attn_impl=attn_impl, num_labels=3, hidden_dropout_prob=0.25, id2label={0: "a", 1: "b", 2: "c"}
    )
    reference = T.AutoModelForSequenceClassification.from_pretrained(
        plain_bert, num_labels=3, hidden_dropout_prob=0.25, id2label={0: "a", 1: "b", 2: "c"}
    )
    for key in ("num_labels", "hidden_dropout_prob", "id2label"):
        assert getattr(model.config, key) == getattr(reference.config, key)
    assert model.classifier.out_features == 3
    assert getattr(model.config, "attn_impl", None) == attn_impl


def test_hub_and_model_keywords_pass_through(plain_bert):
    model = hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", local_files_only=True, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    ids, mask = batch()
    assert torch.isfinite(hidden(model, ids, mask).float()).all()


def test_output_attentions_keyword_gets_a_clear_error(plain_bert):
    with pytest.raises(ValueError, match="output_attentions"):
        hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", output_attentions=True)


def test_attn_config_without_a_method_is_refused(plain_bert):
    with pytest.raises(ValueError, match="attn_config was given without attn_impl"):
        hea.AutoModel.from_pretrained(plain_bert, attn_config={"block_per_row": 2})
    with pytest.raises(ValueError, match="attn_config was given without attn_impl"):
        hea.AutoModel.from_config(tiny_config("bert"), attn_config={"block_per_row": 2})


def test_saved_method_is_restored_and_attn_config_updates_it(plain_bert, tmp_path):
    hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_config={"block_size": 16}).save_pretrained(tmp_path)
    model = hea.AutoModel.from_pretrained(tmp_path, attn_config={"block_per_row": 2})
    assert model.config.attn_impl == "mra2"
    assert model.config.attn_config == option_defaults("mra2") | {"block_size": 16, "block_per_row": 2}
    other = hea.AutoModel.from_pretrained(tmp_path, attn_impl="yoso")  # a new method starts from its defaults
    assert other.config.attn_config == option_defaults("yoso")


def test_attn_implementation_and_attn_impl(plain_bert, tmp_path):
    same = hea.AutoModel.from_pretrained(plain_bert, attn_implementation="mra2")  # a method name: same as attn_impl
    assert same.config.attn_impl == "mra2" and same.config._attn_implementation == "mra2"
    with pytest.raises(ValueError, match="name different methods"):
        hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_implementation="yoso")
    with pytest.raises(ValueError, match="would run Transformers' attention"):
        hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_implementation="eager")
    same.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="saved in the config"):
        hea.AutoModel.from_pretrained(tmp_path, attn_implementation="eager")
    with pytest.raises(ValueError, match="would run Transformers' attention"):
        hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2", attn_implementation="sdpa")
    plain = hea.AutoModel.from_pretrained(plain_bert, attn_implementation="eager")  # no method: Transformers'
    assert plain.config._attn_implementation == "eager" and not hasattr(plain.config, "attn_impl")


def test_the_choice_is_resolved_once_per_model(plain_bert, tmp_path, monkeypatch):
    """One resolution per model built or patched (registry.resolve_method): the auto classes hand the
    resolved choice to the model they build, and its layers are built from it; a model that plain
    Transformers builds resolves the saved choice once too. Each layer uses the options asked for."""
    import hf_efficient_attn.registry as registry

    calls, resolve = [], registry.resolve_options
    monkeypatch.setattr(registry, "resolve_options", lambda *args, **kwargs: calls.append(args) or resolve(*args, **kwargs))

    def resolutions(build):
        calls.clear()
        model = build()
        assert len(calls) == 1, calls
        assert [m.options.num_hash for m in method_modules(model)] == [4] * 3
        return model

    config = tiny_config("bert", num_hidden_layers=3)
    resolutions(lambda: hea.AutoModelForSequenceClassification.from_config(config, attn_impl="yoso", attn_config={"num_hash": 4}))
    T.AutoModel.from_config(config).save_pretrained(tmp_path / "plain")
    saved = resolutions(lambda: hea.AutoModel.from_pretrained(tmp_path / "plain", attn_impl="yoso", attn_config={"num_hash": 4}))
    saved.save_pretrained(tmp_path / "yoso")
    resolutions(lambda: hea.AutoModelForMaskedLM.from_pretrained(tmp_path / "yoso"))
    resolutions(lambda: T.AutoModel.from_pretrained(tmp_path / "yoso"))
    resolutions(lambda: hea.patch_model(T.AutoModel.from_config(config), "yoso", {"num_hash": 4}))


def test_new_method_parameters_are_reported_by_the_load_report(plain_bert, caplog):
    logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            hea.AutoModel.from_pretrained(plain_bert, attn_impl="linformer", attn_config={"k": 8})
    finally:
        logging.disable_propagation()
    assert "efficient_attn.e_proj" in caplog.text and "MISSING" in caplog.text


@pytest.mark.parametrize("model_type,model_class", [("bert", "BertForPreTraining"), ("electra", "ElectraForPreTraining")])
def test_pretraining_models_reload_as_themselves(tmp_path, model_type, model_class):
    model = hea.AutoModelForPreTraining.from_config(tiny_config(model_type), attn_impl="performer").eval()
    assert type(model).__name__ == model_class
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [model_class]
    reloaded = hea.AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(reloaded).__name__ == model_class and reloaded.config.attn_impl == "performer"
    ids, mask = batch()
    with torch.no_grad():
        a, b = (
            m(input_ids=ids, attention_mask=mask).prediction_logits
            if model_type == "bert"
            else m(input_ids=ids, attention_mask=mask).logits
            for m in (model, reloaded)
        )
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1, :REAL], b[1, :REAL])


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    T.T5EncoderModel(T.T5Config(vocab_size=50, d_model=16, d_kv=4, num_heads=4, d_ff=32, num_layers=1)).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match="model type 't5' computes its attention itself, .*; supported: encoders that dispatch, e.g. bert"
    ):
        hea.AutoModel.from_pretrained(tmp_path, attn_impl="mra2")


def test_version_is_the_package_version():
    from importlib.metadata import version

    assert hea.__version__ == version("hf_efficient_attn")


def test_one_table_of_auto_classes_gives_the_public_classes_and_the_remote_codes_auto_map():
    """``AUTO_CLASSES`` is every ``hea.AutoModel*`` (each wrapping its Transformers namesake) and every
    auto class a shared variant's remote code maps: BERT has all seven heads."""
    from hf_efficient_attn.hub.remote_code import model_classes
    from hf_efficient_attn.integration.auto import AUTO_CLASSES

    public = [name for name in hea.__all__ if name.startswith("AutoModel")]
    assert sorted(AUTO_CLASSES) == sorted(public)
    assert all(getattr(hea, name)._auto_class is getattr(T, name) for name in public)
    assert list(model_classes("bert")) == list(AUTO_CLASSES)
