"""ProbSparse (Informer) attention: exactness limit, the top-u / lazy structure, the sampled
sparsity measurement against a float64 loop, padding."""

import math

import pytest
import torch

from hf_efficient_attn.methods import informer
from hf_efficient_attn.methods.base import AttentionShape, random_bits
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM = 2, 16


def make(**options):
    return build_method(MethodChoice.of("informer", options), AttentionShape(HEADS, DIM, 256)).eval()


def qkv(batch=2, seq=40, dtype=torch.float64):
    return [torch.randn(batch, HEADS, seq, DIM, dtype=dtype) for _ in range(3)]


def lengths_mask(lengths, seq):
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def expected_u(m, factor):
    return max(1, min(m, math.ceil(factor * math.ceil(math.log(m)))))


def test_exact_when_every_query_is_selected():
    q, k, v = qkv(seq=40)
    mask = lengths_mask([40, 23], 40)
    out = make(factor=20)(q, k, v, mask)  # u = 20 * 4 >= 40
    torch.testing.assert_close(out, softmax_reference(q, k, v, mask) * mask[:, None, :, None], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("factor", [1, 2.5, 5])
def test_top_u_queries_exact_and_the_others_the_mean_of_real_values(factor):
    seq, lengths = 96, [96, 50]
    q, k, v = qkv(seq=seq)
    mask = lengths_mask(lengths, seq)
    out = make(factor=factor)(q, k, v, mask)
    ref = softmax_reference(q, k, v, mask)
    for b, m in enumerate(lengths):
        mean = v[b, :, :m].mean(1, keepdim=True)
        exact = (out[b, :, :m] - ref[b, :, :m]).abs().amax(-1) < 1e-12
        lazy = (out[b, :, :m] - mean).abs().amax(-1) < 1e-12
        assert (exact ^ lazy).all()
        assert (exact.sum(-1) == expected_u(m, factor)).all()
        assert (out[b, :, m:] == 0).all()


def test_peaked_query_is_selected():
    q, k, v = qkv(batch=1, seq=128)
    q[:, :, 17] *= 30  # a large max - mean gap whichever keys are sampled
    out = make(factor=1)(q, k, v)
    torch.testing.assert_close(out[:, :, 17], softmax_reference(q, k, v)[:, :, 17], atol=1e-12, rtol=1e-10)


def test_measurement_matches_loop_over_sampled_keys(monkeypatch):
    recorded = []
    original = informer.uniform_real_positions
    monkeypatch.setattr(informer, "uniform_real_positions", lambda *a: recorded.append(original(*a)) or recorded[-1])
    seq, lengths, factor = 30, [30, 12], 2
    q, k, _ = qkv(seq=seq)
    mask = lengths_mask(lengths, seq)
    bits = random_bits((seq, informer.informer_count_of(seq, factor)), torch.Generator(torch.get_default_device()).manual_seed(0))
    measured = informer.sparsity_measurement(q, k, mask, DIM**-0.5, factor, bits)
    (positions,) = recorded  # (B, N, U_max)
    for b, m in enumerate(lengths):
        num_keys = expected_u(m, factor)
        assert (positions[b, :, :num_keys] < m).all()  # only real keys are sampled
        for h in range(HEADS):
            for i in range(seq):
                dots = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(DIM) for j in positions[b, i, :num_keys].tolist()]
                expected = max(dots) - sum(dots) / len(dots) if i < m else float("-inf")
                assert measured[b, h, i].item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_padded_keys_change_nothing_with_long_padding():
    method = make(factor=3)
    q, k, v = qkv(seq=100, dtype=torch.float32)
    mask = lengths_mask([100, 20], 100)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 20:] *= 50
    v2[1, :, 20:] *= 50
    torch.testing.assert_close(method(q, k, v, mask), method(q, k2, v2, mask), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_long_sequence_finite(dtype):
    q, k, v = (t.mul(3).to(dtype).requires_grad_() for t in qkv(seq=200, dtype=torch.float32))
    out = make(factor=2).train()(q, k, v, lengths_mask([200, 130], 200))
    out.float().square().sum().backward()
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_options_are_validated():
    for bad in (dict(factor=0), dict(factor=-1), dict(seed=1.5)):
        with pytest.raises(ValueError):
            make(**bad)
