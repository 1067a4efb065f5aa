"""Every encoder Transformers dispatches (issue 55): found from the model, its own arithmetic kept
(softmax through the plugin equals Transformers' SDPA model), windowed layers left to the model,
positions of every kind stretched, refusals in one line. Tiny models of each architecture's config:
Transformers' own modelling code is the reference."""

import copy

import pytest
import torch
import transformers as T
from tiny import DISPATCHING_ARCHITECTURES, KINDS, REAL, SEQ, VOCAB, batch, default_tier, hidden, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.integration.architectures import TESTED_ARCHITECTURES, has_rotary_positions, max_tokens
from hf_efficient_attn.integration.bridge import method_modules, self_attention_modules

NEW = list(DISPATCHING_ARCHITECTURES)
WINDOWED = ["modernbert", "ultrabert"]


def sdpa_model(model_type, **overrides):
    """Transformers' own model with SDPA attention, weights larger than the default initialisation
    (so that attention is far from uniform, where every method equals exact attention)."""
    torch.manual_seed(0)
    config = tiny_config(model_type, initializer_range=0.3, **overrides)
    return T.AutoModel.from_config(config, attn_implementation="sdpa").eval()


def test_every_named_architecture_is_tested_here():
    assert set(TESTED_ARCHITECTURES) == {"bert", "roberta", "xlm-roberta", "electra", "camembert", "longformer", *NEW}


@pytest.mark.parametrize("model_type", NEW)
def test_softmax_through_the_plugin_equals_transformers_sdpa_on_a_padded_batch(model_type):
    """RoPE as the model applies it, pre-LN, ALBERT's shared layer, ESM's pre-scaled q, grouped k and v
    heads, ModernBERT's and UltraBERT's windowed layers: all the model's own; only the function differs."""
    reference = sdpa_model(model_type)
    patched = hea.patch_model(copy.deepcopy(reference), "softmax")
    ids, mask = batch()
    torch.testing.assert_close(hidden(patched, ids, mask)[mask.bool()], hidden(reference, ids, mask)[mask.bool()])


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_mra2_runs_approximates_and_honours_padding(model_type):
    """Inside each architecture mra2 differs from exact attention (with a budget of one block a row it
    approximates at 40 tokens) and a padded row's real tokens equal the row run alone."""
    reference = sdpa_model(model_type)
    model = hea.patch_model(copy.deepcopy(reference), "mra2", {"block_per_row": 1})
    ids, mask = batch()
    out = hidden(model, ids, mask)
    assert (out[0] - hidden(reference, ids, mask)[0]).abs().max() > 1e-3, "the method cannot be told from exact attention"
    torch.testing.assert_close(out[1, :REAL], hidden(model, ids[1:, :REAL], mask[1:, :REAL])[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", default_tier("albert", "modernbert"))  # a shared layer, windowed layers
def test_a_training_step_reaches_every_parameter(model_type):
    """A masked-LM step with mra2 gives finite gradients to every parameter of the attention layers."""
    torch.manual_seed(0)
    model = hea.AutoModelForMaskedLM.from_config(tiny_config(model_type), attn_impl="mra2", attn_config={"block_per_row": 1})
    model.train()
    ids, mask = batch()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    for module in self_attention_modules(model):
        for name, parameter in module.named_parameters():
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("model_type", default_tier("modernbert"))  # rotary, windowed layers
def test_compiles_in_one_graph_and_equals_eager(model_type):
    model = hea.patch_model(sdpa_model(model_type), "mra2", {"block_per_row": 1})
    ids, mask = batch()
    torch._dynamo.reset()  # the patched classes share one __call__: each would count as a recompilation
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).last_hidden_state, hidden(model, ids, mask))


@pytest.mark.parametrize("model_type", WINDOWED)
def test_windowed_layers_keep_the_models_own_attention(model_type):
    """The method runs on the full-attention layers only (config.layer_types says which); a windowed
    layer keeps the model's windowed SDPA, so the window still bites (tokens beyond it change nothing)."""
    model = hea.patch_model(sdpa_model(model_type), "mra2")
    full = [t == "full_attention" for t in model.config.layer_types]
    modules = self_attention_modules(model)
    assert [hasattr(m, "efficient_attn") for m in modules] == full and len(method_modules(model)) == sum(full)
    windowed = modules[full.index(False)]
    with pytest.raises(ValueError, match="cannot run on a sliding-window layer"):
        windowed.efficient_attn = method_modules(model)[0]
        hidden(model, *batch())


@pytest.mark.parametrize("model_type", ["deberta-v2", "mpnet", "big_bird"])
def test_a_model_that_computes_its_own_attention_is_refused(model_type):
    config = T.AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=48)  # fmt: skip
    model = T.AutoModel.from_config(config)
    with pytest.raises(ValueError, match=f"model type '{model_type}' computes its attention itself"):
        hea.patch_model(model, "mra2")
    with pytest.raises(ValueError, match="computes its attention itself"):
        hea.AutoModel.from_config(config, attn_impl="softmax")


def test_plain_transformers_refuses_a_method_in_a_model_that_would_only_take_its_mask():
    """MPNet accepts any registered attention name but adds the mask function's output to its own
    scores: with a method's name it would silently run exact attention with a wrong mask."""
    config = T.AutoConfig.for_model("mpnet", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=48)  # fmt: skip
    model = T.AutoModel.from_config(config, attn_implementation="softmax")
    with pytest.raises(ValueError, match="computes its attention itself"):
        hidden(model, *batch())


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_a_decoder_is_refused(model_type):
    config = T.AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=48)  # fmt: skip
    with pytest.raises(ValueError, match=f"'{model_type}' is a decoder"):
        hea.patch_model(T.AutoModel.from_config(config), "mra2")


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_stretching_keeps_the_outputs_of_inputs_that_fit_and_admits_longer_ones(model_type):
    """Learned tables are copied, rotary limits raised: an input that fit gives the same outputs, an
    input past the old limit is refused before and runs after."""
    model = hea.patch_model(sdpa_model(model_type, max_position_embeddings=64), "mra2", {"block_per_row": 1})
    ids, mask = batch()
    before, old_limit = hidden(model, ids, mask), max_tokens(model.config)
    longer = torch.randint(5, VOCAB, (1, old_limit + 8))
    with pytest.raises(ValueError, match="extend_position_embeddings"):
        hidden(model, longer, torch.ones_like(longer))
    hea.extend_position_embeddings(model, max_length=2 * old_limit)
    assert max_tokens(model.config) == 2 * old_limit
    torch.testing.assert_close(hidden(model, ids, mask), before)
    assert torch.isfinite(hidden(model, longer, torch.ones_like(longer))).all()


@pytest.mark.parametrize("rope_scaling", ["linear", "yarn"])
def test_a_rope_scaling_is_opt_in_and_recorded(rope_scaling):
    """With rope_scaling the positions are rescaled by new length over old: the config records it and
    the outputs change at every length."""
    model = hea.patch_model(sdpa_model("gte", max_position_embeddings=32), "softmax")
    ids = torch.randint(5, VOCAB, (1, 30))
    unscaled = hidden(model, ids, torch.ones_like(ids))
    hea.extend_position_embeddings(model, max_length=64, rope_scaling=rope_scaling)
    assert model.config.rope_parameters["rope_type"] == rope_scaling and model.config.rope_parameters["factor"] == 2
    assert (hidden(model, ids, torch.ones_like(ids)) - unscaled).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("model_type", "message"), [("albert", "learned table"), ("esm", "take no RoPE scaling"), ("gte", "one of linear, yarn")]
)
def test_a_rope_scaling_that_cannot_apply_is_refused(model_type, message):
    model = sdpa_model(model_type)
    scaling = "ntk" if model_type == "gte" else "linear"
    with pytest.raises(ValueError, match=message):
        hea.extend_position_embeddings(model, max_length=256, rope_scaling=scaling)


@pytest.mark.parametrize("model_type", NEW)
def test_rotary_positions_are_recognised(model_type):
    rotary = {"modernbert", "gte", "nomic_bert", "eurobert", "jina_embeddings_v3", "ultrabert", "esm"}
    assert has_rotary_positions(tiny_config(model_type)) == (model_type in rotary)


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_a_saved_variant_reloads_as_itself(model_type, tmp_path):
    """With the plugin's auto class and with plain Transformers after the import."""
    model = hea.AutoModel.from_config(
        tiny_config(model_type, initializer_range=0.3), attn_impl="linformer", attn_config={"k": 16}
    )
    model.eval().save_pretrained(tmp_path)
    ids, mask = batch()
    for loader in (hea.AutoModel, T.AutoModel):
        reloaded = loader.from_pretrained(tmp_path).eval()
        assert reloaded.config.attn_impl == "linformer"
        torch.testing.assert_close(hidden(reloaded, ids, mask), hidden(model, ids, mask))
    assert SEQ < max_tokens(model.config)


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_a_masked_lm_checkpoint_loads_into_the_base_model_with_a_method(model_type, tmp_path):
    """A masked-LM checkpoint as Transformers saves it (GTE's in its original layout: the masked-LM
    prefix, fused projections) loads into the patched base model as into Transformers' own masked-LM
    model: every weight (sentence-transformers and AutoModel load stretched masked-LM folders so)."""
    T.set_seed(0)
    T.AutoModelForMaskedLM.from_config(tiny_config(model_type)).save_pretrained(tmp_path)
    expected = T.AutoModelForMaskedLM.from_pretrained(tmp_path).base_model.state_dict()
    loaded = hea.AutoModel.from_pretrained(tmp_path, attn_impl="softmax").state_dict()
    assert set(expected) <= set(loaded)
    assert [key for key in expected if not torch.equal(loaded[key], expected[key])] == []


@pytest.mark.parametrize("rope_scaling", [None, "linear"])
def test_convert_to_long_stretches_rotary_positions_with_or_without_a_scaling(tmp_path, rope_scaling):
    """scripts/convert_to_long.py on a ModernBERT (rotary, windowed layers): the limit raised, the
    scaling recorded in the saved config when asked for (and the outputs changed), else the outputs of
    inputs that fit kept; a scaling refused for a learned table in one line."""
    from training_fixtures import save_tiny_mlm

    from hf_efficient_attn.tasks import convert

    source = save_tiny_mlm(str(tmp_path / "short"), "modernbert", max_position_embeddings=64)
    flags = [
        "--model_name_or_path",
        source,
        "--max_length",
        "256",
        "--attn_impl",
        "softmax",
        "--output_dir",
        str(tmp_path / "long"),
    ]
    report = convert.main([*flags, *(["--rope_scaling", rope_scaling] if rope_scaling else [])])
    assert (report.tokens_before, report.tokens_after, report.rope_scaling) == (64, 256, rope_scaling)
    assert f"rotary positions: 64 -> 256 tokens ({'rescaled by linear' if rope_scaling else 'unscaled'}" in report.lines()[1]
    long = T.AutoModelForMaskedLM.from_pretrained(tmp_path / "long").eval()
    short = hea.AutoModelForMaskedLM.from_pretrained(source, attn_impl="softmax").eval()
    assert long.config.max_position_embeddings == 256 and long.config.attn_impl == "softmax"
    assert [p.get("rope_type") for p in long.config.rope_parameters.values()] == [rope_scaling or "default"] * 2
    ids, mask = batch()
    with torch.no_grad():
        difference = (
            (long(input_ids=ids, attention_mask=mask).logits - short(input_ids=ids, attention_mask=mask).logits).abs().max()
        )
    assert difference == 0 if rope_scaling is None else difference > 1e-6
    learned = save_tiny_mlm(str(tmp_path / "albert"), "albert")
    with pytest.raises(ValueError, match="rope_scaling must be None: this model's positions are a learned table"):
        convert.main(
            [
                "--model_name_or_path",
                learned,
                "--max_length",
                "256",
                "--output_dir",
                str(tmp_path / "a"),
                "--rope_scaling",
                "yarn",
            ]
        )


def test_methods_see_unscaled_q_whatever_split_of_the_scale_the_model_passes():
    """ESM scales q before its rotary positions and passes scaling=1; a kernel method (Skyformer's
    Gaussian kernel is not a function of q.k alone) then gets the same q, k and scaling as in BERT."""
    from hf_efficient_attn.integration.bridge import efficient_attention_forward

    model = hea.patch_model(sdpa_model("esm"), "skyformer")
    module = self_attention_modules(model)[0]
    q, k, v = torch.randn(3, 2, 4, SEQ, 8).unbind(0)
    scaled, _ = efficient_attention_forward(module, q * 8**-0.5, k, v, None, scaling=1.0)
    unscaled, _ = efficient_attention_forward(module, q, k, v, None, scaling=8**-0.5)
    torch.testing.assert_close(scaled, unscaled)
