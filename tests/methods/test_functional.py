"""hea.efficient_attention: one mask convention (True / 1 = real token, as Transformers'
attention_mask and SDPA's boolean attn_mask), and a clear error for any other mask."""

import pytest
import torch

import hf_efficient_attn as hea
from hf_efficient_attn.methods.softmax import softmax_reference

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

B, H, N, D, REAL = 2, 3, 40, 16, 27


def qkv():
    return [torch.randn(B, H, N, D) for _ in range(3)]


def test_true_marks_the_real_tokens():
    q, k, v = qkv()
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, REAL:] = False
    out = hea.efficient_attention(q, k, v, method="softmax", attention_mask=mask)
    alone = softmax_reference(q[1:, :, :REAL], k[1:, :, :REAL], v[1:, :, :REAL])
    torch.testing.assert_close(out[1, :, :REAL], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0], softmax_reference(q[:1], k[:1], v[:1])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_masks_of_a_tokenizer_mean_the_same(dtype):
    q, k, v = qkv()
    mask = torch.ones(B, N, dtype=dtype)
    mask[1, REAL:] = 0
    expected = hea.efficient_attention(q, k, v, method="mra2", attention_mask=mask.bool())
    torch.testing.assert_close(hea.efficient_attention(q, k, v, method="mra2", attention_mask=mask), expected)


def test_a_float_mask_is_refused_and_the_advice_for_its_form_gives_the_right_output():
    """A 0/1 float mask (a tokenizer's mask cast to float) and an additive one (0 / -inf) read opposite
    ways: each is refused with the conversion for its own form, and taking that advice gives the
    bool mask's output (the additive form's advice would mark a 0/1 mask's real tokens as padding)."""
    q, k, v = qkv()
    real = torch.ones(B, N, dtype=torch.bool)
    real[1, REAL:] = False
    expected = hea.efficient_attention(q, k, v, method="mra2", attention_mask=real)
    zero_one = real.float()
    additive = torch.zeros(B, N).masked_fill(~real, float("-inf"))
    cases = [(zero_one, r"this is a 0/1 mask .*: pass mask.bool\(\)$", zero_one.bool()),
             (additive, r"this is an additive mask .*: pass mask == 0$", additive == 0),
             (torch.finfo(torch.float32).min * (~real).float(), r"pass mask == 0$", None)]  # fmt: skip
    for mask, advice, taken in cases:
        with pytest.raises(ValueError, match="^attention_mask must be bool or integer .*" + advice):
            hea.efficient_attention(q, k, v, method="mra2", attention_mask=mask)
        if taken is not None:
            torch.testing.assert_close(hea.efficient_attention(q, k, v, method="mra2", attention_mask=taken), expected)
    with pytest.raises(ValueError, match=r"for a 0/1 mask .*mask.bool\(\); for an additive mask .*mask == 0$"):
        hea.efficient_attention(q, k, v, method="mra2", attention_mask=torch.rand(B, N))  # neither: both advices


@pytest.mark.parametrize("shape", [(B, N - 1), (B, 1, 1, N), (N,)])
def test_a_mask_of_another_shape_is_refused(shape):
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        hea.efficient_attention(*qkv(), method="mra2", attention_mask=torch.ones(shape, dtype=torch.bool))


def test_the_opposite_convention_is_not_silently_accepted():
    with pytest.raises(ValueError, match="not key_padding_mask"):
        hea.efficient_attention(*qkv(), method="mra2", key_padding_mask=torch.zeros(B, N, dtype=torch.bool))
