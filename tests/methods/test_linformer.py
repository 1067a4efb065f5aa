"""Linformer (Wang et al. 2020): exactness limit, projections, sharing levels, length limit."""

import pytest
import torch
import transformers as T
from torch import nn

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

HEADS, DIM, MAX_LEN = 2, 8, 32


def make(layer_idx=0, max_len=MAX_LEN, **options):
    return build_method(MethodChoice.of("linformer", options), AttentionShape(HEADS, DIM, max_len, layer_idx)).eval()


def qkv(batch=2, seq=MAX_LEN, dtype=torch.float64):
    return [torch.randn(batch, HEADS, seq, DIM, dtype=dtype) for _ in range(3)]


def set_identity(method):
    with torch.no_grad():
        for param in method.parameters():
            param.copy_(torch.eye(param.shape[-1]).expand_as(param))


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value", "layerwise"])
def test_identity_projection_with_k_equal_n_is_exact_softmax(sharing):
    method = make(k=MAX_LEN, sharing=sharing).double()
    set_identity(method)
    q, k, v = qkv()
    torch.testing.assert_close(method(q, k, v), softmax_reference(q, k, v), atol=1e-12, rtol=1e-12)


def test_matches_dense_formula_of_eq7_with_random_projections_and_shorter_input():
    """softmax(Q (E[:, :n] K)^T / sqrt(d)) (F[:, :n] V), per head, computed independently."""
    method = make(k=5, sharing="none").double()
    n = 20
    q, k, v = qkv(seq=n)
    e, f = method.e_proj.detach(), method.f_proj.detach()
    expected = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(HEADS):
            scores = q[b, h] @ (e[h, :, :n] @ k[b, h]).T / DIM**0.5
            expected[b, h] = torch.softmax(scores, -1) @ (f[h, :, :n] @ v[b, h])
    torch.testing.assert_close(method(q, k, v), expected)


def test_padding_equals_the_unpadded_computation():
    method = make(k=6).double()
    q, k, v = qkv(batch=1, seq=20)
    mask = torch.ones(1, 20, dtype=torch.bool)
    mask[:, 13:] = False
    k[:, :, 13:], v[:, :, 13:] = 50.0, -50.0  # padded keys/values must not matter
    out = method(q, k, v, mask)
    torch.testing.assert_close(out[:, :, :13], method(q[:, :, :13], k[:, :, :13], v[:, :, :13]))
    assert (out[:, :, 13:] == 0).all()


@pytest.mark.parametrize(
    "sharing, names, shape",
    [
        ("none", {"e_proj", "f_proj"}, (HEADS, 4, MAX_LEN)),
        ("headwise", {"e_proj", "f_proj"}, (4, MAX_LEN)),
        ("key-value", {"e_proj"}, (4, MAX_LEN)),
        ("layerwise", {"e_proj"}, (4, MAX_LEN)),
    ],
)
def test_parameters_per_sharing_level(sharing, names, shape):
    method = make(k=4, sharing=sharing)
    params = dict(method.named_parameters())
    assert set(params) == names and all(p.shape == shape for p in params.values())
    e, f = method.projections()
    assert (e is f) == (sharing in ("key-value", "layerwise"))


def test_initialisation_is_xavier_uniform_with_gain_one_over_sqrt2():
    method = make(k=64, max_len=192, sharing="headwise")
    bound = (3 / (64 + 192)) ** 0.5
    for param in method.parameters():
        assert param.abs().max() <= bound and param.abs().max() > 0.9 * bound
        assert abs(param.var().item() - bound**2 / 3) < 0.1 * bound**2 / 3


class Attention(nn.Module):
    """Stands for a model's self-attention module, which holds its method as ``efficient_attn``."""

    def __init__(self, method):
        super().__init__()
        self.efficient_attn = method


class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.attention = nn.ModuleList(Attention(layer) for layer in layers)
        self.layers = [a.efficient_attn for a in self.attention]


def shared_stack(num_layers=3, **options):
    layers = [make(layer_idx=i, **options) for i in range(num_layers)]
    stack = Stack(layers)
    for layer in layers[1:]:
        layer.share_from(stack.attention[0])  # what patch_model does
    return stack


def test_layerwise_sharing_shares_one_tensor_saved_once():
    stack = shared_stack(k=4, sharing="layerwise")
    first = stack.layers[0].e_proj
    for layer in stack.layers:
        e, f = layer.projections()
        assert e is first and f is first
    assert list(stack.state_dict()) == ["attention.0.efficient_attn.e_proj"]
    assert sum(p.numel() for p in stack.parameters()) == first.numel()
    # One gradient accumulates from every layer into the single shared tensor.
    q, k, v = qkv(dtype=torch.float32)
    sum(layer(q, k, v).sum() for layer in stack.layers).backward()
    assert first.grad is not None and first.grad.abs().sum() > 0


def test_layerwise_state_dict_round_trip_and_device_moves_keep_sharing():
    saved = shared_stack(k=4, sharing="layerwise")
    loaded = shared_stack(k=4, sharing="layerwise")
    loaded.load_state_dict(saved.state_dict())
    loaded.double()
    q, k, v = qkv()
    for a, b in zip(saved.double().layers, loaded.layers):
        assert b.projections()[0] is loaded.layers[0].e_proj
        torch.testing.assert_close(a(q, k, v), b(q, k, v))


def test_patch_model_layerwise_saves_the_projection_once():
    config = T.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
    )
    model = hea.patch_model(T.BertModel(config).eval(), "linformer", {"k": 8})
    keys = [key for key in model.state_dict() if key.endswith(("e_proj", "f_proj"))]
    assert len(keys) == 1 and model.state_dict()[keys[0]].shape == (8, 40)
    assert torch.isfinite(model(input_ids=torch.randint(0, 50, (2, 40))).last_hidden_state).all()


def test_other_sharing_levels_keep_their_own_parameters_per_layer():
    stack = shared_stack(k=4, sharing="headwise")
    assert len(stack.state_dict()) == 6
    assert stack.layers[1].projections()[0] is stack.layers[1].e_proj


def test_too_long_sequence_names_the_maximum():
    q, k, v = qkv(seq=MAX_LEN + 1)
    with pytest.raises(ValueError, match=f"maximum {MAX_LEN}"):
        make(k=4)(q, k, v)


@pytest.mark.parametrize("options", [{"k": 0}, {"k": 2.5}, {"sharing": "kv"}, {"sharing": "all"}])
def test_invalid_options_are_rejected(options):
    with pytest.raises(ValueError, match="k|sharing"):
        make(**options)


def test_functional_api_takes_the_k_option_and_is_deterministic():
    q, k, v = qkv(dtype=torch.float32)
    first = hea.efficient_attention(q, k, v, method="linformer", k=8)
    torch.testing.assert_close(hea.efficient_attention(q, k, v, method="linformer", k=8), first, atol=0, rtol=0)
    state = torch.get_rng_state()
    hea.efficient_attention(q, k, v, method="linformer", k=8)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is untouched


def test_left_padding_is_refused_with_the_fix():
    q, k, v = qkv(batch=1, seq=20)
    mask = torch.ones(1, 20, dtype=torch.bool)
    mask[:, :5] = False  # left padding: real tokens would meet other columns of E than unpadded
    with pytest.raises(ValueError, match="padding_side = 'right'"):
        make(k=6).double()(q, k, v, mask)
