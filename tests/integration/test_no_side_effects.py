"""Public functions leave what they only read as it was: configs, option dicts, input tensors and
models passed in (issue: a factory that wrote into the caller's config went unnoticed)."""

import copy

import pytest
import torch
import transformers as T
from tiny import batch, tiny_config
from training_fixtures import small_tokenizer

import hf_efficient_attn as hea
from hf_efficient_attn.hub.export import export_variant

OPTIONS = {"mra2": {"block_per_row": 1}, "linformer": {"k": 16}}


#: What Transformers' own save_pretrained records in the model's config (not this package's doing).
SAVE_PRETRAINED_FIELDS = {"architectures", "dtype"}


def config_fields(model):
    return {k: v for k, v in model.config.to_dict().items() if k not in SAVE_PRETRAINED_FIELDS}


def snapshot(model):
    return {key: value.clone() for key, value in model.state_dict().items()}, config_fields(model)


def assert_unchanged(model, before):
    state, config = before
    assert config_fields(model) == config
    after = model.state_dict()
    assert set(after) == set(state) and all(torch.equal(after[key], state[key]) for key in state)


@pytest.mark.parametrize("method", ["mra2", "linformer"])
def test_from_config_and_from_pretrained_leave_the_config_and_options_given(method, tmp_path):
    config, options = tiny_config("roberta"), dict(OPTIONS[method])
    config_before, options_before = config.to_dict(), copy.deepcopy(options)
    model = hea.AutoModel.from_config(config, attn_impl=method, attn_config=options)
    assert model.config.attn_impl == method
    model.save_pretrained(tmp_path)
    hea.AutoModel.from_pretrained(tmp_path, config=config, attn_impl=method, attn_config=options)
    assert config.to_dict() == config_before and options == options_before


def test_patch_model_leaves_the_options_given():
    options = {"block_per_row": 1}
    hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "mra2", options)
    assert options == {"block_per_row": 1}


@pytest.mark.parametrize("method", hea.list_methods())
def test_efficient_attention_leaves_its_inputs(method):
    """Methods zero padded positions on their own copies, not on the caller's tensors."""
    q, k, v = (torch.randn(2, 2, 150, 16) for _ in range(3))
    mask = torch.ones(2, 150, dtype=torch.bool)
    mask[1, 100:] = False
    before = [t.clone() for t in (q, k, v, mask)]
    hea.efficient_attention(q, k, v, method=method, attention_mask=mask, **OPTIONS.get(method, {}))
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, mask), before))


def test_export_variant_leaves_the_model(tmp_path):
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2")
    before = snapshot(model)
    export_variant(model, small_tokenizer(), tmp_path / "upload", repo_id="me/tiny", base_model="me/base", license="mit")
    assert_unchanged(model, before)


def test_a_forward_leaves_the_batch():
    model = hea.AutoModel.from_config(tiny_config("roberta"), attn_impl="mra2").eval()
    ids, mask = batch()
    before = ids.clone(), mask.clone()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert torch.equal(ids, before[0]) and torch.equal(mask, before[1])
