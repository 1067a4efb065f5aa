"""Skeinformer and V-Mean (Chen, Zeng et al., NAACL 2022): exactness limits, dense float64 references of eqs. (5)-(6)
and of the ablations, the without-replacement sampler, pilot reutilisation, padding."""

import itertools
import math

import pytest
import torch

from hf_efficient_attn.methods import skeinformer as skein
from hf_efficient_attn.methods.base import AttentionShape, random_bits
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM = 2, 16
ABLATIONS = [
    dict(column_sampling=c, row_normalization=r, pilot_reuse=p)
    for c, r, p in itertools.product(["importance", "uniform"], ["adaptive", "simple", "none"], [True, False])
]


def make(name, **options):
    return build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, 256)).eval()


def qkv(batch=2, seq=40, scale=1.0, dtype=torch.float64):
    return [torch.randn(batch, HEADS, seq, DIM, dtype=dtype) * s for s in (scale, scale, 1.0)]


def lengths_mask(lengths, seq):
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def relative_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("options", ABLATIONS)
def test_exact_when_num_samples_covers_the_sequence(options):
    q, k, v = qkv()
    mask = lengths_mask([40, 27], 40)
    real = mask[:, None, :, None]  # padded query rows are zeroed by the base forward
    for num_samples in (40, 500):  # >= n: exact attention directly
        out = make("skeinformer", num_samples=num_samples, **options)(q, k, v, mask)
        torch.testing.assert_close(out, softmax_reference(q, k, v, mask) * real, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("options", ABLATIONS)
def test_exact_when_every_real_column_is_drawn(options):
    """n > d >= m: Algorithm 1 itself draws every real column (m - d = 0 in eq. 6)."""
    q, k, v = qkv(seq=40)
    mask = lengths_mask([30, 17], 40)
    out = make("skeinformer", num_samples=32, **options)(q, k, v, mask)
    real = mask[:, None, :, None]
    torch.testing.assert_close(out * real, softmax_reference(q, k, v, mask) * real, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("normalization", ["adaptive", "simple", "none"])
def test_error_decreases_with_num_samples(normalization):
    seq, errors = 256, []
    for num_samples in (8, 32, 128, 240):
        trial_errors = []
        for seed in range(4):
            q, k, v = qkv(batch=1, seq=seq)
            method = make("skeinformer", num_samples=num_samples, row_normalization=normalization, seed=seed)
            trial_errors.append(relative_error(method(q, k, v), softmax_reference(q, k, v)))
        errors.append(sum(trial_errors) / len(trial_errors))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.3


def test_adaptive_skeinformer_beats_vmean():
    q, k, v = qkv(batch=2, seq=256)
    ref = softmax_reference(q, k, v)
    skein_error = relative_error(make("skeinformer", num_samples=128)(q, k, v), ref)
    assert skein_error < 0.8 * relative_error(make("vmean")(q, k, v), ref)


def test_column_probabilities_match_eq5_computed_by_loops():
    seq, real_len = 7, 5
    q, k, v = qkv(batch=1, seq=seq)
    q, k, v = q[:, :1], k[:, :1], v[:, :1]
    real = lengths_mask([real_len], seq)
    pilot = [3, 0, 3]  # with replacement
    pilot_rows, _ = skein.masked_softmax_attention(q[:, :, pilot], k, v, real, DIM**-0.5)
    probs = skein.column_probabilities(pilot_rows, v, real)[0, 0]

    def b(j, i):  # element of B = D^-1 A over the real keys
        if i >= real_len:
            return 0.0
        a = [math.exp(float(q[0, 0, j] @ k[0, 0, t]) / math.sqrt(DIM)) for t in range(real_len)]
        return a[i] / sum(a)

    weights = [math.sqrt(sum(b(j, i) ** 2 for j in pilot)) * float(v[0, 0, i].norm()) for i in range(seq)]
    expected = torch.tensor([w / sum(weights) for w in weights], dtype=torch.float64)
    torch.testing.assert_close(probs, expected, atol=1e-12, rtol=1e-10)
    assert (probs[real_len:] == 0).all()


def test_sampler_draws_successively_proportional_to_probs():
    """Gumbel top-2: P(i drawn) = p_i + sum_{j != i} p_j p_i / (1 - p_j); padded never drawn."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0, 0.0], dtype=torch.float64)
    real = torch.tensor([[True, True, True, True, True, False]])
    trials = 40000
    gen = torch.Generator(torch.get_default_device()).manual_seed(0)
    drawn = skein.sample_without_replacement(probs.expand(1, trials, -1), real, 2, random_bits((1, trials, 6), gen))
    assert (drawn[..., 0] != drawn[..., 1]).all() and (drawn != 5).all()
    frequency = torch.bincount(drawn.flatten(), minlength=6).double() / trials
    p = probs.tolist()
    expected = torch.tensor([p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(6) if j != i) for i in range(6)])
    torch.testing.assert_close(frequency, expected.double(), atol=0.01, rtol=0)
    # d >= m: every real column, including the zero-probability one, before any padded column
    every = skein.sample_without_replacement(probs.expand(1, 50, -1), real, 6, random_bits((1, 50, 6), gen))[..., :5]
    assert (every.sort(-1).values == torch.arange(5)).all()


def record(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper that records what the function returns."""
    recorded, function = [], getattr(module, name)

    def wrapped(*args, **kwargs):
        recorded.append(function(*args, **kwargs))
        return recorded[-1]

    monkeypatch.setattr(module, name, wrapped)
    return recorded


def dense_reference(q, k, v, real, columns, normalization, probs=None):
    """Float64, per (b, h, i): eq. (6) ("adaptive"), softmax over the sampled columns ("simple"),
    or D^-1 A S S^T V with exact D and weights 1/(d p_j) ("none")."""
    out = torch.zeros_like(v)
    s = DIM**-0.5
    for b, h in itertools.product(range(q.shape[0]), range(q.shape[1])):
        m = int(real[b].sum())
        cols = [c for c in columns[b, h].tolist() if real[b, c]]
        d = len(cols)
        for i in range(q.shape[2]):
            logits = torch.stack([q[b, h, i] @ k[b, h, j] * s for j in cols])
            a = logits.exp()
            if normalization == "adaptive":
                g = a.prod() ** (1 / d)
                unselected = sum(v[b, h, j] for j in range(m) if real[b, j] and j not in cols)
                out[b, h, i] = (a @ v[b, h, cols] + g * unselected) / (a.sum() + (m - d) * g)
            elif normalization == "simple":
                out[b, h, i] = a @ v[b, h, cols] / a.sum()
            else:
                row_sum = sum((q[b, h, i] @ k[b, h, j] * s).exp() for j in range(q.shape[2]) if real[b, j])
                w = torch.stack([1 / (d * probs[b, h, j]) for j in cols])
                out[b, h, i] = (a * w) @ v[b, h, cols] / row_sum
    return out


@pytest.mark.parametrize("normalization", ["adaptive", "simple", "none"])
def test_row_normalisations_match_dense_formulas(monkeypatch, normalization):
    recorded = record(monkeypatch, skein, "sample_without_replacement")
    probs_seen = record(monkeypatch, skein, "column_probabilities")
    q, k, v = qkv(seq=24)
    mask = lengths_mask([24, 15], 24)
    method = make("skeinformer", num_samples=6, row_normalization=normalization, pilot_reuse=False)
    out = method(q, k, v, mask)
    (columns,) = recorded
    ref = dense_reference(q, k, v, mask, columns, normalization, probs_seen[0])
    real = mask[:, None, :, None]
    torch.testing.assert_close(out * real, ref * real, atol=1e-10, rtol=1e-9)


def test_pilot_rows_are_exact_and_the_rest_unchanged():
    q, k, v = qkv(seq=64)
    mask = lengths_mask([64, 41], 64)
    reuse = make("skeinformer", num_samples=8)(q, k, v, mask)
    no_reuse = make("skeinformer", num_samples=8, pilot_reuse=False)(q, k, v, mask)  # same draws
    ref = softmax_reference(q, k, v, mask)
    changed = (reuse - no_reuse).abs().amax(-1) > 0
    assert changed.any() and (changed.sum(-1) <= 8).all()
    torch.testing.assert_close(reuse[changed], ref[changed], atol=1e-12, rtol=1e-10)
    assert not changed[1, :, 41:].any()  # pilot rows are real tokens


@pytest.mark.parametrize("options", ABLATIONS)
def test_sampled_path_ignores_padded_keys(options):
    method = make("skeinformer", num_samples=12, **options)
    q, k, v = qkv(seq=70, dtype=torch.float32)
    mask = lengths_mask([70, 45], 70)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 45:] = torch.randn_like(k2[1, :, 45:]) * 10
    v2[1, :, 45:] = torch.randn_like(v2[1, :, 45:]) * 10
    torch.testing.assert_close(method(q, k, v, mask), method(q, k2, v2, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("options", ABLATIONS)
def test_sampled_path_appending_padding_keeps_real_outputs(options):
    """Eval draws are tied to positions (per head: d pilot uniforms, one Gumbel variable per key
    position), so a sequence's draws do not depend on how far it is padded, nor on its batch."""
    method = make("skeinformer", num_samples=12, **options)
    q, k, v = qkv(batch=1, seq=45, dtype=torch.float32)
    padded = [torch.cat([t, torch.randn(1, HEADS, 25, DIM)], 2) for t in (q, k, v)]
    batch = [torch.cat([p, o]) for p, o in zip(padded, qkv(batch=1, seq=70, dtype=torch.float32))]
    mask = lengths_mask([45, 70], 70)
    torch.testing.assert_close(method(*batch, mask)[:1, :, :45], method(q, k, v), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("options", ABLATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sampled_path_half_precision_finite(options, dtype):
    method = make("skeinformer", num_samples=12, **options).train()
    q, k, v = (t.requires_grad_() for t in qkv(seq=70, scale=2.0, dtype=dtype))
    out = method(q, k, v, lengths_mask([70, 45], 70))
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_sequence_without_real_tokens_stays_finite():
    q, k, v = (t.requires_grad_() for t in qkv(seq=30, dtype=torch.float32))
    out = make("skeinformer", num_samples=8)(q, k, v, lengths_mask([30, 0], 30))
    out.square().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_vmean_is_the_masked_mean_of_values():
    q, k, v = qkv(seq=20)
    mask = torch.rand(2, 20) < 0.6
    mask[:, 0] = True
    out = make("vmean")(q, k, v, mask)
    for b in range(2):
        expected = v[b][:, mask[b]].mean(1)  # (H, D)
        torch.testing.assert_close(out[b][:, mask[b]], expected[:, None].expand(-1, int(mask[b].sum()), -1))
        assert (out[b][:, ~mask[b]] == 0).all()


def test_options_are_validated():
    for bad in (dict(num_samples=0), dict(column_sampling="topk"), dict(row_normalization="l2"), dict(pilot_reuse=1)):
        with pytest.raises(ValueError):
            make("skeinformer", **bad)
