"""patch_model / unpatch_model: defined behaviour for every way a user changes a model's attention."""

import copy
import pickle

import pytest
import torch
import transformers as T
from tiny import ARCHITECTURES, REAL, VOCAB, batch, hidden, option_defaults, tiny_config

import hf_efficient_attn as hea


def exact_and_patched(model_type="bert", method="mra2", options=None):
    torch.manual_seed(0)
    exact = T.AutoModel.from_config(tiny_config(model_type)).eval()
    patched = hea.patch_model(copy.deepcopy(exact), method, options or {"block_per_row": 1})
    return exact, patched


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1, :REAL], b[1, :REAL])


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_unpatch_restores_exact_attention_class_and_config(model_type, tmp_path):
    exact, patched = exact_and_patched(model_type)
    ids, mask = batch()
    assert not torch.allclose(hidden(patched, ids, mask), hidden(exact, ids, mask))
    keys = set(exact.state_dict())
    hea.unpatch_model(patched)
    assert type(patched) is getattr(T, type(exact).__name__) and set(patched.state_dict()) == keys
    assert not hasattr(patched.config, "attn_impl") and not hasattr(patched.config, "attn_config")
    assert_same(hidden(patched, ids, mask), hidden(exact, ids, mask))
    patched.save_pretrained(tmp_path)
    assert "attn_impl" not in (tmp_path / "config.json").read_text()
    with pytest.raises(ValueError, match="not patched"):
        hea.unpatch_model(patched)


def test_set_attn_implementation_keeps_the_saved_config_true_to_what_runs(tmp_path):
    exact, patched = exact_and_patched("roberta")
    ids, mask = batch()
    patched.set_attn_implementation("sdpa")  # Transformers' own switch: now exact attention runs ...
    assert_same(hidden(patched, ids, mask), hidden(exact, ids, mask))
    patched.save_pretrained(tmp_path)  # ... and the saved config says so
    assert "attn_impl" not in (tmp_path / "config.json").read_text()

    _, patched = exact_and_patched("roberta")
    patched.set_attn_implementation("yoso")  # another method: re-patched, with that method's defaults
    assert patched.config.attn_impl == "yoso" and patched.config.attn_config == option_defaults("yoso")
    direct = hea.patch_model(copy.deepcopy(exact), "yoso")
    assert_same(hidden(patched, ids, mask), hidden(direct, ids, mask))


def test_patching_a_patched_model_replaces_its_method():
    exact, patched = exact_and_patched("bert", "linformer", {"k": 8})
    hea.patch_model(patched, "mra2", {"block_per_row": 1})
    _, direct = exact_and_patched("bert", "mra2", {"block_per_row": 1})
    assert set(patched.state_dict()) == set(exact.state_dict())  # linformer's projections are gone
    assert patched.config.attn_config == direct.config.attn_config
    ids, mask = batch()
    assert_same(hidden(patched, ids, mask), hidden(direct, ids, mask))


def test_patch_without_a_method_uses_the_saved_one_or_refuses():
    model = T.AutoModel.from_config(tiny_config("bert"))
    with pytest.raises(ValueError, match="needs attn_impl"):
        hea.patch_model(model, attn_config={"block_per_row": 2})
    with pytest.raises(ValueError, match="needs attn_impl"):
        hea.patch_model(model)
    hea.patch_model(model, "mra2", {"block_per_row": 2, "block_size": 16})
    hea.patch_model(model, attn_config={"block_per_row": 3})  # same method, saved options updated
    assert model.config.attn_impl == "mra2"
    assert model.config.attn_config["block_per_row"] == 3 and model.config.attn_config["block_size"] == 16


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_output_attentions_is_refused_the_same_way_everywhere(model_type):
    _, patched = exact_and_patched(model_type)
    ids, mask = batch()
    reason = "sliding-window layout" if model_type == "longformer" else "'mra2' never forms the attention probabilities"
    with pytest.raises(ValueError, match=reason):
        patched(input_ids=ids, attention_mask=mask, output_attentions=True)
    with pytest.raises(ValueError, match="output_attentions"):  # Transformers' own check, or ours
        patched.config.output_attentions = True
        patched(input_ids=ids, attention_mask=mask)
    with pytest.raises(ValueError, match=reason + ".*the config asks for output_attentions=True"):
        hea.patch_model(T.AutoModel.from_config(tiny_config(model_type, output_attentions=True)), "mra2")


def test_patched_models_pickle_and_deepcopy_as_themselves():
    _, patched = exact_and_patched("bert", "linformer", {"k": 8})
    ids, mask = batch()
    expected = hidden(patched, ids, mask)
    for clone in (pickle.loads(pickle.dumps(patched)), copy.deepcopy(patched)):
        assert type(clone) is type(patched) and clone.config.attn_impl == "linformer"
        assert_same(hidden(clone, ids, mask), expected)
        first = clone.encoder.layer[0].attention.self.efficient_attn.e_proj
        assert clone.encoder.layer[1].attention.self.efficient_attn.projections()[0] is first  # sharing kept


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_patched_models_return_hidden_states(model_type, tmp_path):
    _, patched = exact_and_patched(model_type)
    ids, mask = batch()
    patched.save_pretrained(tmp_path)
    for model in (patched, hea.AutoModel.from_pretrained(tmp_path).eval()):
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        assert len(out.hidden_states) == model.config.num_hidden_layers + 1
        torch.testing.assert_close(out.hidden_states[-1][:, :REAL], out.last_hidden_state[:, :REAL])


def test_too_long_input_names_the_limit():
    model = hea.patch_model(T.AutoModel.from_config(tiny_config("roberta")), "mra2")
    ids = torch.randint(5, VOCAB, (1, 200))
    with pytest.raises(ValueError, match="128 tokens allowed"):
        hidden(model, ids, torch.ones_like(ids))


def test_lora_adapter_saves_and_restores_the_method_parameters(tmp_path):
    """Linformer's projections are trained and saved with a LoRA adapter (``hea.modules_to_save``);
    the adapter reloaded onto a freshly loaded base (new random projections) reproduces the model,
    every layer using the first layer's trained projection (layerwise sharing)."""
    peft = pytest.importorskip("peft")
    T.AutoModel.from_config(tiny_config("bert")).save_pretrained(tmp_path / "base")

    def base():
        return hea.AutoModelForSequenceClassification.from_pretrained(
            tmp_path / "base", attn_impl="linformer", attn_config={"k": 8}, num_labels=2
        )

    model = base()
    assert hea.modules_to_save(model) == ["efficient_attn"]
    config = peft.LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=hea.modules_to_save(model) + ["classifier"])
    tuned = peft.get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=1e-2)
    ids, mask = batch()
    for _ in range(3):
        tuned(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tuned.eval()
    expected = tuned(input_ids=ids, attention_mask=mask).logits
    tuned.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(base(), tmp_path / "adapter").eval()
    torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, expected)
    assert hea.modules_to_save(hea.patch_model(T.AutoModel.from_config(tiny_config("bert")), "mra2")) == []


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_softmax_returns_the_attention_probabilities_of_eager_attention(model_type):
    torch.manual_seed(0)
    eager = T.AutoModel.from_config(tiny_config(model_type), attn_implementation="eager").eval()
    patched = hea.patch_model(copy.deepcopy(eager), "softmax")
    ids, mask = batch()
    with torch.no_grad():
        expected = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        got = patched(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(got.attentions) == len(expected.attentions) == 2
    for mine, reference in zip(got.attentions, expected.attentions):  # padded query rows differ in layer 2
        assert_same(mine.transpose(1, 2), reference.transpose(1, 2))  # (B, N, H, N): rows by query
    assert_same(got.last_hidden_state, expected.last_hidden_state)
    with torch.no_grad():  # asked for once: later calls form no probabilities
        assert patched(input_ids=ids, attention_mask=mask).attentions is None


def test_a_config_asking_for_attentions_gets_softmax_probabilities():
    """config.output_attentions=True (as Transformers' own model tests set it): softmax patches and
    returns eager attention's probabilities on every call."""
    torch.manual_seed(0)
    eager = T.AutoModel.from_config(tiny_config("bert", output_attentions=True), attn_implementation="eager").eval()
    patched = hea.patch_model(copy.deepcopy(eager), "softmax")
    ids, mask = batch()
    with torch.no_grad():
        expected, got = eager(input_ids=ids, attention_mask=mask), patched(input_ids=ids, attention_mask=mask)
    assert len(got.attentions) == len(expected.attentions) == 2
    for mine, reference in zip(got.attentions, expected.attentions):  # padded query rows differ in layer 2
        assert_same(mine.transpose(1, 2), reference.transpose(1, 2))


def test_longformer_softmax_keeps_refusing_output_attentions():
    patched = hea.patch_model(T.AutoModel.from_config(tiny_config("longformer")), "softmax")
    with pytest.raises(ValueError, match="sliding-window layout"):
        patched(*batch(), output_attentions=True)
    with pytest.raises(ValueError, match="sliding-window layout"):
        hea.patch_model(T.AutoModel.from_config(tiny_config("longformer", output_attentions=True)), "softmax")


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_packed_inputs_within_the_table_run_and_equal_sdpa_on_each_sequence(model_type):
    """Two sequences packed into one row longer than the position table, positions restarting at
    the second: every position is in the table, so the model runs, and each sequence gets what
    Transformers' SDPA gives it alone (SDPA itself would let the two attend to each other)."""
    torch.manual_seed(0)
    sdpa = T.AutoModel.from_config(tiny_config(model_type), attn_implementation="sdpa").eval()
    patched = hea.patch_model(copy.deepcopy(sdpa), "softmax")
    offset = sdpa.config.pad_token_id + 1 if model_type == "roberta" else 0
    positions = torch.cat([torch.arange(100), torch.arange(90)])[None] + offset
    ids = torch.randint(5, VOCAB, (1, 190))
    assert ids.shape[1] > sdpa.config.max_position_embeddings
    with torch.no_grad():
        expected = torch.cat(
            [sdpa(input_ids=ids[:, :100]).last_hidden_state, sdpa(input_ids=ids[:, 100:]).last_hidden_state], dim=1
        )
        torch.testing.assert_close(patched(input_ids=ids, position_ids=positions).last_hidden_state, expected)
    with pytest.raises(ValueError, match=f"position_ids reach {130 + offset}, beyond the position table"):
        patched(input_ids=ids[:, :131], position_ids=torch.arange(131)[None] + offset)
