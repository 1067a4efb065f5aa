"""The Transformers bridge: patching, config field, save/load, plain-Transformers path, errors."""

import copy
import json

import pytest
import torch
import transformers as T
from tiny import DISPATCHING_ARCHITECTURES, MATRIX_ARCHITECTURES, REAL, SEQ, VOCAB, batch, hidden, option_defaults, tiny_config

import hf_efficient_attn as hea


@pytest.mark.parametrize("model_type", ["bert", "roberta", "xlm-roberta", "electra", "camembert"])
def test_softmax_method_equals_transformers_sdpa(model_type):
    """The bridge passes the padding mask and heads through unchanged: exact == SDPA."""
    model = T.AutoModel.from_config(tiny_config(model_type)).eval()
    ids, mask = batch()
    expected = hidden(model, ids, mask)
    hea.patch_model(model, "softmax")
    got = hidden(model, ids, mask)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :REAL], expected[1, :REAL])
    assert model.config.attn_impl == "softmax" and model.config._attn_implementation == "softmax"


def test_longformer_softmax_equals_full_window_longformer():
    """A window covering the whole sequence makes Longformer exact attention: the subclass must agree."""
    model = T.AutoModel.from_config(tiny_config("longformer")).eval()
    ids, mask = batch()
    expected = hidden(model, ids, mask)
    keys = set(model.state_dict())
    hea.patch_model(model, "softmax")
    assert set(model.state_dict()) == keys
    got = hidden(model, ids, mask)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1, :REAL], expected[1, :REAL], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["roberta", "longformer"])
@pytest.mark.parametrize("method,options", [("mra2", {"block_per_row": 1}), ("linformer", {"k": 16})])
def test_save_and_reload_restores_method(tmp_path, model_type, method, options):
    model = hea.AutoModel.from_config(tiny_config(model_type), attn_impl=method, attn_config=options).eval()
    ids, mask = batch()
    expected = hidden(model, ids, mask)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_impl"] == method
    assert saved["attn_config"] == option_defaults(method) | options
    reloaded = hea.AutoModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.attn_impl == method
    torch.testing.assert_close(hidden(reloaded, ids, mask)[0], expected[0])
    torch.testing.assert_close(hidden(reloaded, ids, mask)[1, :REAL], expected[1, :REAL])


def test_plain_checkpoint_keeps_every_pretrained_weight(tmp_path):
    plain = T.AutoModel.from_config(tiny_config("bert"))
    plain.save_pretrained(tmp_path)
    patched = hea.AutoModel.from_pretrained(tmp_path, attn_impl="linformer", attn_config={"k": 16})
    plain_state, patched_state = plain.state_dict(), patched.state_dict()
    new = sorted(set(patched_state) - set(plain_state))
    assert new and all(".efficient_attn." in k for k in new)
    for key, value in plain_state.items():
        torch.testing.assert_close(patched_state[key], value, atol=0, rtol=0)


def test_plain_transformers_attn_implementation_equals_plugin(tmp_path):
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(tmp_path)
    ids, mask = batch()
    via_transformers = T.AutoModel.from_pretrained(tmp_path, attn_implementation="mra2").eval()
    via_plugin = hea.AutoModel.from_pretrained(tmp_path, attn_impl="mra2").eval()
    exact = T.AutoModel.from_pretrained(tmp_path).eval()
    got, expected = hidden(via_transformers, ids, mask), hidden(via_plugin, ids, mask)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :REAL], expected[1, :REAL])
    # and padding reached the method: the padded row's real tokens match an unpadded run
    alone = hidden(via_transformers, ids[1:, :REAL], mask[1:, :REAL])
    torch.testing.assert_close(got[1, :REAL], alone[0], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(hidden(exact, ids, mask), got)  # mra2 is really used (an approximation)


def test_plain_transformers_path_is_reproducible_in_eval_and_follows_train(tmp_path):
    """The method built on first use is a submodule, so ``.eval()`` reaches it (seeded samples)."""
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(tmp_path)
    model = T.AutoModel.from_pretrained(tmp_path, attn_implementation="yoso").eval()
    ids, mask = batch()
    first = hidden(model, ids, mask)
    torch.testing.assert_close(hidden(model, ids, mask), first, atol=0, rtol=0)
    assert not model.encoder.layer[0].attention.self.efficient_attn.training
    model.train()
    assert model.encoder.layer[0].attention.self.efficient_attn.training


def test_plain_transformers_path_uses_the_saved_options(tmp_path):
    hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2", attn_config={"block_per_row": 1}).save_pretrained(tmp_path)
    ids, mask = batch()
    expected = hidden(hea.AutoModel.from_pretrained(tmp_path).eval(), ids, mask)
    plain = T.AutoModel.from_pretrained(tmp_path, attn_implementation="mra2").eval()
    got = hidden(plain, ids, mask)
    assert plain.encoder.layer[0].attention.self.efficient_attn.options.block_per_row == 1
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :REAL], expected[1, :REAL])


def test_method_registered_after_import_works_in_plain_transformers(monkeypatch):
    from hf_efficient_attn import registry
    from hf_efficient_attn.methods.softmax import SoftmaxAttention

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))  # leave the real registry untouched

    @hea.register_method
    class DoubledValues(SoftmaxAttention):
        name = "test_doubled_values"

        def attend(self, q, k, v, key_padding_mask, scaling):
            return super().attend(q, k, 2 * v, key_padding_mask, scaling)

    torch.manual_seed(0)
    exact = T.AutoModel.from_config(tiny_config("bert")).eval()
    torch.manual_seed(0)
    doubled = T.AutoModel.from_config(tiny_config("bert"), attn_implementation="test_doubled_values").eval()
    ids, mask = batch()
    assert not torch.allclose(hidden(doubled, ids, mask), hidden(exact, ids, mask))
    assert isinstance(doubled.encoder.layer[0].attention.self.efficient_attn, DoubledValues)


def test_register_method_refuses_a_taken_name_unless_asked_to_replace(monkeypatch):
    from hf_efficient_attn import registry
    from hf_efficient_attn.methods.softmax import SoftmaxAttention

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))  # leave the real registry untouched
    original = registry.get_method_class("mra2")

    class Impostor(SoftmaxAttention):
        name = "mra2"

    with pytest.raises(ValueError, match=r"'mra2' is already registered .*replace=True"):
        hea.register_method(Impostor)
    assert registry.get_method_class("mra2") is original
    assert hea.register_method(original) is original  # the same class again: a no-op, not an error
    assert hea.register_method(replace=True)(Impostor) is Impostor
    assert registry.get_method_class("mra2") is Impostor


def test_plain_transformers_unsupported_architecture_is_a_clear_error():
    config = T.T5Config(vocab_size=50, d_model=16, d_kv=4, num_heads=4, d_ff=32, num_layers=1)
    model = T.T5EncoderModel._from_config(config, attn_implementation="mra2")
    with pytest.raises(ValueError, match="model type 't5' computes its attention itself"):
        model(input_ids=torch.randint(0, 50, (1, 8)))


def test_plain_auto_class_builds_methods_with_parameters_before_the_weights_load(tmp_path):
    """Transformers' auto classes build the efficient subclass, so a learnable method's parameters
    exist when the weights load, as with the plugin's own auto classes."""
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(tmp_path)
    ids, mask = batch()
    via_transformers = T.AutoModel.from_pretrained(tmp_path, attn_implementation="linformer").eval()
    via_plugin = hea.AutoModel.from_pretrained(tmp_path, attn_impl="linformer").eval()
    assert via_transformers.config.attn_impl == "linformer"
    torch.testing.assert_close(hidden(via_transformers, ids, mask), hidden(via_plugin, ids, mask))


def test_transformers_class_itself_refuses_methods_with_parameters(tmp_path):
    """A model built from the Transformers class itself (not an auto class) has no method modules
    when its weights load: a learnable method is refused at the first call, never silently
    initialised at random."""
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(tmp_path)
    model = T.BertModel.from_pretrained(tmp_path, attn_implementation="linformer")
    with pytest.raises(ValueError, match="learnable parameters"):
        hidden(model, *batch())


def test_errors_name_what_is_allowed():
    with pytest.raises(ValueError, match="supported: encoders that dispatch, e.g. bert"):
        hea.patch_model(
            T.AutoModel.from_config(T.DebertaV2Config(num_hidden_layers=1, hidden_size=32, num_attention_heads=2)), "mra2"
        )
    with pytest.raises(ValueError, match="known methods: .*mra2"):
        hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "nope")
    with pytest.raises(ValueError, match="options are"):
        hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "mra2", {"bogus": 1})
    with pytest.raises(ValueError, match="decoder"):
        hea.patch_model(T.AutoModel.from_config(tiny_config("bert", is_decoder=True)), "mra2")


def test_causal_mask_is_rejected():
    from hf_efficient_attn.integration.bridge import key_padding_mask_from

    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()[None, None]
    with pytest.raises(ValueError, match="key-padding"):
        key_padding_mask_from(causal, 1, SEQ)
    padding = torch.ones(2, 1, SEQ, SEQ, dtype=torch.bool)
    padding[1, ..., REAL:] = False
    assert key_padding_mask_from(padding, 2, SEQ)[1].sum() == REAL


def test_the_mask_function_takes_packed_rows_and_refuses_other_compositions():
    """Transformers (from 5.25) composes a packed-sequence mask for position_ids that restart without an
    attention mask: the mask function takes it (the bridge keeps the sequences apart itself), not a
    composition with any other part, nor the packed remapping of a causal mask."""
    from transformers import masking_utils as masks

    from hf_efficient_attn.integration.bridge import key_padding_mask_function

    config = tiny_config("bert", attn_implementation="mra2")
    position_ids = torch.cat([torch.arange(5), torch.arange(SEQ - 5)])[None]
    embeds = torch.zeros(1, SEQ, 4)
    assert masks.create_bidirectional_mask(config, embeds, None, position_ids=position_ids) is None
    sequences = masks.find_packed_sequence_indices(position_ids)
    packed = masks.packed_sequence_mask_function(sequences)
    for wrong in (
        masks.and_masks(masks.bidirectional_mask_function, masks.sliding_window_overlay(3)),
        masks.and_masks(masks.remap_positions_for_packed_sequence(masks.causal_mask_function, position_ids), packed),
        masks.and_masks(masks.remap_positions_for_packed_sequence(masks.bidirectional_mask_function, position_ids)),
    ):
        with pytest.raises(ValueError, match="bidirectional self-attention with a key-padding mask only"):
            key_padding_mask_function(1, SEQ, SEQ, mask_function=wrong)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_extend_position_embeddings_copies_the_table(model_type):
    from hf_efficient_attn.integration.positions import position_offset

    model = T.AutoModel.from_config(tiny_config(model_type)).eval()
    old = model.embeddings.position_embeddings.weight.detach().clone()
    offset, old_len = position_offset(model.config), old.shape[0] - position_offset(model.config)
    ids, mask = batch()
    before = hidden(model, ids, mask)
    hea.extend_position_embeddings(model, max_length=300)
    new = model.embeddings.position_embeddings.weight
    assert new.shape[0] == 300 + offset and model.config.max_position_embeddings == 300 + offset
    torch.testing.assert_close(new[offset + old_len : offset + 2 * old_len], old[offset:])
    torch.testing.assert_close(hidden(model, ids, mask), before)  # short inputs unchanged
    long_ids = torch.randint(5, VOCAB, (1, 300))
    assert hidden(model, long_ids, torch.ones_like(long_ids)).shape[1] == 300


def test_too_long_input_names_the_limit():
    model = hea.patch_model(T.AutoModel.from_config(tiny_config("roberta")), "mra2")
    ids = torch.randint(5, VOCAB, (1, 200))
    with pytest.raises(ValueError, match="128 tokens allowed"):
        hidden(model, ids, torch.ones_like(ids))


def test_extending_after_patching_linformer_is_refused():
    model = hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "linformer", {"k": 16})
    with pytest.raises(ValueError, match="extend the position embeddings first"):
        hea.extend_position_embeddings(model, 300)
    extended = hea.extend_position_embeddings(T.AutoModel.from_config(tiny_config("bert")), 300)
    hea.patch_model(extended, "linformer", {"k": 16})
    ids = torch.randint(5, VOCAB, (1, 300))
    assert hidden(extended, ids, torch.ones_like(ids)).shape == (1, 300, 32)


#: Budgets small enough that each method approximates at SEQ tokens (at their defaults MRA-2 and
#: Nystromformer are exact there, and could not be told from softmax).
SMALL_BUDGETS = {
    "mra2": {"block_per_row": 1},
    "mra2_s": {"block_per_row": 1},
    "nystromformer": {"num_landmarks": 4},
    "linformer": {"k": 16},
    "performer": {"num_features": 16},
    "skeinformer": {"num_samples": 8},
    "informer": {"factor": 1},
    "skyformer": {"num_landmarks": 8},
    "yoso": {"num_hash": 4},
}


@pytest.mark.device
@pytest.mark.parametrize(
    "model_type", [*MATRIX_ARCHITECTURES, *(pytest.param(a, marks=pytest.mark.slow) for a in DISPATCHING_ARCHITECTURES)]
)
@pytest.mark.parametrize("method", hea.list_methods())
def test_every_method_on_every_architecture(model_type, method, device):
    """Each method runs inside each architecture on a padded batch, and is seen to run (its output
    differs from the same model with exact attention); where the method is padding invariant, the
    padded row's real tokens equal a run of that row alone, unpadded."""
    from hf_efficient_attn.registry import get_method_class

    # Weights larger than BERT's initialisation (0.02), so that attention is not near uniform, where
    # every method would equal exact attention.
    model = hea.AutoModel.from_config(
        tiny_config(model_type, initializer_range=0.3), attn_impl=method, attn_config=SMALL_BUDGETS.get(method, {})
    )
    model = model.to(device).eval()
    assert model.config.attn_impl == method
    ids, mask = (t.to(device) for t in batch())
    out = hidden(model, ids, mask)
    assert torch.isfinite(out).all()
    if method != "softmax":
        exact = hidden(hea.patch_model(copy.deepcopy(model), "softmax"), ids, mask)
        assert (out[0] - exact[0]).abs().max() > 1e-3, "the method cannot be told from exact attention"
    if get_method_class(method).padding_invariant:
        alone = hidden(model, ids[1:, :REAL], mask[1:, :REAL])
        torch.testing.assert_close(out[1, :REAL], alone[0], atol=1e-5, rtol=1e-4)
