"""YOSO / YOSO-E (Zeng et al., ICML 2021, appendix): hashing, exactness against dense float64 formulas, the eq. (3)
backward, convergence of the sampled method to its expectation, padding and the convolution."""

import math

import pytest
import torch
import torch.nn.functional as F
from tiny import option_defaults

from hf_efficient_attn.methods import yoso as Y
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

HEADS, DIM = 2, 8


def make(name, layer_idx=0, **options):
    return build_method(MethodChoice.of(name, options), AttentionShape(HEADS, DIM, 128, layer_idx)).eval()


def unit(x):
    return F.normalize(x, dim=-1)


def relative_error(out, ref):
    return ((out - ref).norm() / ref.norm()).item()


def correlated_qkv(batch=2, seq=24, dim=DIM, dtype=torch.float64, noise=0.5):
    """Unit queries, keys near them (so that B(q, k) spans small to large values), values."""
    q = unit(torch.randn(batch, HEADS, seq, dim, dtype=dtype))
    k = unit(q + noise * torch.randn_like(q))
    return q, k, torch.randn_like(q)


def float_mask(batch, seq, real, dtype=torch.float64):
    """(B, 1, N, 1): example 1 has only ``real`` real tokens."""
    mask = torch.ones(batch, 1, seq, 1, dtype=dtype)
    mask[1, :, real:] = 0
    return mask


def dense_weights(q, k, tau, mask=None):
    """(1 - arccos(q.k)/pi)^tau in float64 from its definition, padded keys zeroed."""
    weights = (1 - torch.acos((q.double() @ k.double().transpose(-1, -2)).clamp(-1, 1)) / math.pi) ** tau
    return weights if mask is None else weights * mask.double().transpose(-1, -2)


def eq3_gradients(q, k, v, grad, weights, tau):
    """The YOSO appendix's eq. (3) with weight matrix B (dense): dQ, dK of the lower bound, dV = B^T dY."""
    slope = (grad @ v.transpose(-1, -2)) * weights * (tau / 2)
    return slope @ k, slope.transpose(-1, -2) @ q, weights.transpose(-1, -2) @ grad


def with_grads(fn, *tensors, grad):
    inputs = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*inputs)
    out.backward(grad)
    return (out.detach(), *(t.grad for t in inputs))


# ----------------------------------------------------------------------------- hashing


@pytest.mark.parametrize("size", [1, 2, 8, 64])
def test_sylvester_hadamard_matrix(size):
    """Entries (-1)^popcount(i & j) (the closed form of Sylvester's construction), H H^T = size I."""
    h = Y.sylvester_hadamard(size)
    i, j = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    parity = torch.tensor([bin(x).count("1") % 2 for x in (i & j).flatten().tolist()]).view(size, size)
    torch.testing.assert_close(h, 1.0 - 2.0 * parity.float())
    torch.testing.assert_close(h @ h.T, size * torch.eye(size))
    with pytest.raises(ValueError, match="power-of-two"):
        Y.sylvester_hadamard(12)
    assert Y.sylvester_hadamard(size, dtype=torch.float64).dtype == torch.float64


def pairs_at_angle(theta, count, dim):
    """``count`` pairs of unit vectors at angle theta."""
    a = unit(torch.randn(count, dim, dtype=torch.float64))
    b = torch.randn(count, dim, dtype=torch.float64)
    b = unit(b - (b * a).sum(-1, keepdim=True) * a)
    return a, math.cos(theta) * a + math.sin(theta) * b


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dim, tau", [(48, 1), (48, 4), (8, 1)])
def test_hash_collision_rate_is_one_minus_angle_over_pi_to_the_tau(fast, dim, tau):
    """P(two vectors share a tau-bit code) = (1 - theta/pi)^tau (section 1.2), for Gaussian and
    for H D3 H D2 H D1 projections (d = 48 is padded to 64, d = 8 to the 32 floor)."""
    gen = torch.Generator(torch.get_default_device()).manual_seed(0)
    num_hash, draws = 64, 40
    for theta in (0.3, 1.0, 2.0):
        a, b = pairs_at_angle(theta, 16, dim)
        x = torch.stack([a, b]).unsqueeze(1)  # (2, 1, 16, dim): "batch" 0 = a, 1 = b
        hits = 0.0
        for _ in range(draws):
            if fast:
                signs = Y.draw_hadamard_signs(1, dim, num_hash, tau, gen)
                codes = Y.hadamard_codes(x, signs, num_hash, tau)
            else:
                codes = Y.hyperplane_codes(x, Y.draw_hyperplanes(1, dim, num_hash, tau, gen).double(), tau)
            hits += (codes[0] == codes[1]).double().mean().item() / draws
        expected = (1 - theta / math.pi) ** tau
        samples = 16 * num_hash * draws
        assert abs(hits - expected) < 0.01 + 4 * math.sqrt(expected * (1 - expected) / samples), (theta, hits)


def test_codes_are_integers_in_range_and_fast_hash_blocks_hold_whole_codes():
    x = unit(torch.randn(2, HEADS, 5, 48))
    signs = Y.draw_hadamard_signs(HEADS, 48, 32, 9)
    assert signs.shape == (HEADS, 3, math.ceil(32 / (64 // 9)), 64) and set(signs.unique().tolist()) == {-1.0, 1.0}
    for codes in (Y.hadamard_codes(x, signs, 32, 9), Y.hyperplane_codes(x, Y.draw_hyperplanes(HEADS, 48, 32, 9), 9)):
        assert codes.shape == (2, HEADS, 5, 32) and codes.dtype == torch.int64
        assert codes.min() >= 0 and codes.max() < 2**9


def test_fast_hash_is_sign_of_h_d3_h_d2_h_d1_x():
    """Section 1.2, written out with explicit matrices (Kronecker-built H, diagonal D_i), per block."""
    dim, num_hash, tau = 20, 5, 3  # D = 32 (zero-padded), 10 codes per block, 1 block
    x = unit(torch.randn(1, HEADS, 7, dim, dtype=torch.float64))
    signs = Y.draw_hadamard_signs(HEADS, dim, num_hash, tau).double()
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < 32:
        hadamard = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), hadamard)
    for head in range(HEADS):
        d1, d2, d3 = (torch.diag(signs[head, i, 0]) for i in range(3))
        projected = (hadamard @ d3 @ hadamard @ d2 @ hadamard @ d1 @ F.pad(x[0, head], (0, 32 - dim)).T).T
        bits = (projected[:, : num_hash * tau] > 0).view(7, num_hash, tau).double()
        expected = (bits * 2.0 ** torch.arange(tau, dtype=torch.float64)).sum(-1).long()
        assert torch.equal(Y.hadamard_codes(x, signs, num_hash, tau)[0, head], expected)


def exact_rotations(signs):
    """H D3 H D2 H D1 of every head and block as int64 (H, blocks, D, D), from its definition: the
    integer matrices whose columns the fast hash projects on (row-vector form x^T D1 H D2 H D3 H)."""
    size = signs.shape[-1]
    hadamard = Y.sylvester_hadamard(size, signs.device, torch.float64).long()
    d1, d2, d3 = signs.long().unbind(1)
    return ((d1[..., :, None] * hadamard * d2[..., None, :]) @ hadamard * d3[..., None, :]) @ hadamard


def vectors_on_hash_boundaries(signs, batch, seq, generator):
    """(B, H, N, D) fp32 vectors 2^-23 (38833 r + e), r a column of the head's rotation and e in {-1, 0, 1}
    zero for half the tokens: their projections on the other columns (orthogonal to r) are exactly
    0 or small integers, ~1e-7 of the vector's norm. Returns the vectors and their exact integer
    projections (B, H, N, blocks, D), on the default device (integer products on the CPU)."""
    rotations = exact_rotations(signs.cpu())  # (H, blocks, D, D)
    heads, _, size, _ = rotations.shape
    columns = torch.randint(size, (batch, heads, seq), generator=generator, device="cpu")
    picked = rotations[:, 0].transpose(-1, -2)[torch.arange(heads, device="cpu")[:, None], columns]  # (B, H, N, D)
    noise = torch.randint(-1, 2, (batch, heads, seq, size), generator=generator, device="cpu")
    noise[..., ::2, :] = 0
    integers = 38833 * picked + noise  # < 2^24, exact in fp32 (|r| <= 216 in these draws)
    device = torch.get_default_device()
    return (integers.float() * 2.0**-23).to(device), torch.einsum("bhnd,hkde->bhnke", integers, rotations).to(device)


def test_hash_bits_are_the_signs_of_the_exact_projections():
    """Projections that are exactly 0 or ~1e-7 of the vector's norm: every bit is the sign of the
    exact (integer) projection, so no summation order (a compiled graph's, another device's) and
    no rounding of the l2 normalisation can flip it, in the hash function and in the module (which
    hashes q and k as given: normalising by 38833 * 2^9 would round). In fp32, or on the normalised
    vectors, codes come out wrong (both fail this test; so did the fp32 hash of the normalised q, k
    behind a compiled model's 2.3e-3 difference, see the next test)."""
    dim, num_hash, tau = 64, 8, 4  # D = 64: 16 codes per block, one block
    generator = torch.Generator().manual_seed(0)  # CPU: the helper draws there
    signs = Y.draw_hadamard_signs(HEADS, dim, num_hash, tau, generator, "cpu").to(torch.get_default_device())
    x, exact = vectors_on_hash_boundaries(signs, 2, 24, generator)
    want = Y._bits_to_codes((exact.flatten(-2)[..., : num_hash * tau] > 0).unflatten(-1, (num_hash, tau)))
    assert torch.equal(Y.hadamard_codes(x, signs, num_hash, tau), want)
    # The module: its eval output is the LSH estimate with exactly these codes.
    choice = MethodChoice.of("yoso", {"hash_code_len": tau, "num_hash": num_hash})
    module = build_method(choice, AttentionShape(HEADS, dim, 128, 0)).eval()
    q, exact_q = vectors_on_hash_boundaries(module.projections, 2, 24, generator)
    k, exact_k = vectors_on_hash_boundaries(module.projections, 2, 24, generator)
    v = torch.randn(2, HEADS, 24, dim, generator=generator, device="cpu").to(q.device)
    codes = [
        Y._bits_to_codes((e.flatten(-2)[..., : num_hash * tau] > 0).unflatten(-1, (num_hash, tau))) for e in (exact_q, exact_k)
    ]
    want = F.normalize(Y.lsh_collision_attention(unit(q), unit(k), v, *codes, tau), dim=-1)
    torch.testing.assert_close(module(q, k, v, None, dim**-0.5), want, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_inductor_hashes_as_eager_on_hash_boundaries():
    """Inductor fuses and orders the module's arithmetic its own way; on q, k whose projections are 0
    or ~1e-7 of their norm, at a realistic shape (12 heads of 64, 512 tokens, a padded row), the
    compiled module's output still equals eager's: the bits are those of the exact projections. (The
    fp32 hash of the normalised q, k flipped bits under Inductor: a compiled 2-layer RoBERTa's logits
    differed from eager by 2.3e-3. A whole model is no test of this: Inductor also rounds the layers
    before the attention differently, ~1e-7, which on some CPUs moves a projection across zero.)"""
    torch._dynamo.reset()
    module = build_method(MethodChoice.of("yoso"), AttentionShape(12, 64, 512, 0)).eval()
    generator = torch.Generator().manual_seed(0)
    q, _ = vectors_on_hash_boundaries(module.projections, 2, 512, generator)
    k, _ = vectors_on_hash_boundaries(module.projections, 2, 512, generator)
    v = torch.randn(q.shape, generator=generator, device="cpu").to(q.device)
    mask = torch.ones(2, 512, dtype=torch.bool)
    mask[1, 300:] = False
    with torch.no_grad():
        want = module(q, k, v, mask, 64**-0.5)
        got = torch.compile(module, backend="inductor", fullgraph=True)(q, k, v, mask, 64**-0.5)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :, :300], want[1, :, :300], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- yoso_e


@pytest.mark.parametrize("tau", [1, 9])
def test_yoso_e_matches_the_dense_float64_formula(tau):
    """Module output = l2-normalised rows of B(Q K^T) V over real keys (unit q, k), 0 on padding."""
    q, k, v = (torch.randn(2, HEADS, 30, DIM) for _ in range(3))
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 19:] = False
    weights = dense_weights(unit(q.double()), unit(k.double()), tau, mask[:, None, :, None])
    ref = unit(weights @ v.double()) * mask[:, None, :, None]
    out = make("yoso_e", hash_code_len=tau)(q, k, v, mask)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)


def test_yoso_e_exact_gradient_passes_gradcheck():
    """gradient="exact" is eq. (2), the true derivative (up to eps 1e-6 under the square root)."""
    q, k, v = correlated_qkv(batch=2, seq=5, dim=4)
    q, k = 0.8 * q, 0.8 * k  # keep |q.k| < 1 as gradcheck perturbs them
    mask = float_mask(2, 5, real=3)
    fn = lambda q, k, v: Y.expected_collision_attention(q, k, v, 3, mask, exact_gradient=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, [t.requires_grad_() for t in (q, k, v)])


def test_yoso_e_lower_bound_backward_is_eq3():
    """Default backward: dV exact (gradcheck), dQ / dK = eq. (3) from an independent dense formula."""
    q, k, v = correlated_qkv(batch=2, seq=9, dim=4)
    mask = float_mask(2, 9, real=6)
    fn = lambda v: Y.expected_collision_attention(q, k, v, 4, mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, [v.clone().requires_grad_()])
    grad = torch.randn_like(v) * mask  # padded query rows are zeroed downstream
    _, dq, dk, dv = with_grads(lambda q, k, v: Y.expected_collision_attention(q, k, v, 4, mask), q, k, v, grad=grad)
    ref = eq3_gradients(q, k, v, grad, dense_weights(q, k, 4, mask), 4)
    for got, want in zip((dq, dk, dv), ref):
        torch.testing.assert_close(got, want)


def test_yoso_e_exact_module_backward_matches_autograd_of_the_dense_formula():
    """Through the whole module (normalisation of q, k, l2-normalised rows) in float64."""
    q, k, v = (torch.randn(2, HEADS, 12, DIM, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    fmask = mask[:, None, :, None].double()

    def reference(q, k, v):  # plain autograd through torch.acos
        return unit(dense_weights(unit(q), unit(k), 5, fmask) @ v) * fmask

    grad = torch.randn_like(q)
    module = make("yoso_e", hash_code_len=5, gradient="exact")
    got = with_grads(lambda q, k, v: module(q, k, v, mask), q, k, v, grad=grad)
    want = with_grads(reference, q, k, v, grad=grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_yoso_e_exact_gradient_is_finite_for_parallel_query_and_key():
    q = unit(torch.randn(1, HEADS, 6, DIM, requires_grad=True))
    k = q.detach().clone().requires_grad_()  # q.k = 1: dB/dx is infinite without eps
    v = torch.randn(1, HEADS, 6, DIM, requires_grad=True)
    Y.expected_collision_attention(q, k, v, 9, exact_gradient=True).sum().backward()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


# ----------------------------------------------------------------------------- yoso


def fixed_codes(q, k, tau, num_hash, seed=0):
    gen = torch.Generator(torch.get_default_device()).manual_seed(seed)
    planes = Y.draw_hyperplanes(q.shape[1], q.shape[-1], num_hash, tau, gen).to(q.dtype)
    return Y.hyperplane_codes(q, planes, tau), Y.hyperplane_codes(k, planes, tau)


MIXES = {  # which buckets take the matrix-product procedure (the rest: colliding pairs)
    "pairs": lambda nq, nk, dim: torch.zeros_like(nq, dtype=torch.bool),
    "products": lambda nq, nk, dim: torch.ones_like(nq, dtype=torch.bool),
    "mixed": lambda nq, nk, dim: torch.arange(len(nq), device=nq.device) % 2 == 0,  # in the backward thread
}


@pytest.mark.parametrize("procedure", list(MIXES))
@pytest.mark.parametrize("tau", [2, 9])  # 9: few occupied buckets, ids get compacted
def test_lsh_attention_is_the_collision_frequency_matrix_forward_and_backward(monkeypatch, procedure, tau):
    """With fixed codes, yoso = C V with C_ij = fraction of the m hashes where q_i and k_j share a
    code (real keys only), and its backward = eq. (3) with B replaced by C; checked against a dense
    comparison of codes, for both backward procedures of section 1.4 and a mix of them."""
    monkeypatch.setattr(Y, "_gemm_buckets", MIXES[procedure])
    q, k, v = correlated_qkv(seq=20)
    mask = float_mask(2, 20, real=13)
    query_codes, key_codes = fixed_codes(q, k, tau, num_hash=6)
    collisions = (query_codes.unsqueeze(3) == key_codes.unsqueeze(2)).double().mean(-1)
    collisions = collisions * mask.transpose(-1, -2) * mask  # padded keys never, padded queries get 0
    grad = torch.randn_like(v) * mask
    fn = lambda q, k, v: Y.lsh_collision_attention(q, k, v, query_codes, key_codes, tau, mask)  # noqa: E731
    out, dq, dk, dv = with_grads(fn, q, k, v, grad=grad)
    torch.testing.assert_close(out, collisions @ v)
    for got, want in zip((dq, dk, dv), eq3_gradients(q, k, v, grad, collisions, tau)):
        torch.testing.assert_close(got, want)


def test_compacted_bucket_ids_keep_collisions_and_fit_the_table():
    """Within each hash, two ids are equal after compaction exactly when they were before, and every
    id fits a table of 2 rows per query (static size: queries and keys each in a bucket of their own)."""
    query_ids, key_ids = torch.randint(0, 20, (2, 5, 30)) * 50_000  # few buckets of a large table
    compact_q, compact_k, table_rows = Y._compact_ids(query_ids, key_ids, 20 * 50_000)
    assert table_rows == 60 and compact_q.max() < 60 and compact_k.min() >= 0
    before, after = torch.cat([query_ids, key_ids], 1), torch.cat([compact_q, compact_k], 1)
    assert torch.equal(before[:, :, None] == before[:, None, :], after[:, :, None] == after[:, None, :])


def test_eq3_custom_op_passes_opcheck():
    """Schema, fake (meta) kernel and the compiled-graph (AOT) dispatch of the eq. (3) custom op
    agree with its eager kernel."""
    q, k, v, grad = (torch.randn(24, DIM) for _ in range(4))
    query_ids, key_ids = torch.randint(0, 6, (2, 3, 24))
    torch.library.opcheck(Y.lsh_eq3_terms, (q, k, v, grad, query_ids, key_ids, 6))


def test_lsh_attention_value_gradient_passes_gradcheck():
    """For fixed hashes yoso is linear in V and its dV is exact."""
    q, k, v = correlated_qkv(batch=2, seq=7, dim=4)
    mask = float_mask(2, 7, real=4)
    query_codes, key_codes = fixed_codes(q, k, 2, num_hash=5)
    fn = lambda v: Y.lsh_collision_attention(q, k, v, query_codes, key_codes, 2, mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, [v.requires_grad_()])


@pytest.mark.parametrize("fast", [False, True])
def test_yoso_converges_to_yoso_e_in_forward_and_backward(fast):
    """Averaged over 2000 hashes (10 draws of 200), yoso's output and its eq. (3) gradient estimate
    approach their expectations (yoso_e and the dense eq. (3)); the error of an unbiased estimate
    shrinks as 1/sqrt(m) (~0.04 here), a wrong tau or a biased hash would leave >= 0.2."""
    tau, num_hash, draws = 3, 200, 10
    q, k, v = correlated_qkv(seq=24)
    mask = float_mask(2, 24, real=17)
    grad = torch.randn_like(v) * mask
    gen = torch.Generator(torch.get_default_device()).manual_seed(0)
    total = None
    for _ in range(draws):
        if fast:
            signs = Y.draw_hadamard_signs(HEADS, DIM, num_hash, tau, gen)
            codes = [Y.hadamard_codes(x, signs, num_hash, tau) for x in (q, k)]
        else:
            codes = fixed_codes(q, k, tau, num_hash, seed=int(torch.randint(10**6, (1,), generator=gen)))
        fn = lambda q, k, v: Y.lsh_collision_attention(q, k, v, *codes, tau, mask)  # noqa: E731
        result = with_grads(fn, q, k, v, grad=grad)
        total = result if total is None else [a + b for a, b in zip(total, result)]
    weights = dense_weights(q, k, tau, mask)
    expected = [(weights @ v) * mask, *eq3_gradients(q, k, v, grad, weights, tau)]
    for name, got, want in zip(("out", "dq", "dk", "dv"), total, expected):
        assert relative_error(got / draws, want) < 0.08, name


def test_yoso_module_with_many_hashes_approaches_yoso_e():
    """End to end (l2-normalised rows): Gaussian hashes, error ~ 1/sqrt(m) (measured 0.68 at m = 8,
    0.05 at m = 2000, 0.027 at m = 8000)."""
    q, k, v = (x.float() for x in correlated_qkv(seq=40, noise=0.7))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False
    exact = make("yoso_e", hash_code_len=4)(q, k, v, mask)
    errors = {
        m: relative_error(make("yoso", hash_code_len=4, num_hash=m, use_fast_hash=False)(q, k, v, mask), exact) for m in (8, 2000)
    }
    assert errors[2000] < 0.08 and errors[2000] < errors[8] / 8


@pytest.mark.parametrize("name", ["yoso", "yoso_e"])
def test_padded_keys_and_values_get_zero_gradient(name):
    module = make(name).train()
    q, k, v = (torch.randn(2, HEADS, 20, DIM, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 12:] = False
    module(q, k, v, mask).square().sum().backward()
    for t in (q, k, v):
        assert (t.grad[1, :, 12:] == 0).all() and t.grad[1, :, :12].abs().sum() > 0


def test_yoso_eval_is_seeded_per_layer_and_training_redraws(repeat_tolerance):
    q, k, v = (torch.randn(1, HEADS, 32, DIM) for _ in range(3))
    first, again = make("yoso")(q, k, v), make("yoso")(q, k, v)
    torch.testing.assert_close(first, again, **repeat_tolerance)
    assert not torch.equal(first, make("yoso", seed=1)(q, k, v))
    assert not torch.equal(first, make("yoso", layer_idx=1)(q, k, v))
    module = make("yoso").train()
    assert not torch.equal(module(q, k, v), module(q, k, v))


@pytest.mark.parametrize("fast", [True, False])
def test_yoso_accepts_non_contiguous_inputs(fast):
    """The Transformers bridge passes q, k, v as transposed (B, N, H, D) views."""
    q, k, v = (torch.randn(2, 20, HEADS, DIM).transpose(1, 2) for _ in range(3))
    module = make("yoso", use_fast_hash=fast)
    torch.testing.assert_close(module(q, k, v), module(q.contiguous(), k.contiguous(), v.contiguous()))


def test_yoso_output_of_an_example_does_not_depend_on_its_batch():
    q, k, v = (torch.randn(3, HEADS, 16, DIM) for _ in range(3))
    module = make("yoso")
    torch.testing.assert_close(module(q, k, v)[1:2], module(q[1:2], k[1:2], v[1:2]), atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- conv, options


@pytest.mark.parametrize("name", ["yoso", "yoso_e"])
def test_conv_window_adds_a_depthwise_convolution_of_the_masked_values(name):
    plain, conv = make(name), make(name, conv_window=5)
    assert not list(plain.parameters())
    assert [p.shape for p in conv.parameters()] == [(HEADS, 1, 5, 1)]
    q, k, v = (torch.randn(2, HEADS, 11, DIM) for _ in range(3))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    v_real = v * mask[:, None, :, None]
    weight = conv.conv.weight[:, 0, :, 0]  # (H, 5): out_n = sum_t w_t v_{n + t - 2}
    padded = F.pad(v_real, (0, 0, 2, 2))
    expected = sum(weight[None, :, t, None, None] * padded[:, :, t : t + 11] for t in range(5))
    expected = expected * mask[:, None, :, None]
    torch.testing.assert_close(conv(q, k, v, mask) - plain(q, k, v, mask), expected.detach(), atol=1e-5, rtol=1e-4)


def test_defaults_and_invalid_options():
    assert option_defaults("yoso") == {
        "hash_code_len": 9,
        "num_hash": 32,
        "use_fast_hash": True,
        "conv_window": None,
        "seed": 0,
    }
    assert option_defaults("yoso_e") == {"hash_code_len": 9, "conv_window": None, "gradient": "lower_bound"}
    assert not make("yoso", conv_window=0).conv
    for name, bad in [
        ("yoso", {"hash_code_len": 0}),
        ("yoso", {"hash_code_len": 25}),
        ("yoso", {"num_hash": 0}),
        ("yoso", {"use_fast_hash": 1}),
        ("yoso", {"conv_window": 4}),
        ("yoso", {"seed": -1}),
        ("yoso_e", {"gradient": "autograd"}),
        ("yoso_e", {"conv_window": -3}),
        ("yoso_e", {"hash_code_len": 2.5}),
    ]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            make(name, **bad)
