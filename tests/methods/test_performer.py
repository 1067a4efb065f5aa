"""Performer / FAVOR+: estimator properties, orthogonal features, seeding, stabilisation."""

import math

import pytest
import torch

from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.performer import orthogonal_gaussian_features
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM, SEQ = 2, 16, 48


def make(layer_idx=0, **options):
    return build_method(MethodChoice.of("performer", options), AttentionShape(HEADS, DIM, 128, layer_idx)).eval()


def qkv(scale=1.0, batch=2, seq=SEQ, dtype=torch.float32):
    return [(torch.randn(batch, HEADS, seq, DIM) * scale).to(dtype) for _ in range(3)]


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def favor_reference(q, k, v, features, scaling):
    """Dense float64 FAVOR+ from its definition, in log space (no max shift, no eps):
    A_ij = mean_r exp(w_r.x_i - |x_i|^2/2 + w_r.y_j - |y_j|^2/2), out = row-normalised A V."""
    q, k, v, w = q.double() * scaling**0.5, k.double() * scaling**0.5, v.double(), features.double()
    log_q = q @ w.T - q.square().sum(-1, keepdim=True) / 2  # (B, H, N, m)
    log_k = k @ w.T - k.square().sum(-1, keepdim=True) / 2
    log_a = torch.logsumexp(log_q.unsqueeze(-2) + log_k.unsqueeze(-3), dim=-1)  # (B, H, N, N)
    return torch.softmax(log_a, dim=-1) @ v


def test_relative_error_to_softmax_decreases_with_num_features():
    """FAVOR+ converges to softmax(QK^T/sqrt(d)) V; the error shrinks about as 1/sqrt(m)."""
    q, k, v = qkv(scale=0.5)
    ref = softmax_reference(q, k, v)
    errors = {m: sum(relative_error(make(num_features=m, seed=s)(q, k, v), ref) for s in range(4)) / 4 for m in (64, 512, 4096)}
    assert errors[64] > errors[512] > errors[4096]
    assert errors[4096] < errors[64] / 4  # 1/sqrt(m) predicts a factor 8
    assert errors[4096] < 0.06


def test_positive_features_estimate_the_softmax_kernel_without_bias():
    """E_w[exp(w.x - |x|^2/2) exp(w.y - |y|^2/2)] = exp(x.y) when each row w is N(0, I): the
    orthogonal rows with chi norms must keep that Gaussian marginal (Lemma 1)."""
    torch.manual_seed(1)
    x, y = torch.randn(2, 8, dtype=torch.float64) * 0.4
    gen = torch.Generator(torch.get_default_device()).manual_seed(0)
    w = torch.cat([orthogonal_gaussian_features(4096, 8, gen).double() for _ in range(25)])
    samples = torch.exp(w @ x - x.square().sum() / 2) * torch.exp(w @ y - y.square().sum() / 2)
    exact = torch.exp(x @ y)
    standard_error = samples.std() / math.sqrt(len(samples))
    assert abs(samples.mean() - exact) < 4 * standard_error
    # A fixed norm sqrt(d) (instead of chi) would change the second moment of w: check it too.
    assert abs(w.square().sum(1).mean().item() - 8) < 0.1
    assert abs(w.square().sum(1).var().item() - 2 * 8) < 1.0  # chi^2_8 has variance 16


@pytest.mark.parametrize("num_features, dim", [(16, 8), (20, 8), (5, 8), (256, 64)])
def test_features_are_orthogonal_within_blocks(num_features, dim):
    w = orthogonal_gaussian_features(num_features, dim, torch.Generator(torch.get_default_device()).manual_seed(3)).double()
    assert w.shape == (num_features, dim)
    for start in range(0, num_features, dim):
        block = w[start : start + dim]
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 1e-4 * gram.diagonal().max()
    if num_features > dim:  # rows of different blocks are independent, not orthogonal
        assert (w[:dim] @ w[dim : 2 * dim].T).abs().max() > 0.1


def test_output_matches_dense_favor_formula():
    """Max shift and eps (1e-6) leave the float64 log-space formula (neither) nearly unchanged."""
    method = make(num_features=64)
    for scale, tolerance in ((0.5, 1e-4), (1.0, 5e-3)):
        q, k, v = qkv(scale=scale)
        assert relative_error(method(q, k, v), favor_reference(q, k, v, method.features, DIM**-0.5)) < tolerance


def test_large_query_norms_stay_finite_and_exact():
    """|q| d^-1/4 ~ 20: exp(w.x - |x|^2/2) underflows float32 for every feature without the shift."""
    method = make(num_features=64)
    q, k, v = qkv(scale=0.5)
    q = q * 20
    out = method(q, k, v)
    assert torch.isfinite(out).all()
    assert relative_error(out, favor_reference(q, k, v, method.features, DIM**-0.5)) < 1e-3


def test_custom_scaling_applies_its_square_root_to_q_and_k():
    method = make(num_features=4096)
    q, k, v = qkv(scale=0.5)
    out = method(q, k, v, scaling=0.1)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.1, -1) @ v.double()
    assert relative_error(out, ref) < 0.02
    torch.testing.assert_close(out.double(), favor_reference(q, k, v, method.features, 0.1), atol=1e-4, rtol=1e-4)


def test_padded_keys_are_excluded_from_the_dense_formula():
    method = make(num_features=64)
    q, k, v = qkv(batch=1)
    mask = torch.ones(1, SEQ, dtype=torch.bool)
    mask[:, 30:] = False
    # Padded keys at the longest feature w maximise w.x - |x|^2/2 (= |w|^2/2): they would set the
    # key max-shift, pushing real key features down to eps, if they were not masked out of it.
    longest = method.features[method.features.norm(dim=1).argmax()]
    k[:, :, 30:] = longest * DIM**0.25
    out = method(q, k, v, mask)[:, :, :30]
    ref = favor_reference(q[:, :, :30], k[:, :, :30], v[:, :, :30], method.features, DIM**-0.5)
    assert relative_error(out, ref) < 5e-3


def test_same_seed_same_output_different_seed_or_layer_different():
    q, k, v = qkv()
    out = make(seed=7)(q, k, v)
    torch.testing.assert_close(make(seed=7)(q, k, v), out, atol=0, rtol=0)
    assert not torch.allclose(make(seed=8)(q, k, v), out)
    assert not torch.equal(make(seed=7, layer_idx=1).features, make(seed=7).features)


def test_features_are_a_non_persistent_buffer_regenerated_from_the_seed():
    method = make(seed=3)
    assert "features" not in method.state_dict() and list(method.parameters()) == []
    torch.testing.assert_close(method.features, make(seed=3).features, atol=0, rtol=0)
    assert method.features.shape == (256, DIM)  # default num_features (official code: 256)


def test_redraw_only_in_training():
    q, k, v = qkv()
    fixed = make(num_features=32).train()
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    redraw = make(num_features=32, redraw=True).train()
    assert not torch.allclose(redraw(q, k, v), redraw(q, k, v))
    redraw.eval()
    torch.testing.assert_close(redraw(q, k, v), fixed.eval()(q, k, v), atol=0, rtol=0)


@pytest.mark.parametrize("options", [{"num_features": 0}, {"num_features": 1.5}, {"seed": "a"}, {"redraw": 1}])
def test_invalid_options_are_rejected(options):
    with pytest.raises(ValueError, match="num_features|seed|redraw"):
        make(**options)
