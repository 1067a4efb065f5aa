"""Properties every registered method must have (design.md, "The method contract")."""

import re

import pytest
import torch

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import MethodChoice, build_method, get_method_class

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

METHODS = hea.list_methods()
BATCH, HEADS, SEQ, DIM, REAL = 2, 2, 70, 16, 45  # SEQ deliberately not a power of two


def make_method(name, seq=SEQ, **options):
    module = build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, max_seq_len=128))
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
def test_inf_and_nan_in_padded_positions_do_not_leak(name, repeat_tolerance):
    method, mask = make_method(name), padding_mask()
    q, k, v = make_qkv()
    expected = method(q, k, v, mask)
    for t in (q, k, v):
        t[1, :, REAL:] = float("nan")
    q[1, :, -1] = float("inf")
    torch.testing.assert_close(method(q, k, v, mask), expected, **repeat_tolerance)


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


#: Methods that run SDPA in the input's dtype (its fused kernel accumulates in fp32, but rounds
#: intermediates to the input dtype); every other method computes half inputs in fp32.
INPUT_DTYPE_METHODS = {"softmax", "linformer"}


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_fp32(name, dtype):
    """fp16/bf16 inputs give the fp32 computation on the same (rounded) inputs: rounded once at the
    end, bit for bit, for methods that compute in fp32; within half a unit of rounding on average
    for those that run SDPA in the input dtype."""
    seq, real = 300, 200
    method = build_method(MethodChoice.of(name, {"k": 16} if name == "linformer" else {}), AttentionShape(HEADS, 32, 512))
    method = method.eval().to(dtype)  # parameters and buffers in dtype, as in a half-precision model
    q, k, v = (torch.randn(BATCH, HEADS, seq, 32).mul(0.5).to(dtype) for _ in range(3))
    mask = torch.ones(BATCH, seq, dtype=torch.bool)
    mask[1, real:] = False
    low = method(q, k, v, mask)
    reference = method(q.float(), k.float(), v.float(), mask)
    if name in INPUT_DTYPE_METHODS:
        relative = (low.float() - reference).abs().mean() / reference.abs().mean()
        assert relative <= torch.finfo(dtype).eps / 2
    else:
        assert (low == reference.to(dtype)).float().mean() >= 0.99


@pytest.mark.parametrize("name", [n for n in METHODS if get_method_class(n).approximates_softmax and n != "vmean"])
def test_scaling_argument_is_used(name):
    """At a budget that makes it exact (Performer: many features), a method given ``scaling`` is
    closer to softmax attention with that scaling than with the default 1/sqrt(d); a method that
    ignored it would be closer to the latter. (V-Mean ignores scores by design.)"""
    seq = 64
    options = {
        "mra2": {"block_per_row": 2},
        "mra2_s": {"block_per_row": 2},
        "nystromformer": {"num_landmarks": seq},
        "skeinformer": {"num_samples": 4 * seq},
        "informer": {"factor": 100},
        "performer": {"num_features": 4096},
        "linformer": {"k": seq},
    }.get(name, {})
    method = build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, seq)).eval().double()
    if name == "linformer":  # identity projections with k = n: exact softmax
        with torch.no_grad():
            method.e_proj.copy_(torch.eye(seq))
    q, k, v = (torch.randn(BATCH, HEADS, seq, DIM, dtype=torch.float64) * 0.5 for _ in range(3))
    scaling = 4 * DIM**-0.5

    def exact(scale):
        return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v

    out = method(q, k, v, None, scaling)
    error_to = {scale: ((out - exact(scale)).norm() / exact(scale).norm()).item() for scale in (scaling, DIM**-0.5)}
    assert error_to[scaling] < error_to[DIM**-0.5], error_to


@pytest.mark.parametrize("name", METHODS)
def test_autocast_keeps_the_method_precision(name):
    """Under Trainer's fp16/bf16 autocast a method computes as it would without autocast."""
    method, mask = make_method(name), padding_mask()
    q, k, v = make_qkv()
    with torch.autocast(q.device.type, dtype=torch.bfloat16):
        low = method(q, k, v, mask)
    torch.testing.assert_close(low, method(q, k, v, mask), atol=1e-6, rtol=1e-5)


#: Options that make a method's backward the true gradient of its forward (and make Skeinformer
#: sample: 8 pilot rows of 9 real tokens, drawn with replacement, so some repeat).
GRADCHECK_OPTIONS = {"linformer": {"k": 8}, "yoso_e": {"gradient": "exact"}, "skeinformer": {"num_samples": 8}}
#: Performer's positive features carry the official eps stabiliser after a detached shift, so
#: its gradient is exact only to about eps / smallest feature.
GRADCHECK_ATOL = {"performer": 2e-3}


@pytest.mark.parametrize("name", [n for n in METHODS if n not in ("mra2", "mra2_s", "informer", "yoso")])
def test_gradcheck_in_eval_mode(name, device):
    """Autograd equals finite differences (eval mode: samples fixed by the seed). Not here: MRA
    and Informer select blocks / queries by score, which small steps can flip (they have their
    own gradient tests); YOSO's backward is the paper's lower bound (eq. 3), by design."""
    options = GRADCHECK_OPTIONS.get(name, {})
    method = build_method(MethodChoice.of(name, options), AttentionShape(1, 4, 16)).eval().double()
    q, k, v = (torch.randn(1, 1, 12, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, 9:] = False
    atol = GRADCHECK_ATOL.get(name, 1e-5)
    # CUDA's float atomics (Skyformer's scatter-adds) make a second backward differ by rounding.
    nondet_tol = 0.0 if device.type == "cpu" else 1e-12
    assert torch.autograd.gradcheck(lambda *t: method(*t, mask), (q, k, v), eps=1e-6, atol=atol, nondet_tol=nondet_tol)


@pytest.mark.parametrize("name", METHODS)
def test_eval_is_reproducible(name, repeat_tolerance):
    method = make_method(name)
    q, k, v = make_qkv()
    torch.testing.assert_close(method(q, k, v, padding_mask()), method(q, k, v, padding_mask()), **repeat_tolerance)


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


@pytest.mark.parametrize("name", METHODS)
def test_options_validate_on_construction(name):
    """Every options dataclass checks its values when built, not only through the registry."""
    options_cls = get_method_class(name).options_cls
    defaults = options_cls().to_dict()
    for option, value in defaults.items():
        bad = "not a valid value" if not isinstance(value, str) else 3.5
        with pytest.raises(ValueError, match=option):
            options_cls(**{option: bad})


@pytest.mark.parametrize("attn_config", [["block_per_row", 2], "block_per_row=2", 3])
def test_attn_config_must_be_a_dict(attn_config):
    with pytest.raises(ValueError, match="attn_config must be a dict"):
        build_method(MethodChoice.of("mra2", attn_config), AttentionShape(HEADS, DIM, 128))


@pytest.mark.parametrize("name", [n for n in METHODS if "seed" in hea.method_options(n)])
def test_seeds_are_non_negative_integers(name):
    for seed in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            make_method(name, seed=seed)


@pytest.mark.parametrize("name", METHODS)
def test_every_option_says_what_it_means(name):
    """Each option is a field with its help in ``metadata`` (what method_options and the docs show)."""
    for option, described in hea.method_options(name).items():
        assert len(described.help) > 10 and described.help.endswith("."), (name, option, described.help)


@pytest.mark.parametrize("name", METHODS)
def test_metadata_lives_on_the_class(name):
    """Paper, cost, budget option and exact reference: what the card, the quality study and the docs
    read from the registry."""
    cls = get_method_class(name)
    assert cls.paper is not None and cls.paper.title and cls.paper.venue
    assert re.fullmatch(r"\d{4}\.\d{5}", cls.paper.arxiv), cls.paper.arxiv
    assert re.fullmatch(r"O\(.*n.*\)", cls.cost), cls.cost
    assert cls.budget_option is None or cls.budget_option in hea.method_options(name)
    reference = get_method_class(cls.exact_reference)
    assert reference.budget_option is None and reference.samples is False  # an exact method
    if cls.samples and not cls.approximates_softmax:  # YOSO, Skyformer: measured against their exact kernel
        assert reference is not cls and not reference.samples and not reference.approximates_softmax
