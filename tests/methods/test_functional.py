"""hea.efficient_attention: one mask convention (True / 1 = real token, as Transformers'
attention_mask and SDPA's boolean attn_mask), and a clear error for any other mask; a function
calling it compiles in one graph and equals eager; its method modules are kept, bounded, and
rebuilt alike."""

import collections

import pytest
import torch
import torch._dynamo
from compile_fixtures import SMALL_OPTIONS
from torch._dynamo.testing import CompileCounterWithBackend  # PyTorch's own compile counter (no public one)

import hf_efficient_attn as hea
from hf_efficient_attn import registry
from hf_efficient_attn.methods.softmax import SoftmaxAttention, softmax_reference

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


# ---------------------------------------------------------------------------------------- torch.compile
#: compile_fixtures' options (sampled paths in use, small traced graphs), and MRA with one exact block
#: of 32 per row: every method approximates at 64 tokens (none equals softmax there).
COMPILE_OPTIONS = {**SMALL_OPTIONS, "mra2": {"block_per_row": 1}, "mra2_s": {"block_per_row": 1}}
#: One method per family (file of methods/) in the default tier, the others slow: the traced path
#: (a module lookup, then its forward) is the same for every method, and every method's forward
#: compiles in a patched model too (test_methods_compile.py, test_mra_compile.py).
DEFAULT_COMPILES = {"informer", "linformer", "mra2", "nystromformer", "performer", "skeinformer", "skyformer", "softmax", "yoso"}


@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=[] if m in DEFAULT_COMPILES else [pytest.mark.slow]) for m in hea.list_methods()]
)
def test_a_function_calling_it_compiles_in_one_graph_and_equals_eager(method):
    """A user's attention module calls the functional API: ``fullgraph`` (a graph break fails), the
    compiled padded call equals eager, and the second call reuses the graph (no recompilation)."""
    q, k, v = (torch.randn(2, 2, 64, 8) for _ in range(3))
    mask = torch.ones(2, 64, dtype=torch.bool)
    mask[1, 40:] = False
    options = COMPILE_OPTIONS.get(method, {})

    def attend(q, k, v, mask):
        return hea.efficient_attention(q, k, v, method=method, attention_mask=mask, **options)

    want = attend(q, k, v, mask)
    exact = hea.efficient_attention(q, k, v, method="softmax", attention_mask=mask)
    assert method == "softmax" or not torch.allclose(want, exact, atol=1e-3)  # the method's own path, not softmax
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(attend, backend=counter, fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(compiled(q, k, v, mask), want, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1


def test_its_modules_are_bounded_rebuilt_alike_and_dropped_with_a_replaced_method(monkeypatch):
    """The method modules calls share are at most FUNCTIONAL_CACHE_SIZE; one evicted is rebuilt with
    the same draws (the global RNG untouched); replacing a method's class drops the old modules."""
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))  # leave the real registry untouched
    monkeypatch.setattr(registry, "_FUNCTIONAL_MODULES", collections.OrderedDict())
    q, k, v = qkv()
    first = hea.efficient_attention(q, k, v, method="linformer", k=8)  # projections drawn when built
    for length in range(1, registry.FUNCTIONAL_CACHE_SIZE + 1):
        hea.efficient_attention(*(t[:, :, :length] for t in (q, k, v)), method="softmax")
    assert len(registry._FUNCTIONAL_MODULES) == registry.FUNCTIONAL_CACHE_SIZE
    assert not any(key[0] == "linformer" for key in registry._FUNCTIONAL_MODULES)
    state = torch.get_rng_state()
    torch.testing.assert_close(hea.efficient_attention(q, k, v, method="linformer", k=8), first, atol=0, rtol=0)
    assert torch.equal(torch.get_rng_state(), state)

    class DoubledValues(SoftmaxAttention):
        def attend(self, q, k, v, key_padding_mask, scaling):
            return super().attend(q, k, 2 * v, key_padding_mask, scaling)

    exact = hea.efficient_attention(q, k, v, method="softmax")  # its module kept
    hea.register_method(replace=True)(DoubledValues)
    torch.testing.assert_close(hea.efficient_attention(q, k, v, method="softmax"), 2 * exact)
