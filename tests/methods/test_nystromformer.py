"""Nystromformer: exactness when every token is a landmark, a dense float64 reference of the
Nystrom formula, the iterative pseudo-inverse, padding on either side, the convolution."""

import pytest
import torch

from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.nystromformer import iterative_pinv
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM = 2, 8


def make(**options):
    return build_method(MethodChoice.of("nystromformer", options), AttentionShape(HEADS, DIM, 128)).eval()


def qkv(batch=2, seq=40, scale=1.0, dtype=torch.float64):
    return [torch.randn(batch, HEADS, seq, DIM, dtype=dtype) * s for s in (scale, scale, 1.0)]


def nystrom_reference(q, k, v, mask, m):
    """Float64 F pinv(A) B V per sequence, over its real tokens only: segment j of L real tokens
    holds ranks ceil(j L / m) .. ceil((j + 1) L / m) - 1; torch.linalg.pinv for A^+."""
    out = torch.zeros_like(q, dtype=torch.float64)
    scale = DIM**-0.5
    for b in range(q.shape[0]):
        real = mask[b].nonzero().flatten()
        qb, kb, vb = (t[b][:, real].double() for t in (q, k, v))
        length = len(real)
        bounds = [-(-j * length // m) for j in range(m + 1)]
        q_land = torch.stack([qb[:, s:e].mean(1) for s, e in zip(bounds, bounds[1:])], dim=1)
        k_land = torch.stack([kb[:, s:e].mean(1) for s, e in zip(bounds, bounds[1:])], dim=1)
        f = torch.softmax(qb @ k_land.mT * scale, -1)
        a = torch.softmax(q_land @ k_land.mT * scale, -1)
        b_kernel = torch.softmax(q_land @ kb.mT * scale, -1)
        out[b][:, real] = f @ torch.linalg.pinv(a) @ b_kernel @ vb
    return out


@pytest.mark.parametrize("seq", [5, 37, 40])
@pytest.mark.parametrize("padded", [False, True])
def test_every_token_a_landmark_is_exact_softmax(seq, padded):
    q, k, v = qkv(seq=seq, dtype=torch.float32)
    mask = torch.ones(2, seq, dtype=torch.bool)
    if padded:
        mask[1, seq // 2 :] = False
    ref = softmax_reference(q, k, v, mask) * mask[:, None, :, None]
    torch.testing.assert_close(make(num_landmarks=seq)(q, k, v, mask), ref, atol=1e-5, rtol=1e-5)


def test_matches_dense_reference_with_padding_and_uneven_segments():
    """37 and 23 real tokens (padding on the right, then on the left) in 6 landmarks: segments of
    unequal length, means over real tokens only; 40 iterations make the inverse converge."""
    q, k, v = qkv(seq=40, scale=1.5)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[0, :37] = True
    mask[1, 17:] = True
    out = make(num_landmarks=6, pinv_iterations=40)(q, k, v, mask)
    torch.testing.assert_close(out, nystrom_reference(q, k, v, mask, 6), atol=1e-8, rtol=1e-7)


def test_default_iterations_approximate_softmax_better_with_more_landmarks():
    q, k, v = qkv(batch=1, seq=128, scale=0.5)
    ref = softmax_reference(q, k, v)
    errors = [((make(num_landmarks=m)(q, k, v) - ref).norm() / ref.norm()).item() for m in (4, 16, 64)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < errors[0] / 3


def test_iterative_pinv_matches_torch_pinv():
    torch.manual_seed(1)
    softmax_matrices = torch.softmax(torch.randn(4, 8, 8, dtype=torch.float64) * 2, -1)
    torch.testing.assert_close(iterative_pinv(softmax_matrices, 25), torch.linalg.pinv(softmax_matrices))
    # rank 3 of 8: the iteration converges to the Moore-Penrose pseudo-inverse, not an inverse
    low_rank = torch.randn(4, 8, 3, dtype=torch.float64) @ torch.randn(4, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(iterative_pinv(low_rank, 12), torch.linalg.pinv(low_rank), atol=1e-8, rtol=1e-7)
    # each matrix is scaled by its own norms: a batch-mate of very different size changes nothing
    mixed = torch.stack([softmax_matrices[0], 100 * softmax_matrices[1]])
    torch.testing.assert_close(iterative_pinv(mixed, 6)[0], iterative_pinv(softmax_matrices[:1], 6)[0])


def test_the_heads_coefficient_is_the_official_one_for_a_sequence_and_keeps_sequences_apart():
    """pinv_coefficient="heads": Z_0 = A^T / (largest column sum over the heads of the sequence), written
    out here; per matrix it differs; and a sequence's result does not depend on the others in its batch."""
    a = torch.randn(2, 3, 5, 5, dtype=torch.float64).softmax(-1)
    first_step = iterative_pinv(a, 0, coefficient_over_heads=True)
    expected = a.transpose(-1, -2) / a.sum(-2).amax(-1).amax(-1)[:, None, None, None]
    torch.testing.assert_close(first_step, expected)
    assert not torch.allclose(iterative_pinv(a, 0), expected)
    alone = iterative_pinv(a[1:], 6, coefficient_over_heads=True)
    torch.testing.assert_close(iterative_pinv(a, 6, coefficient_over_heads=True)[1:], alone)
    method = build_method(
        MethodChoice.of("nystromformer", {"num_landmarks": 4, "pinv_coefficient": "heads"}), AttentionShape(3, 8, 64)
    )
    q, k, v = (torch.randn(1, 3, 32, 8, dtype=torch.float64) for _ in range(3))
    per_matrix = build_method(MethodChoice.of("nystromformer", {"num_landmarks": 4}), AttentionShape(3, 8, 64))
    assert (method(q, k, v) - per_matrix(q, k, v)).abs().max() > 1e-6  # the option reaches the method


def test_padding_on_either_side_keeps_real_outputs_and_mixed_batches():
    """A sequence gives the same real outputs alone, right-padded or left-padded; in the same
    batch a sequence of at most m real tokens gets exact attention."""
    method = make(num_landmarks=8)
    q, k, v = qkv(batch=1, seq=30)
    alone = method(q, k, v)
    extra = qkv(batch=1, seq=10)
    right = [torch.cat([t, e], 2) for t, e in zip((q, k, v), extra)]
    left = [torch.cat([e, t], 2) for t, e in zip((q, k, v), extra)]
    short = qkv(batch=1, seq=40)
    mask = torch.zeros(3, 40, dtype=torch.bool)
    mask[0, :30], mask[1, 10:], mask[2, :6] = True, True, True
    batch = [torch.cat(parts) for parts in zip(right, left, short)]
    out = method(*batch, mask)
    torch.testing.assert_close(out[0, :, :30], alone[0])
    torch.testing.assert_close(out[1, :, 10:], alone[0])
    exact = softmax_reference(*(t[:, :, :6] for t in short))
    torch.testing.assert_close(out[2, :, :6], exact[0])


def test_convolution_is_a_learnable_depthwise_filter_on_real_values():
    method = make(num_landmarks=4, conv_kernel_size=3)
    assert method.conv.weight.shape == (HEADS, 1, 3, 1) and method.conv.weight.requires_grad
    q, k, v = qkv(seq=20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 12:] = False
    method.double()
    conv_part = method(q, k, v, mask) - make(num_landmarks=4)(q, k, v, mask)
    w = method.conv.weight[:, 0, :, 0]  # (H, 3): out_i += w0 v_(i-1) + w1 v_i + w2 v_(i+1)
    vm = v * mask[:, None, :, None]
    padded = torch.nn.functional.pad(vm, (0, 0, 1, 1))
    expected = sum(w[None, :, j, None, None] * padded[:, :, j : j + 20] for j in range(3))
    torch.testing.assert_close(conv_part, expected * mask[:, None, :, None])
    method(q, k, v, mask).sum().backward()
    assert method.conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("bad", [{"conv_kernel_size": 4}, {"num_landmarks": 0}, {"pinv_iterations": -1}, {"num_landmarks": 2.5}])
def test_invalid_options_are_rejected(bad):
    with pytest.raises(ValueError):
        make(**bad)
