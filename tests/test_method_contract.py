"""Properties every registered method must have (design.md, "The method contract")."""

import pytest
import torch

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import build_method, get_method_class

METHODS = hea.list_methods()
BATCH, HEADS, SEQ, DIM, REAL = 2, 2, 70, 16, 45  # SEQ deliberately not a power of two


def make_method(name, seq=SEQ, **options):
    module = build_method(name, options, AttentionShape(HEADS, DIM, max_seq_len=128))
    return module.eval()


def make_qkv(seq=SEQ, dtype=torch.float32, requires_grad=False):
    qkv = torch.randn(3, BATCH, HEADS, seq, DIM) * 0.5
    return [t.to(dtype).requires_grad_(requires_grad) for t in qkv.unbind(0)]


def padding_mask(seq=SEQ):
    mask = torch.ones(BATCH, seq, dtype=torch.bool)
    mask[1, REAL:] = False
    return mask


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("seq", [1, 7, SEQ, 128])
def test_shape_any_length(name, seq):
    q, k, v = make_qkv(seq)
    out = make_method(name)(q, k, v, padding_mask(seq) if seq > REAL else None)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", METHODS)
def test_padded_keys_get_no_weight(name):
    """Changing the keys and values of padded tokens leaves every real output unchanged."""
    method, mask = make_method(name), padding_mask()
    q, k, v = make_qkv()
    k2, v2 = k.clone(), v.clone()
    k2[1, :, REAL:] = torch.randn_like(k2[1, :, REAL:]) * 10
    v2[1, :, REAL:] = torch.randn_like(v2[1, :, REAL:]) * 10
    out, out2 = method(q, k, v, mask), method(q, k2, v2, mask)
    torch.testing.assert_close(out[1, :, :REAL], out2[1, :, :REAL], atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out).all() and (out[1, :, REAL:] == 0).all()


@pytest.mark.parametrize("name", METHODS)
def test_inf_and_nan_in_padded_positions_do_not_leak(name):
    method, mask = make_method(name), padding_mask()
    q, k, v = make_qkv()
    expected = method(q, k, v, mask)
    for t in (q, k, v):
        t[1, :, REAL:] = float("nan")
    q[1, :, -1] = float("inf")
    torch.testing.assert_close(method(q, k, v, mask), expected, atol=0, rtol=0)


@pytest.mark.parametrize("name", [n for n in METHODS if get_method_class(n).padding_invariant])
def test_appending_padding_keeps_real_outputs(name):
    method = make_method(name)
    q, k, v = make_qkv(REAL)
    extra = [torch.randn(BATCH, HEADS, SEQ - REAL, DIM) for _ in range(3)]
    qp, kp, vp = (torch.cat([t, e], dim=2) for t, e in zip((q, k, v), extra))
    mask = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    mask[:, :REAL] = True
    torch.testing.assert_close(method(qp, kp, vp, mask)[:, :, :REAL], method(q, k, v), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_forward_backward_finite(name, dtype):
    method = make_method(name).train().to(dtype)
    q, k, v = make_qkv(dtype=dtype, requires_grad=True)
    out = method(q, k, v, padding_mask())
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert v.grad.abs().sum() > 0


@pytest.mark.parametrize("name", METHODS)
def test_autocast_keeps_the_method_precision(name):
    """Under Trainer's fp16/bf16 autocast a method computes as it would without autocast."""
    method, mask = make_method(name), padding_mask()
    q, k, v = make_qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = method(q, k, v, mask)
    torch.testing.assert_close(low, method(q, k, v, mask), atol=1e-6, rtol=1e-5)


#: Options that make a method's backward the true gradient of its forward (and make Skeinformer
#: sample: 8 pilot rows of 9 real tokens, drawn with replacement, so some repeat).
GRADCHECK_OPTIONS = {"linformer": {"k": 8}, "yoso_e": {"gradient": "exact"}, "skeinformer": {"num_samples": 8}}
#: Performer's positive features carry the official eps stabiliser after a detached shift, so
#: its gradient is exact only to about eps / smallest feature.
GRADCHECK_ATOL = {"performer": 2e-3}


@pytest.mark.parametrize("name", [n for n in METHODS if n not in ("mra2", "mra2_s", "informer", "yoso")])
def test_gradcheck_in_eval_mode(name):
    """Autograd equals finite differences (eval mode: samples fixed by the seed). Not here: MRA
    and Informer select blocks / queries by score, which small steps can flip (they have their
    own gradient tests); YOSO's backward is the paper's lower bound (eq. 3), by design."""
    options = GRADCHECK_OPTIONS.get(name, {})
    method = build_method(name, options, AttentionShape(1, 4, 16)).eval().double()
    q, k, v = (torch.randn(1, 1, 12, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, 9:] = False
    atol = GRADCHECK_ATOL.get(name, 1e-5)
    assert torch.autograd.gradcheck(lambda *t: method(*t, mask), (q, k, v), eps=1e-6, atol=atol)


@pytest.mark.parametrize("name", METHODS)
def test_eval_is_reproducible(name):
    method = make_method(name)
    q, k, v = make_qkv()
    torch.testing.assert_close(method(q, k, v, padding_mask()), method(q, k, v, padding_mask()), atol=0, rtol=0)


@pytest.mark.parametrize("name", METHODS)
def test_unknown_option_is_rejected_with_the_allowed_ones(name):
    with pytest.raises(ValueError, match="options are"):
        make_method(name, not_an_option=1)


def test_unknown_method_lists_known_ones():
    with pytest.raises(ValueError, match="softmax"):
        hea.efficient_attention(*make_qkv(), method="nope")


def test_cross_attention_is_rejected():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match="Cross-attention"):
        make_method("softmax")(q, k[:, :, :10], v[:, :, :10])
