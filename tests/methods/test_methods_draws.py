"""The random draws of the sampling methods: fixed, seeded, non-persistent buffers in eval mode
(exact integers, so the dtype of a model does not change them), redrawn by ``reset_parameters``
and for a longer position table, and the static forms that traced models take."""

import pytest
import torch
import transformers as T

import hf_efficient_attn as hea
from hf_efficient_attn.methods import informer, nystromformer
from hf_efficient_attn.methods.base import AttentionShape, uniform_real_positions
from hf_efficient_attn.registry import MethodChoice, build_method, get_method_class

SAMPLING = [name for name in hea.list_methods() if get_method_class(name).samples]
HEADS, DIM = 2, 16


def make(name, max_seq_len=128, **options):
    return build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, max_seq_len, layer_idx=1)).eval()


def qkv_mask(seq=90, real=61):
    q, k, v = (torch.randn(2, HEADS, seq, DIM) for _ in range(3))
    mask = torch.ones(2, seq, dtype=torch.bool)
    mask[1, real:] = False
    return q, k, v, mask


SAMPLED_OPTIONS = {"skeinformer": {"num_samples": 12}, "skyformer": {"num_landmarks": 12}, "informer": {"factor": 2}}


@pytest.mark.parametrize("name", SAMPLING)
def test_eval_draws_are_non_persistent_buffers_restored_by_reset_parameters(name):
    """Transformers' from_pretrained leaves non-persistent buffers uninitialised and then calls
    reset_parameters: that must redraw exactly the values a fresh build draws."""
    method = make(name, **SAMPLED_OPTIONS.get(name, {}))
    draws = dict(method.named_buffers())
    assert draws and not set(draws) & set(method.state_dict())
    q, k, v, mask = qkv_mask()
    expected = method(q, k, v, mask)
    with torch.no_grad():
        for buffer in draws.values():
            buffer.fill_(7)
    method.reset_parameters()
    torch.testing.assert_close(method(q, k, v, mask), expected, atol=0, rtol=0)
    fresh = dict(make(name, **SAMPLED_OPTIONS.get(name, {})).named_buffers())
    assert all(torch.equal(buffer, fresh[key]) for key, buffer in method.named_buffers())


@pytest.mark.parametrize("name", SAMPLING)
def test_eval_draws_follow_the_device_a_method_is_built_on_except_meta(name):
    """Built under a device context (``with torch.device(...)``) the draws sit on that device beside
    the parameters; under "meta" (where from_pretrained builds) they stay real CPU values, which a
    meta tensor could never hold."""
    with torch.device("meta"):
        method = make(name, **SAMPLED_OPTIONS.get(name, {}))
    cpu = make(name, **SAMPLED_OPTIONS.get(name, {}))
    for key, buffer in cpu.named_buffers():
        assert torch.equal(dict(method.named_buffers())[key], buffer)


@pytest.mark.parametrize("name", ["skyformer", "skeinformer", "informer"])
def test_position_draws_are_integers_that_a_half_precision_model_keeps(name):
    """Uniforms rounded to bf16 would keep 8 bits: far fewer distinct positions than tokens."""
    method = make(name)
    before = {key: buffer.clone() for key, buffer in method.named_buffers()}
    assert before
    method.to(torch.bfloat16)
    for key, buffer in method.named_buffers():
        assert not buffer.is_floating_point() and torch.equal(buffer, before[key])


def test_uniform_real_positions_maps_bits_to_real_tokens_exactly():
    """The floor(u m)-th real token, u = bits / 2**24, for any padding side: the smallest bits
    with u >= k / 6 pick the real token of rank floor(k m / 6)."""
    real = torch.tensor([[False, True, False, True, True, False], [True] * 6])  # m = 3 and 6
    bits = (torch.arange(6) * 2**24 + 5) // 6  # ceil(k 2**24 / 6)
    assert uniform_real_positions(bits, real).tolist() == [[1, 1, 3, 3, 4, 4], [0, 1, 2, 3, 4, 5]]
    assert uniform_real_positions(bits[1:] - 1, real).tolist() == [[1, 1, 3, 3, 4], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("name", ["skeinformer", "informer"])
def test_inputs_longer_than_the_draws_are_refused(name):
    q, k, v, _ = qkv_mask(seq=90)
    with pytest.raises(ValueError, match="extend_position_embeddings"):
        make(name, max_seq_len=64, **SAMPLED_OPTIONS[name])(q, k, v)
    make(name, max_seq_len=64, **SAMPLED_OPTIONS[name]).train()(q, k, v)  # training draws afresh


@pytest.mark.parametrize("name", ["skeinformer", "informer"])
def test_extending_the_position_table_redraws_as_a_reload_does(name, tmp_path):
    """After extend_position_embeddings a patched model takes the longer inputs, and it is the model
    that save / reload builds from the extended config (same draws)."""
    config = T.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    model = hea.AutoModel.from_config(config, attn_impl=name, attn_config=SAMPLED_OPTIONS[name]).eval()
    hea.extend_position_embeddings(model, max_length=150)
    ids = torch.randint(5, 50, (2, 140))
    mask = torch.ones(2, 140, dtype=torch.long)
    mask[1, 100:] = 0
    model.save_pretrained(tmp_path)
    reloaded = hea.AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask).last_hidden_state for m in (model, reloaded))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_traced_informer_bounds_its_counts_statically_with_the_same_output(monkeypatch):
    """Traced, U and u are bounded by max_seq_len (the log of a symbolic length cannot stay
    symbolic) rather than by n; the extra samples and ranks are masked."""
    method = make("informer", max_seq_len=512, factor=2)
    q, k, v, mask = qkv_mask()
    eager = method(q, k, v, mask)
    monkeypatch.setattr(informer, "is_tracing", lambda: True)
    assert method.count_bound(90) > informer.informer_count_of(90, 2)
    torch.testing.assert_close(method(q, k, v, mask), eager, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lengths", [[90, 61], [90, 9], [12, 9]])  # none, one, every sequence short
def test_traced_nystromformer_computes_both_forms_with_the_same_output(monkeypatch, lengths):
    method = make("nystromformer", num_landmarks=16)
    q, k, v, _ = qkv_mask()
    mask = torch.arange(90) < torch.tensor(lengths)[:, None]
    eager = method(q, k, v, mask)
    monkeypatch.setattr(nystromformer, "is_tracing", lambda: True)
    torch.testing.assert_close(method(q, k, v, mask), eager, atol=0, rtol=0)
