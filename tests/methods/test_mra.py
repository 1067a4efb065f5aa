"""MRA-2 and MRA-2-s (Zeng et al., ICML 2022): exactness limit, a dense reference of the method's formula,
block selection, padding, gradients and the flex backend."""

import functools
import math
import types
from pathlib import Path

import pytest
import torch

from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.mra import gather, low_resolution, pairs, selection
from hf_efficient_attn.methods.mra import method as mra_method
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

#: Every test here also runs on CUDA: pytest --device cuda (tests/conftest.py).
pytestmark = pytest.mark.device

METHODS = ["mra2", "mra2_s"]
#: The two plain-PyTorch kernels of the exact part (block_sparse's grouped one, block_pairs' static one).
KERNELS = ["gather", "pairs"]
BS = 32  # default block size


def make(name, heads=2, dim=8, **options):
    options.setdefault("backend", "gather")
    return build_method(MethodChoice.of(name, options), AttentionShape(heads, dim, max_seq_len=4096)).eval()


def qkv(batch=2, heads=2, seq=75, dim=8, dtype=torch.float64, scale=1.0):
    return [torch.randn(batch, heads, seq, dim, dtype=dtype) * scale for _ in range(3)]


def real_rows(out, mask):
    return torch.where(mask[:, None, :, None], out, 0.0)


def dense_mra_reference(q, k, v, mask, block_per_row, low_resolution, first_n=0, diagonal_n=0, bs=BS):
    """MRA-2(-s) written out densely, in float64 with Python loops: masked block means, log mu
    (eqs. 10-12), the ranking of all real block pairs (by the number of prior sets holding the
    pair, then mu minus its row max),
    the budget, and the dense approximation A^ (eq. 13 / 18) normalised row by row."""
    batch, heads, n, dim = q.shape
    nb = math.ceil(n / bs)
    out = torch.zeros(batch, heads, n, dim, dtype=torch.float64)
    for b in range(batch):
        tokens = [[i for i in range(x * bs, min(n, (x + 1) * bs)) if mask[b, i]] for x in range(nb)]
        real_blocks = [x for x in range(nb) if tokens[x]]
        budget = min(len(real_blocks) * block_per_row, len(real_blocks) ** 2)
        for h in range(heads):
            qh, kh, vh = q[b, h].double(), k[b, h].double(), v[b, h].double()
            mu = {
                (x, y): float(qh[tokens[x]].mean(0) @ kh[tokens[y]].mean(0)) / math.sqrt(dim)
                for x in real_blocks
                for y in real_blocks
            }
            row_max = {x: max(mu[x, y] for y in real_blocks) for x in real_blocks}

            def rank(pair):  # number of prior sets holding the pair, then its score
                x, y = pair
                sets = (x < first_n) + (y < first_n) + (diagonal_n > 0 and abs(x - y) <= diagonal_n // 2)
                return (sets, mu[pair] - row_max[x])

            chosen = set(sorted(mu, key=rank, reverse=True)[:budget])
            approx = torch.zeros(n, n, dtype=torch.float64)
            for (x, y), m in mu.items():
                rows, cols = slice(x * bs, (x + 1) * bs), tokens[y]
                if (x, y) in chosen:
                    approx[rows, cols] = torch.exp(qh[rows] @ kh[cols].T / math.sqrt(dim))
                elif low_resolution:
                    approx[rows, cols] = math.exp(m)
            for i in range(n):
                if mask[b, i] and approx[i].sum() > 0:
                    out[b, h, i] = approx[i] @ vh / approx[i].sum()
    return out


def smooth_qkv(seq=256, heads=2, dim=16, scale=2.0):
    """Inputs with locality (section 4.1: nearby tokens alike): random walks plus a few repeated
    'topics', so that attention has structure at the block level."""
    walk = torch.randn(3, 1, heads, seq, dim, dtype=torch.float64).cumsum(3) / math.sqrt(seq / 8)
    topics = torch.randn(3, 1, heads, 4, dim, dtype=torch.float64)
    topic_of_token = (torch.arange(seq) // 48) % 4
    q, k, v = (walk + topics[:, :, :, topic_of_token]) * scale
    return q, k, v


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("priors", [(0, 0), (1, 3)])
@pytest.mark.parametrize("backend", KERNELS)
def test_full_budget_is_exact_softmax_with_padding_and_odd_length(name, priors, backend):
    q, k, v = qkv(batch=3, seq=75)  # 3 blocks, the last one partial
    mask = torch.ones(3, 75, dtype=torch.bool)
    mask[1, 40:] = False  # internal + key padding
    mask[2, :] = False  # a sequence of padding only
    method = make(
        name, backend=backend, block_per_row=3, initial_prior_first_n_blocks=priors[0], initial_prior_diagonal_n_blocks=priors[1]
    )
    out = method(q, k, v, mask)
    torch.testing.assert_close(out, real_rows(softmax_reference(q, k, v, mask), mask), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", METHODS)
def test_full_budget_is_exact_with_large_scores(name):
    """Max subtraction / log-sum-exp merge: scores of several hundred stay exact and finite."""
    q, k, v = qkv(seq=100, scale=8.0)
    out = make(name, block_per_row=4)(q, k, v)
    torch.testing.assert_close(out, softmax_reference(q, k, v), atol=1e-10, rtol=1e-8)
    assert torch.isfinite(make(name, block_per_row=1)(q, k, v)).all()


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize(
    "options", [{}, {"block_per_row": 2, "initial_prior_first_n_blocks": 1, "initial_prior_diagonal_n_blocks": 3}]
)
@pytest.mark.parametrize("backend", KERNELS)
def test_matches_dense_reference_of_the_formula(name, options, backend):
    q, k, v = qkv(batch=2, heads=2, seq=300, dim=8)  # 10 blocks; default budget 4 of 10 per row
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, 170:] = False
    block_per_row = options.get("block_per_row", 4)
    expected = dense_mra_reference(
        q,
        k,
        v,
        mask,
        block_per_row,
        name == "mra2",
        options.get("initial_prior_first_n_blocks", 0),
        options.get("initial_prior_diagonal_n_blocks", 0),
    )
    torch.testing.assert_close(make(name, backend=backend, **options)(q, k, v, mask), expected, atol=1e-10, rtol=1e-8)


def test_error_decreases_as_the_budget_grows():
    q, k, v = smooth_qkv()  # 8 blocks
    exact = softmax_reference(q, k, v)
    errors = [float((make("mra2", dim=16, block_per_row=r)(q, k, v) - exact).norm() / exact.norm()) for r in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] < 0.5 and errors[-1] < 1e-12, errors
    # The low-resolution term helps: MRA-2 beats MRA-2-s at the same budget.
    sparse = make("mra2_s", dim=16, block_per_row=2)(q, k, v)
    assert errors[1] < float((sparse - exact).norm() / exact.norm())


# ----------------------------------------------------------------------------- selection


def test_select_blocks_budget_padding_and_priors():
    counts = torch.tensor([[32, 32, 32, 32, 32, 32], [32, 32, 5, 0, 0, 0]])
    logits = torch.randn(2, 3, 6, 6)
    selected = selection.select_blocks(logits, counts, block_per_row=2)
    assert selected.sum((-1, -2)).tolist() == [[12] * 3, [6] * 3]  # 2 x real query blocks
    assert not selected[1, :, 3:].any() and not selected[1, :, :, 3:].any()  # padded blocks
    best = logits.argmax(-1)  # every real query block keeps its best key block
    assert selected[0].gather(-1, best[0, ..., None]).all()
    assert selected[1, :, :3].gather(-1, logits[1, :, :3, :3].argmax(-1, keepdim=True)).all()
    # Priors (a diagonal band of 3 blocks) are taken first, even against the scores.
    diag = selection.select_blocks(-logits.abs() - 100 * torch.eye(6), counts, block_per_row=3, diagonal_n=3)
    band = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs() <= 1
    assert diag[0, :, band].all()
    # The budget caps at all real pairs.
    assert selection.select_blocks(logits, counts, block_per_row=6)[1, :, :3, :3].all()
    # A sequence of padding only selects nothing, whatever the other sequences' budgets.
    assert not selection.select_blocks(logits, torch.stack([counts[0], torch.zeros(6, dtype=torch.long)]), 2)[1].any()
    # Ties at the cut go to the lowest (query block, key block) index: all scores equal here.
    tied = selection.select_blocks(torch.zeros(2, 1, 6, 6), counts, block_per_row=1)
    assert tied[0, 0, 0].all() and tied[0, 0].sum() == 6
    assert tied[1, 0, 0, :3].all() and tied[1, 0].sum() == 3


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("backend", KERNELS)
def test_long_padding_keeps_real_outputs(name, backend):
    method = make(name, backend=backend, block_per_row=1, initial_prior_first_n_blocks=1, initial_prior_diagonal_n_blocks=3)
    q, k, v = qkv(batch=1, seq=150)
    extra = [torch.randn(1, 2, 250, 8, dtype=torch.float64) * 10 for _ in range(3)]
    padded = [torch.cat([t, e], 2) for t, e in zip((q, k, v), extra)]
    mask = torch.arange(400)[None] < 150
    out = method(*padded, mask)
    torch.testing.assert_close(out[:, :, :150], method(q, k, v), atol=1e-12, rtol=1e-10)
    assert (out[:, :, 150:] == 0).all()


def test_prior_selection_follows_the_reference_implementation():
    """Transformers' modeling_mra (the official selection code, pure torch, runs on CPU) on the same
    block logits: n = 512 (16 blocks), budget 4 x 16 = 64 pairs. With first 1 and diagonal 3 the
    74 prior pairs outnumber the budget, so the pairs in several prior sets ((0, 0), (0, 1),
    (1, 0)) must win even with the lowest scores, as the reference's per-set bonus makes them."""
    reference = pytest.importorskip("transformers.models.mra.modeling_mra")
    heads, nb = 48, 16
    logits = torch.randn(1, heads, nb, nb, dtype=torch.float64)
    logits[0, : heads // 2, [0, 0, 1], [0, 1, 0]] -= 50.0  # multi-set pairs scored lowest in half the heads
    q, k = qkv(batch=1, heads=heads, seq=512, dim=64)[:2]
    blocks = [t.unflatten(2, (-1, BS)) for t in (q, k)]
    stats = selection.block_stats(*blocks, blocks[1], torch.ones(1, 512, dtype=torch.bool), 64**-0.5)
    ref_logits = reference.get_low_resolution_logit(q[0], k[0], BS)[0]
    torch.testing.assert_close(stats.logits[0], ref_logits)  # the block logits agree too
    counts = torch.full((1, nb), BS)
    for block_logits in (logits, stats.logits):
        for first_n, diagonal_n in [(1, 3), (2, 5), (0, 3), (1, 0), (0, 0)]:
            ours = selection.select_blocks(block_logits, counts, 4, first_n, diagonal_n)
            normalized = block_logits[0] - block_logits[0].amax(-1, keepdim=True)
            indices, _ = reference.get_block_idxes(normalized.clone(), 64, "sparse", first_n, diagonal_n)
            expected = torch.zeros(heads, nb * nb, dtype=torch.bool).scatter_(1, indices, True)
            assert torch.equal(ours[0].flatten(1), expected), (first_n, diagonal_n)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("backend", KERNELS)
def test_left_padding_by_whole_blocks_changes_nothing_other_left_padding_does(name, backend):
    """Blocks are cut from the first position (module docstring): left padding by a multiple of
    block_size leaves real outputs unchanged, other left padding moves the block boundaries."""
    method = make(name, backend=backend, block_per_row=1)  # 3 blocks: an approximation, not exact
    q, k, v = qkv(batch=1, seq=96)
    unpadded = method(q, k, v)
    for pad, unchanged in ((32, True), (64, True), (5, False)):
        padded = [torch.cat([torch.randn(1, 2, pad, 8, dtype=torch.float64) * 10, t], 2) for t in (q, k, v)]
        out = method(*padded, torch.arange(pad + 96)[None] >= pad)[:, :, pad:]
        if unchanged:
            torch.testing.assert_close(out, unpadded, atol=1e-12, rtol=1e-10)
        else:
            assert (out - unpadded).abs().max() > 1e-3


# ----------------------------------------------------------------------------- gradients


# pairs with MRA-2-s (no extra key) is the kernel's gradcheck and dense reference below, without the method.
@pytest.mark.parametrize("name, backend", [("mra2", "gather"), ("mra2_s", "gather"), ("mra2", "pairs")])
def test_gradcheck(name, backend, device):
    q, k, v = (t.requires_grad_() for t in qkv(batch=1, heads=1, seq=40, dim=2))  # 2 blocks
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, 36:] = False
    method = make(name, backend=backend, heads=1, dim=2, block_per_row=1)  # 2 of 4 block pairs exact
    nondet_tol = 1e-12 if device.type == "cuda" else 0.0  # CUDA atomics (pairs' index_add_)
    assert torch.autograd.gradcheck(lambda *t: method(*t, mask), (q, k, v), eps=1e-6, atol=1e-6, nondet_tol=nondet_tol)


def test_low_resolution_term_gets_gradient():
    """In MRA-2, keys outside every selected block still get a gradient (through the block means)."""
    q, k, v = (t.requires_grad_() for t in qkv(batch=1, heads=1, seq=128, dim=8))
    method = make("mra2", heads=1, block_per_row=1)
    method(q, k, v).square().sum().backward()
    assert (k.grad.abs().sum(-1) > 0).all() and (v.grad.abs().sum(-1) > 0).all()


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("backend", KERNELS)
def test_half_precision_forward_and_backward_match_fp32(name, dtype, tol, backend):
    """fp16/bf16 inputs are computed in fp32: outputs and gradients equal the fp32 run on the same
    (rounded) inputs up to the rounding of the result."""
    mask = torch.ones(2, 100, dtype=torch.bool)
    mask[1, 70:] = False
    inputs = [t.to(dtype) for t in qkv(batch=2, heads=2, seq=100, dim=16, dtype=torch.float32)]
    grad_out = torch.randn(2, 2, 100, 16)
    results = []
    for tensors in (inputs, [t.float() for t in inputs]):
        tensors = [t.clone().requires_grad_() for t in tensors]
        out = make(name, backend=backend, dim=16, block_per_row=1)(*tensors, mask)
        out.backward(grad_out.to(out.dtype))
        results.append([out] + [t.grad for t in tensors])
    for low, full in zip(*results):
        assert low.dtype == dtype
        torch.testing.assert_close(low.float(), full, atol=tol, rtol=tol)


@pytest.mark.parametrize("slice_elements", [1, 2**20])
def test_low_resolution_function_and_its_backward_match_autograd_through_the_formula(slice_elements, monkeypatch):
    """The low-resolution part (recomputed in the backward, a few heads at a time) against autograd
    through the plain formula: softmax over the kept blocks of q~ k~^T * scaling + log c."""
    monkeypatch.setattr(low_resolution, "LOW_RESOLUTION_SLICE_ELEMENTS", slice_elements)
    batch, heads, nb, dim, scaling = 2, 3, 5, 4, 0.5
    means = [torch.randn(batch, heads, nb, dim, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    counts = torch.tensor([[32, 32, 32, 32, 32], [32, 32, 7, 0, 0]])
    log_counts = counts.double().log()[:, None, None, :]
    dropped = (torch.rand(batch, heads, nb, nb) < 0.4) | (counts == 0)[:, None, None, :]
    dropped[0, 1, 2] = True  # a query block with no low-resolution block
    grad_out, grad_lse = (
        torch.randn(batch, heads, nb, dim, dtype=torch.float64),
        torch.randn(batch, heads, nb, dtype=torch.float64),
    )
    logits = (means[0] @ means[1].transpose(-1, -2) * scaling).detach()
    out, lse = low_resolution.LowResolutionAttention.apply(*means, logits, log_counts, dropped, scaling)
    ours = [out, lse, *torch.autograd.grad((out * grad_out).sum() + (lse * grad_lse).sum(), means)]

    scores = (means[0] @ means[1].transpose(-1, -2) * scaling + log_counts).masked_fill(dropped, -math.inf)
    empty = dropped.all(-1, keepdim=True)
    probs = scores.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
    ref_out, ref_lse = probs @ means[2], scores.logsumexp(-1)
    loss = (ref_out * grad_out).sum() + (ref_lse.masked_fill(empty[..., 0], 0.0) * grad_lse).sum()
    expected = [ref_out, ref_lse, *torch.autograd.grad(loss, means)]
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


# ----------------------------------------------------------------------------- block-sparse function


def block_sparse_on_sequences(
    q, k, v, selected, bs, scaling, key_real, extra_value, extra_score, kernel=gather.block_sparse_attention
):
    """``kernel`` (block_sparse_attention or pair_attention) on (B, H, N, D) tensors (it takes and
    returns blocks)."""
    blocks = [t.unflatten(2, (-1, bs)) for t in (q, k, v)]
    out = kernel(*blocks, selected, scaling, key_real, extra_value, extra_score)
    return out.flatten(2, 3)


def dense_block_sparse_reference(q, k, v, selected, bs, scaling, key_real, extra_value, extra_score):
    """softmax over [the keys of the selected blocks, one extra key per query block] written densely,
    differentiable by autograd; rows with no key at all are 0."""
    allowed = selected.repeat_interleave(bs, 2).repeat_interleave(bs, 3) & key_real[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~allowed, -math.inf)
    values = v[:, :, None].expand(-1, -1, q.shape[2], -1, -1)  # (B, H, N queries, N keys, D)
    if extra_score is not None:
        scores = torch.cat([scores, extra_score.repeat_interleave(bs, 2)[..., None]], -1)
        values = torch.cat([values, extra_value.repeat_interleave(bs, 2)[:, :, :, None]], 3)
    empty = (scores == -math.inf).all(-1, keepdim=True)
    probs = scores.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
    return (probs[..., None] * values).sum(-2)


def block_sparse_case(extra: bool, batch=2, heads=2, bs=4, nb=6, dim=5):
    """Random selection with padded keys (a partial and an empty key block in sequence 1), a query
    block with no selected block, and for ``extra`` some extra keys at -inf (one with all blocks
    selected, one with none)."""
    q, k, v = qkv(batch=batch, heads=heads, seq=nb * bs, dim=dim)
    key_real = torch.ones(batch, nb * bs, dtype=torch.bool)
    key_real[1, (nb - 2) * bs + 1 :] = False
    block_real = key_real.view(batch, nb, bs).any(-1)
    selected = (torch.rand(batch, heads, nb, nb) < 0.4) & block_real[:, None, None, :]
    selected[0, 0, 2] = False  # no selected block
    selected[0, -1, 3] = block_real[0]  # every block selected
    extra_value = extra_score = None
    if extra:
        extra_value = torch.randn(batch, heads, nb, dim, dtype=torch.float64)
        extra_score = torch.randn(batch, heads, nb, dtype=torch.float64) * 2
        extra_score[0, -1, 3] = -math.inf
        extra_score[0, 0, 2] = -math.inf  # and a query block with no key at all
    return q, k, v, selected, bs, dim**-0.5, key_real, extra_value, extra_score


def check_against_dense_reference(kernel, extra):
    """``kernel`` (block_sparse_attention's signature) and its gradients against autograd through
    :func:`dense_block_sparse_reference` on :func:`block_sparse_case`."""
    case = block_sparse_case(extra)
    inputs = [t for t in case if isinstance(t, torch.Tensor) and t.is_floating_point()]
    for t in inputs:
        t.requires_grad_()
    grad_out = torch.randn_like(case[0])
    results = []
    for fn in (functools.partial(block_sparse_on_sequences, kernel=kernel), dense_block_sparse_reference):
        out = fn(*case)
        results.append([out, *torch.autograd.grad(out, inputs, grad_out)])
    for ours, expected in zip(*results):
        torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("extra", [True, False], ids=["extra-key", "selected-only"])
@pytest.mark.parametrize("chunk_blocks", [1, 5, 4096])
def test_block_sparse_attention_and_its_backward_match_autograd_through_a_dense_reference(extra, chunk_blocks, monkeypatch):
    for device_type in gather.CHUNK_BLOCKS:
        monkeypatch.setitem(gather.CHUNK_BLOCKS, device_type, chunk_blocks)
    check_against_dense_reference(gather.block_sparse_attention, extra)


@pytest.mark.parametrize("extra", [True, False], ids=["extra-key", "selected-only"])
@pytest.mark.parametrize("slice_elements", [1, 2**26], ids=["a-head-per-slice", "all-heads"])
def test_pair_attention_and_its_backward_match_autograd_through_a_dense_reference(extra, slice_elements, monkeypatch):
    monkeypatch.setattr(pairs, "PAIR_SLICE_ELEMENTS", slice_elements)
    check_against_dense_reference(pairs.pair_attention, extra)


@pytest.mark.parametrize("kernel", [gather.block_sparse_attention, pairs.pair_attention], ids=["gather", "pairs"])
def test_nothing_selected_with_padded_keys_gives_the_extra_key_alone(kernel):
    """No block pair selected anywhere, padded keys present: each row is its extra key's value (0
    without one), and no gradient reaches q, k, v."""
    q, k, v, _, bs, scaling, key_real, extra_value, extra_score = block_sparse_case(extra=True)
    nothing = torch.zeros(*q.shape[:2], q.shape[2] // bs, q.shape[2] // bs, dtype=torch.bool)
    blocks = [t.unflatten(2, (-1, bs)).requires_grad_() for t in (q, k, v)]
    alone = kernel(*blocks, nothing, scaling, key_real)
    with_extra = kernel(*blocks, nothing, scaling, key_real, extra_value, extra_score)
    expected = extra_value.masked_fill(extra_score[..., None] == -math.inf, 0.0)[:, :, :, None].expand_as(with_extra)
    torch.testing.assert_close(with_extra, expected)
    assert not alone.any()
    grads = torch.autograd.grad((alone.sum() + with_extra.sum()), blocks, allow_unused=True)
    assert all(g is None or not g.any() for g in grads)


@pytest.mark.parametrize("kernel", [gather.block_sparse_attention, pairs.pair_attention], ids=["gather", "pairs"])
def test_block_sparse_attention_gradcheck(kernel, device):
    q, k, v, selected, bs, scaling, key_real, extra_value, extra_score = block_sparse_case(
        True, batch=2, heads=1, bs=3, nb=4, dim=2
    )
    extra_score = extra_score.clamp(min=-3.0)  # finite: finite differences at -inf are undefined
    inputs = [t.requires_grad_() for t in (q, k, v, extra_value, extra_score)]

    def fn(q, k, v, extra_value, extra_score):
        return block_sparse_on_sequences(q, k, v, selected, bs, scaling, key_real, extra_value, extra_score, kernel)

    # pairs' index_add_ on CUDA adds in no fixed order (atomics): repeated backwards differ by rounding.
    nondet_tol = 1e-12 if device.type == "cuda" else 0.0
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, nondet_tol=nondet_tol)


def test_a_second_copy_of_the_module_keeps_its_own_operators():
    """Remote code ships a copy of gather.py beside a model (hub/remote_code.py), imported
    under another name in a process that may hold the package too, and possibly from another
    version. Registering its custom operators must not replace the package's (a second
    registration under the same name silently would): here the copy's kernel is altered."""
    q, k, v, selected, bs, scaling, key_real, extra_value, extra_score = block_sparse_case(True)
    blocks = [t.unflatten(2, (-1, bs)) for t in (q, k, v)]
    args = (*blocks, selected, scaling, key_real, extra_value, extra_score)
    expected = gather.block_sparse_attention(*args)
    source = Path(gather.__file__).read_text()
    returned = "    return out.view(shape), lse.view(shape[:-1])"
    altered = source.replace(returned, returned.replace("return out", "return 2 * out"))
    assert altered != source
    copy = types.ModuleType("shipped_model.hea_methods_mra_gather")
    exec(compile(altered, "hea_methods_mra_gather.py", "exec"), copy.__dict__)
    torch.testing.assert_close(gather.block_sparse_attention(*args), expected, atol=0, rtol=0)
    torch.testing.assert_close(copy.block_sparse_attention(*args), 2 * expected, atol=0, rtol=0)


# ----------------------------------------------------------------------------- flex backend


def test_flex_matches_gather_also_inside_a_compiled_graph(device):
    """One small case, mra2 only (mra2_s's graph is the same minus the virtual keys): compiling
    FlexAttention takes 5-25 s (cold inductor cache). Inside torch.compile on CPU, flex runs
    outside the graph (module docstring) with the same kernel; on CUDA it is traced into the graph
    (here the eager backend's reference implementation: equal to rounding)."""
    q, k, v = qkv(batch=2, heads=2, seq=200, dim=16, dtype=torch.float32)
    mask = torch.ones(2, 200, dtype=torch.bool)
    mask[1, 130:] = False
    options = dict(heads=2, dim=16, block_per_row=2, initial_prior_diagonal_n_blocks=1)
    flex_method = make("mra2", backend="flex", **options)
    with torch.no_grad():
        flex = flex_method(q, k, v, mask)
        compiled = torch.compile(flex_method, backend="eager")(q, k, v, mask)
    gather = make("mra2", backend="gather", **options)(q, k, v, mask)
    torch.testing.assert_close(flex, gather, atol=2e-6, rtol=1e-5)
    same_kernel = device.type == "cpu"
    torch.testing.assert_close(compiled, flex, atol=0 if same_kernel else 2e-6, rtol=0 if same_kernel else 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_flex_matches_gather_at_4096_tokens(name):
    """The benchmark's shape (12 heads, head_dim 64, n = 4096) with the long-input preset
    (16 blocks per row, priors), a padded sequence in the batch."""
    q, k, v = qkv(batch=2, heads=12, seq=4096, dim=64, dtype=torch.float32)
    mask = torch.ones(2, 4096, dtype=torch.bool)
    mask[1, 3000:] = False
    options = dict(heads=12, dim=64, block_per_row=16, initial_prior_first_n_blocks=1, initial_prior_diagonal_n_blocks=5)
    with torch.no_grad():
        flex = make(name, backend="flex", **options)(q, k, v, mask)
        gather = make(name, backend="gather", **options)(q, k, v, mask)
    torch.testing.assert_close(flex, gather, atol=2e-6, rtol=1e-5)


def test_auto_runs_triton_then_pairs_on_cuda_and_gather_elsewhere(monkeypatch, device):
    """backend="auto" never runs flex (it compiles per shape); on CUDA it runs the fused triton kernels
    where they support the inputs, else pairs (gather is launch-bound there); elsewhere gather
    (fastest on CPU), also for long inputs under no_grad."""

    def refuse(*args, **kwargs):
        raise AssertionError("backend='auto' ran FlexAttention")

    monkeypatch.setattr(mra_method, "flex_mra_attention", refuse)
    ran = []
    for kernel in ("triton_mra_attention", "pair_attention", "block_sparse_attention"):

        def recorded(*args, _kernel=kernel, _original=getattr(mra_method, kernel), **kwargs):
            ran.append(_kernel)
            return _original(*args, **kwargs)

        monkeypatch.setattr(mra_method, kernel, recorded)
    q, k, v = qkv(seq=1024, dtype=torch.float32)
    with torch.no_grad():
        make("mra2", backend="auto")(q, k, v)
    assert ran == ["triton_mra_attention" if device.type == "cuda" else "block_sparse_attention"]
    # The rule for the devices this run does not have (only device type, dtype, shape and strides are read).
    for device_type, dtype, expected in (
        ("cuda", torch.float32, "triton"),
        ("cuda", torch.float64, "pairs"),  # triton refuses fp64
        ("cpu", torch.float32, "gather"),
        ("mps", torch.float32, "gather"),
    ):
        fake = types.SimpleNamespace(
            device=torch.device(device_type), dtype=dtype, shape=(1, 2, 64, 8), stride=q[:1, :2, :64, :8].stride
        )
        assert make("mra2", backend="auto")._choose_backend(fake, fake, fake) == expected


def test_auto_takes_the_first_backend_that_can_run_and_lists_every_reason_when_none_can(monkeypatch, device):
    *first, last = mra_method.AUTO_ORDER.get(device.type, mra_method.DEFAULT_AUTO_ORDER)
    method = make("mra2", backend="auto")
    q, k, v = qkv(seq=64, dtype=torch.float32)
    for backend in first:
        monkeypatch.setitem(mra_method.BACKEND_PROBLEMS, backend, lambda *args, _name=backend: f"cannot ({_name})")
    assert method._choose_backend(q, k, v) == last
    monkeypatch.setitem(mra_method.BACKEND_PROBLEMS, last, lambda *args: "cannot either")
    reasons = "; ".join(
        [f"backend='{backend}' cannot \\({backend}\\)" for backend in first] + [f"backend='{last}' cannot either"]
    )
    with pytest.raises(ValueError, match=rf"^mra2: {reasons}$"):
        method(q, k, v)


def test_flex_backend_refuses_backward_on_cpu(device):
    if device.type != "cpu":
        pytest.skip("flex has a backward on CUDA (test_flex_forward_and_backward_match_gather_on_cuda)")
    q, k, v = (t.requires_grad_() for t in qkv(seq=64, dtype=torch.float32))
    with pytest.raises(ValueError, match="backend='gather'"):
        make("mra2", backend="flex")(q, k, v)


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "options, match",
    [
        ({"backend": "fused"}, "'triton'"),
        ({"block_size": 0}, "block_size"),
        ({"block_per_row": True}, "block_per_row"),
        ({"initial_prior_diagonal_n_blocks": -1}, "initial_prior_diagonal_n_blocks"),
    ],
)
def test_invalid_options(options, match):
    with pytest.raises(ValueError, match=match):
        make("mra2", **options)


@pytest.mark.parametrize("method", ["mra2", "mra2_s"])
# flex compiles a kernel per block size (about 4 s each on CPU): slow tier there.
@pytest.mark.parametrize("backend", ["gather", pytest.param("flex", marks=pytest.mark.slow)])
def test_any_block_size_is_exact_at_full_budget(method, backend, device):
    """block_size is any positive integer (1, 7: not a power of two, 64: above the length); flex on
    CUDA takes powers of two from 16 (Triton's tiles) and refuses the others."""
    dtype, tolerance = (torch.float64, 1e-10) if backend == "gather" else (torch.float32, 1e-5)  # flex: no fp64
    triton_tiles = backend == "flex" and device.type == "cuda"
    dim = 16 if triton_tiles else 8
    q, k, v = qkv(seq=50, dim=dim, dtype=dtype)
    for bs in (16, 64) if triton_tiles else (1, 7, 64):
        out = make(method, dim=dim, block_size=bs, block_per_row=64, backend=backend)(q, k, v)
        torch.testing.assert_close(out, softmax_reference(q, k, v), atol=tolerance, rtol=tolerance)
    if triton_tiles:
        with pytest.raises(ValueError, match="power of two >= 16 and head_dim >= 16"):
            make(method, dim=dim, block_size=7, backend=backend)(q, k, v)
        with pytest.raises(ValueError, match="power of two >= 16 and head_dim >= 16"):
            make(method, backend=backend)(*qkv(seq=50, dtype=dtype))  # head_dim 8


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_flex_forward_and_backward_match_gather_on_cuda(name, dtype, tolerance, device):
    """On CUDA flex has a backward (Triton): outputs and gradients equal gather's fp32 computation on
    the same (rounded) inputs, so that both select the same blocks, at a length that is not a multiple
    of the block size, with padding and priors, within the rounding of ``dtype`` (flex computes in
    ``dtype``; gather computes half precision in fp32)."""
    if device.type != "cuda":
        pytest.skip("compiled FlexAttention has a backward on CUDA only")
    seq, dim = 1000, 64
    inputs = qkv(batch=2, heads=4, seq=seq, dim=dim, dtype=torch.float32)
    mask = torch.ones(2, seq, dtype=torch.bool)
    mask[1, 700:] = False
    grad_out = torch.randn(2, 4, seq, dim)
    options = dict(heads=4, dim=dim, block_per_row=4, initial_prior_diagonal_n_blocks=3)
    results = []
    rounded = [t.to(dtype) for t in inputs]
    for backend, tensors in (("flex", rounded), ("gather", [t.float() for t in rounded])):
        tensors = [t.clone().requires_grad_() for t in tensors]
        out = make(name, backend=backend, **options)(*tensors, mask)
        out.backward(grad_out.to(out.dtype))
        results.append([real_rows(out.float(), mask)] + [t.grad.float() for t in tensors])
    for flex, gathered in zip(*results):
        assert torch.isfinite(flex).all()
        assert (flex - gathered).norm() / gathered.norm() < tolerance
