"""Kernelized attention and Skyformer (Chen et al., NeurIPS 2021): dense float64 references, the exactness limit of
the modified Nystrom method, convergence in the number of landmarks, landmark sampling."""

import pytest
import torch

from hf_efficient_attn.methods.base import AttentionShape, random_bits
from hf_efficient_attn.methods.skyformer import kernelized_attention, sample_landmarks, skyformer_attention
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM = 2, 16
P_QUARTER = DIM**-0.25  # the data scale p^(-1/4) of eq. (3)


def make(name, layer_idx=0, **options):
    return build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, 128, layer_idx)).eval()


def qkv(batch=2, seq=32, scale=0.5, dtype=torch.float64):
    return [torch.randn(batch, HEADS, seq, DIM, dtype=dtype) * s for s in (scale, scale, 1.0)]


def padding_mask(batch=2, seq=32, real=20):
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, real:] = False
    return mask


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def gaussian_reference(q, k, v, mask):
    """Float64 eq. (3) through pairwise distances: exp(-|q_i - k_j|^2 / (2 sqrt(p))) v_j."""
    dist = torch.cdist(q.double(), k.double()) ** 2
    weights = torch.exp(-dist / (2 * DIM**0.5)) * mask[:, None, None, :]
    return weights @ v.double()


def nystrom_reference(q, k, v, mask, landmarks, gamma):
    """Float64 eqs. (4)-(6) with an explicit 2n x d sketching matrix S (column j counts how often
    each row of [Q; K] was drawn for it) and a direct solve with (S^T C_bar S + gamma I)."""
    batch, _, seq, _ = q.shape
    points = torch.cat([q, k], 2).double() * P_QUARTER
    c_bar = torch.exp(-(torch.cdist(points, points) ** 2) / 2)
    sketch = torch.zeros(batch, 2 * seq, landmarks.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for m in range(landmarks.shape[1]):
            for j, row in enumerate(landmarks[b, m].tolist()):
                sketch[b, row, j] += 1
    sketch = sketch[:, None]
    middle = sketch.mT @ c_bar @ sketch + gamma * torch.eye(sketch.shape[-1], dtype=torch.float64)
    approx = c_bar @ sketch @ torch.linalg.solve(middle, sketch.mT @ c_bar)  # eq. (5)
    block = approx[..., :seq, seq:] * mask[:, None, None, :]  # eq. (6): query rows, key columns
    return block @ v.double()


def test_kernelized_matches_dense_float64_formula():
    q, k, v = qkv(dtype=torch.float32)
    mask = padding_mask()
    out = make("kernelized")(q, k, v, mask)
    torch.testing.assert_close(out.double(), gaussian_reference(q, k, v, mask) * mask[:, None, :, None], atol=1e-5, rtol=1e-5)


def test_kernelized_gradients_match_the_dense_formula():
    q, k, v = (t.requires_grad_() for t in qkv(seq=12))
    mask = padding_mask(seq=12, real=7)
    grad_out = torch.randn(2, HEADS, 12, DIM, dtype=torch.float64)
    grads = torch.autograd.grad(kernelized_attention(q, k, v, mask, P_QUARTER), (q, k, v), grad_out)
    expected = torch.autograd.grad(gaussian_reference(q, k, v, mask), (q, k, v), grad_out)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_skyformer_is_kernelized_when_landmarks_cover_every_token():
    """S = I_2n (every row of [Q; K] once), gamma -> 0, converged inverse: eq. (5) is C_bar."""
    q, k, v = qkv()
    mask = padding_mask()
    all_rows = torch.arange(64).expand(2, 1, 64)
    out = skyformer_attention(q, k, v, mask, all_rows, P_QUARTER, gamma=1e-10, pinv_iterations=40)
    ref = kernelized_attention(q, k, v, mask, P_QUARTER)
    torch.testing.assert_close(out, ref, atol=1e-8, rtol=1e-7)
    # gamma > 0 is the regularised C_bar (C_bar + gamma I)^-1 C_bar: close to C_bar, not equal
    biased = skyformer_attention(q, k, v, mask, all_rows, P_QUARTER, gamma=0.1, pinv_iterations=40)
    assert 1e-4 < relative_error(biased, ref) < 0.2


@pytest.mark.parametrize("accumulation", [1, 2])
def test_skyformer_matches_dense_nystrom_formula_for_sampled_landmarks(accumulation):
    q, k, v = qkv()
    mask = padding_mask()
    bits = random_bits((accumulation * 12,), torch.Generator(torch.get_default_device()).manual_seed(3))
    landmarks = sample_landmarks(mask, (2, 32), bits, accumulation)
    out = skyformer_attention(q, k, v, mask, landmarks, P_QUARTER, gamma=0.1, pinv_iterations=40)
    torch.testing.assert_close(out, nystrom_reference(q, k, v, mask, landmarks, 0.1), atol=1e-8, rtol=1e-7)


def test_skyformer_converges_to_kernelized_as_landmarks_grow():
    q, k, v = qkv(batch=1)
    ref = kernelized_attention(q, k, v, None, P_QUARTER)

    def mean_error(d, iterations):
        methods = [make("skyformer", num_landmarks=d, seed=s, pinv_iterations=iterations) for s in range(3)]
        return sum(relative_error(m(q, k, v), ref) for m in methods) / len(methods)

    default = [mean_error(d, 6) for d in (4, 16, 64, 256)]
    assert default[0] > default[1] > default[2] > default[3]
    assert default[3] < 0.1
    assert mean_error(256, 30) < 0.01  # a converged inverse leaves only the gamma / count bias


def test_landmarks_are_real_tokens_half_queries_half_keys_and_uniform():
    mask = torch.zeros(3, 50, dtype=torch.bool)
    mask[0, :20] = True  # right padding
    mask[1, 30:] = True  # left padding
    mask[2, ::5] = True  # scattered real tokens
    rows = sample_landmarks(mask, (3, 50), random_bits((4000,), torch.Generator(torch.get_default_device()).manual_seed(0)), 1)
    rows = rows[:, 0]
    assert (rows[:, :2000] < 50).all() and (rows[:, 2000:] >= 50).all()
    for b in range(3):
        positions = rows[b] % 50
        assert mask[b, positions].all()
        counts = torch.bincount(positions[:2000], minlength=50)[mask[b]].double()
        expected = 2000 / mask[b].sum()
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 3 * len(counts)  # df = L - 1; uniform draws give about L


def test_sampling_is_seeded_in_eval_and_fresh_in_training():
    q, k, v = qkv(seq=40)
    method = make("skyformer", num_landmarks=16)
    torch.testing.assert_close(method(q, k, v), method(q, k, v), atol=0, rtol=0)
    assert not torch.equal(method(q, k, v), make("skyformer", num_landmarks=16, seed=1)(q, k, v))
    assert not torch.equal(method(q, k, v), make("skyformer", num_landmarks=16, layer_idx=1)(q, k, v))
    method.train()
    assert not torch.equal(method(q, k, v), method(q, k, v))


def test_a_sequence_does_not_depend_on_its_batch_mates():
    method = make("skyformer", num_landmarks=16)
    q, k, v = qkv(batch=1, seq=24)
    others = qkv(batch=2, seq=24)
    batch = [torch.cat([t, o]) for t, o in zip((q, k, v), others)]
    torch.testing.assert_close(method(*batch)[:1], method(q, k, v))


def test_gradients_flow_through_kernel_values():
    q, k, v = (t.requires_grad_() for t in qkv(seq=20))
    make("skyformer", num_landmarks=8)(q, k, v, padding_mask(seq=20, real=12)).square().sum().backward()
    assert all(t.grad.abs().sum() > 0 and torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (k.grad[1, :, 12:] == 0).all() and (v.grad[1, :, 12:] == 0).all()  # padded keys unused


@pytest.mark.parametrize("bad", [{"gamma": 0}, {"num_landmarks": 0}, {"accumulation": 0}, {"pinv_iterations": 1.5}, {"seed": -1}])
def test_invalid_options_are_rejected(bad):
    with pytest.raises(ValueError):
        make("skyformer", **bad)


def test_skyformer_inverse_of_its_normalised_matrix_matches_torch_pinv():
    """Lemma 3: the normalised matrix has spectral norm <= 1, so Z_0 = N^T / ||N||_1 converges."""
    from hf_efficient_attn.methods.nystromformer import iterative_pinv

    points = torch.randn(2, 16, 4, dtype=torch.float64)
    kernel = torch.exp(-torch.cdist(points, points).square() / 2) + 0.1 * torch.eye(16, dtype=torch.float64)
    d = kernel.sum(-1).rsqrt()
    normalised = d[..., :, None] * kernel * d[..., None, :]
    assert torch.linalg.matrix_norm(normalised, ord=2).max() <= 1 + 1e-12
    torch.testing.assert_close(
        iterative_pinv(normalised, 40, spectral_norm_at_most_one=True), torch.linalg.pinv(normalised), atol=1e-8, rtol=1e-7
    )
