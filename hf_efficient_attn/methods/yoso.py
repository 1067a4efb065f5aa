"""YOSO: attention by LSH Bernoulli sampling (Zeng et al., "You Only Sample (Almost) Once", ICML 2021).

``yoso`` samples the collision-probability kernel with hyperplane hashes (linear in the length) and
back-propagates the lower-bound gradient with the forward's own hashes; ``yoso_e`` computes the
kernel exactly (the paper's YOSO-E). What each computes, the choices made where the paper is vague
(output normalisation, padding, draws) and why the hash projects in float64: docs/methods/yoso.md.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..registry import register_method
from .base import (
    AttentionMethod,
    AttentionShape,
    MethodOptions,
    Paper,
    apply_value_conv,
    check_choice,
    check_int,
    compute_dtype,
    depthwise_value_conv,
    seed_field,
)

#: eps under the square root of eq. (2) for ``gradient="exact"`` (section 1.4 adds "a small eps to
#: avoid a divide by zero error" without a value): caps the derivative at x = +-1 at
#: tau / (pi * 1e-3) instead of infinity.
EXACT_GRADIENT_EPS = 1e-6
#: Smallest size of a fast-hash block. The official code zero-pads head_dim < 32 to 32 (its warp
#: size) before hashing; we keep that floor because H D3 H D2 H D1 is a poor random rotation in very
#: few dimensions (measured: bit collision rates off by up to 0.04 at D = 8, noise level at D >= 32).
MIN_HADAMARD_SIZE = 32
#: Largest tau for ``yoso``: codes are packed from bits exactly in fp32 (see _bits_to_codes).
MAX_HASH_CODE_LEN = 24
#: dtype of the hash projections. A bit is the sign of a projection, and a projection near zero
#: takes the sign of its rounding error, so in fp32 a bit could depend on the summation order (a
#: compiled graph's fused kernels, another device) and flip one token's bucket: a jump of the output,
#: not a rounding difference. In float64 the products of fp32 (or fp16 / bf16) inputs with the
#: fast hash's integer or the Gaussian fp32 entries are exact and the sum's rounding is ~1e-16
#: relative, so the sign is that of the exact projection. The vectors hashed are the unnormalised
#: q and k (sign(P x / |x|) = sign(P x)), so neither does the rounding of the l2 normalisation
#: decide a bit.
HASH_DTYPE = torch.float64
GRADIENTS = ("lower_bound", "exact")

YOSO_PAPER = Paper(
    "You Only Sample (Almost) Once: Linear Cost Self-Attention Via Bernoulli Sampling", "Zeng et al., ICML 2021", "2111.09714"
)


def _check_conv_window(window: object) -> None:
    if window is None or (window == 0 and not isinstance(window, bool)):
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise ValueError(f"option 'conv_window' must be a positive odd integer, or None / 0 for off; got {window!r}")


HASH_CODE_LEN_HELP = "τ; 9 in the official BERT configs for the 512-token experiments of Table 3 (LRA configs use 10-12)."
CONV_WINDOW_HELP = (
    "Odd window of a depthwise convolution over V added to the output (YOSO-C); None or 0 = off, the default, "
    "since pretrained checkpoints lack this new parameter."
)


@dataclass
class YosoEOptions(MethodOptions):
    hash_code_len: int = field(default=9, metadata={"help": HASH_CODE_LEN_HELP})
    conv_window: int | None = field(default=None, metadata={"help": CONV_WINDOW_HELP})
    gradient: str = field(
        default="lower_bound", metadata={"help": ('`"lower_bound"`: eq. (3), as the official YOSO-E; `"exact"`: eq. (2).')}
    )

    def validate(self) -> None:
        check_int("hash_code_len", self.hash_code_len, 1)
        _check_conv_window(self.conv_window)
        check_choice("gradient", self.gradient, GRADIENTS)


@dataclass
class YosoOptions(MethodOptions):
    hash_code_len: int = field(default=9, metadata={"help": HASH_CODE_LEN_HELP + f" At most {MAX_HASH_CODE_LEN}."})
    num_hash: int = field(
        default=32, metadata={"help": ("m: YOSO-32 of the appendix tables (1-3) and the official BERT configs.")}
    )
    use_fast_hash: bool = field(
        default=True,
        metadata={
            "help": ("Section 1.2's fast Hadamard projections H D₃ H D₂ H D₁ instead of Gaussian ones (as the official configs).")
        },
    )
    conv_window: int | None = field(default=None, metadata={"help": CONV_WINDOW_HELP})
    seed: int = seed_field()

    def validate(self) -> None:
        check_int("hash_code_len", self.hash_code_len, 1, MAX_HASH_CODE_LEN)
        check_int("num_hash", self.num_hash, 1)
        if not isinstance(self.use_fast_hash, bool):
            raise ValueError(f"option 'use_fast_hash' must be True or False, got {self.use_fast_hash!r}")
        _check_conv_window(self.conv_window)
        check_int("seed", self.seed, 0)


# ----------------------------------------------------------------------------- hashing


def sylvester_hadamard(size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The Sylvester Hadamard matrix of a power-of-two ``size``: H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]].
    Built where it is used (log2(size) concatenations), so a traced forward holds no constant."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power-of-two size, got {size}")
    h = torch.ones(1, 1, device=device, dtype=dtype)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def _bits_to_codes(bits: torch.Tensor) -> torch.Tensor:
    """(..., m, tau) bools -> (..., m) int64 bucket ids in [0, 2**tau) (bit b has weight 2**b;
    the fp32 product is exact for tau <= 24)."""
    powers = 2.0 ** torch.arange(bits.shape[-1], device=bits.device)
    return (bits.float() @ powers).long()


def draw_hyperplanes(
    num_heads: int,
    dim: int,
    num_hash: int,
    hash_code_len: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """P with P_ij ~ N(0, 1), one (dim, m * tau) matrix per head (section 1.2, F(x) = sign(P x))."""
    return torch.randn(num_heads, dim, num_hash * hash_code_len, generator=generator, device=device)


def hyperplane_codes(x: torch.Tensor, planes: torch.Tensor, hash_code_len: int) -> torch.Tensor:
    """(B, H, N, d) vectors, (H, d, m * tau) planes -> (B, H, N, m) codes: m * tau sign bits
    split into m tau-bit codes (section 1.2). Projected in float64 (see ``HASH_DTYPE``)."""
    bits = (x.to(HASH_DTYPE) @ planes.to(HASH_DTYPE)) > 0
    return _bits_to_codes(bits.unflatten(-1, (-1, hash_code_len)))


def _hadamard_layout(dim: int, num_hash: int, hash_code_len: int) -> tuple[int, int, int]:
    """(D, codes per block, blocks): d is zero-padded to a power of two D >= d, tau and
    MIN_HADAMARD_SIZE; every block of D projected coordinates holds D // tau whole codes (a code
    never straddles two blocks, as in the official kernel), and enough blocks for m codes."""
    size = 1 << (max(dim, hash_code_len, MIN_HADAMARD_SIZE) - 1).bit_length()
    per_block = size // hash_code_len
    return size, per_block, math.ceil(num_hash / per_block)


def draw_hadamard_signs(
    num_heads: int,
    dim: int,
    num_hash: int,
    hash_code_len: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Diagonals of D1, D2, D3 (entries uniform in {-1, +1}) for every block: (H, 3, blocks, D)."""
    size, _, blocks = _hadamard_layout(dim, num_hash, hash_code_len)
    signs = torch.randint(0, 2, (num_heads, 3, blocks, size), generator=generator, device=device)
    return signs.float() * 2 - 1


def hadamard_codes(x: torch.Tensor, signs: torch.Tensor, num_hash: int, hash_code_len: int) -> torch.Tensor:
    """Section 1.2 fast hash: sign(H D3 H D2 H D1 x) per block, concatenated, split into m codes.
    (B, H, N, d) -> (B, H, N, m).

    For fixed signs, H D3 H D2 H D1 is one (D, D) matrix per head and block; we form it (D^3 per
    block, independent of n) and project with one matrix product. That is the same projection as
    the fast Walsh-Hadamard transform's log2(D) butterfly passes, at O(d D) per vector instead of
    O(D log D), but faster on CPU for D = 64 (the butterflies are memory-bound passes over the
    whole (B, H, N, blocks, D) tensor). Projected in float64 (see ``HASH_DTYPE``): the rotation's
    entries are integers (|entry| <= D^2), so each product with an fp32 coordinate is exact."""
    size, per_block, _ = _hadamard_layout(x.shape[-1], num_hash, hash_code_len)
    x = x.to(HASH_DTYPE)
    hadamard = sylvester_hadamard(size, x.device, x.dtype)
    d1, d2, d3 = signs.to(x.dtype).unbind(1)  # (H, blocks, D) each
    # Row-vector form: (H D3 H D2 H D1 x)^T = x^T D1 H D2 H D3 H (H and D symmetric).
    rotation = ((d1[..., :, None] * hadamard * d2[..., None, :]) @ hadamard * d3[..., None, :]) @ hadamard
    rotation = rotation[..., : x.shape[-1], : per_block * hash_code_len]  # zero-padded rows of x drop out
    bits = torch.einsum("bhnd,hkde->bhnke", x, rotation) > 0  # (B, H, N, blocks, codes * tau)
    bits = bits.reshape(*bits.shape[:-2], -1, hash_code_len)[..., :num_hash, :]
    return _bits_to_codes(bits)


# ----------------------------------------------------------------------------- yoso_e


def _collision_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, hash_code_len: int):
    """(cosines, B(Q K^T) * key_mask): (B, H, N, N) each; the weights are computed in place (this
    quadratic path is bound by passes over n^2 elements)."""
    cosine = (q @ k.transpose(-1, -2)).clamp_(-1.0, 1.0)
    weights = torch.acos(cosine).mul_(-1 / math.pi).add_(1).pow_(hash_code_len)
    if mask is not None:
        weights.mul_(mask.transpose(-1, -2))  # padded keys get no weight
    return cosine, weights


class _ExpectedCollisionAttention(torch.autograd.Function):
    """Y = (B(Q K^T) * key_mask) V with the backward of eq. (3) (``exact_eps`` None) or eq. (2)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, hash_code_len, exact_eps):
        ctx.save_for_backward(q, k, v, mask)  # the n^2 weights are recomputed in backward
        ctx.hash_code_len, ctx.exact_eps = hash_code_len, exact_eps
        out = _collision_weights(q, k, mask, hash_code_len)[1] @ v
        return out if mask is None else out * mask  # padded queries: 0, as in the yoso estimate

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask = ctx.saved_tensors
        tau = ctx.hash_code_len
        if mask is not None:
            grad = grad * mask  # padded queries send no gradient
        cosine, weights = _collision_weights(q, k, mask, tau)
        grad_v = weights.transpose(-1, -2) @ grad
        if ctx.exact_eps is None:  # eq. (3): dB/dx replaced by its lower bound tau/2 B
            slope = weights.mul_(tau / 2)
        else:  # eq. (2): dB/dx = tau B^((tau-1)/tau) / (pi sqrt(1 - x^2)), eps as in section 1.4
            slope = weights.pow_((tau - 1) / tau).mul_(tau / math.pi)
            slope.div_(cosine.square_().neg_().add_(1 + ctx.exact_eps).sqrt_())
            if mask is not None:  # 0 ** 0 = 1 for tau = 1: mask again
                slope.mul_(mask.transpose(-1, -2))
        d_cosine = (grad @ v.transpose(-1, -2)).mul_(slope)
        return d_cosine @ k, d_cosine.transpose(-1, -2) @ q, grad_v, None, None, None


def expected_collision_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    hash_code_len: int,
    mask: torch.Tensor | None = None,
    exact_gradient: bool = False,
) -> torch.Tensor:
    """sum_j B(q_i, k_j) v_j over real keys, for unit-norm q, k (B, H, N, d); ``mask`` (B, 1, N, 1)
    float, 1 = real token. Padded queries get 0. Backward: eq. (3), or eq. (2) with ``exact_gradient``."""
    eps = EXACT_GRADIENT_EPS if exact_gradient else None
    return _ExpectedCollisionAttention.apply(q, k, v, mask, hash_code_len, eps)


# ----------------------------------------------------------------------------- yoso


def _bucket_ids(codes: torch.Tensor, num_buckets: int, mask: torch.Tensor | None, padded_id: int) -> torch.Tensor:
    """(B, H, N, m) codes -> (m, B*H*N) rows of one table shared by all (batch, head) pairs: bucket
    (b, h, code) is row (b * H + h) * 2**tau + code. Padded tokens go to row ``padded_id``, past
    the real buckets and different for queries and keys, so they collide with nothing."""
    batch, heads = codes.shape[:2]
    offsets = torch.arange(batch * heads, device=codes.device).view(batch, heads, 1, 1) * num_buckets
    ids = codes + offsets
    if mask is not None:
        ids = ids.masked_fill(mask == 0, padded_id)
    return ids.flatten(0, 2).t().contiguous()


def _gather_bucket_sums(rows: torch.Tensor, source_ids: torch.Tensor, target_ids: torch.Tensor, table_rows: int):
    """For every target, the sum of the source ``rows`` in its bucket (one hash): a scatter-add into
    the bucket table, then a gather; O(N F)."""
    table = rows.new_zeros(table_rows, rows.shape[-1]).index_add_(0, source_ids, rows)
    return table.index_select(0, target_ids)


class _Buckets(NamedTuple):
    """One hash's rows grouped by bucket: ``order`` lists the rows bucket by bucket (stable),
    bucket b holds order[first[b] : first[b] + counts[b]]."""

    order: torch.Tensor
    counts: torch.Tensor
    first: torch.Tensor


def _group_by_bucket(ids: torch.Tensor, table_rows: int) -> _Buckets:
    counts = torch.bincount(ids, minlength=table_rows)
    return _Buckets(torch.sort(ids, stable=True).indices, counts, torch.cumsum(counts, 0) - counts)


def _gemm_buckets(query_counts: torch.Tensor, key_counts: torch.Tensor, dim: int) -> torch.Tensor:
    """Buckets where two small products through T_b = V_b^T K_b, O((n_q + n_k) d^2), beat visiting
    the n_q n_k colliding pairs, O(n_q n_k d) (section 1.4's choice, made per bucket)."""
    return query_counts * key_counts > (query_counts + key_counts) * dim


def _pair_weighted_sum(target_ids, sources: _Buckets, source_counts, a, b, c) -> torch.Tensor:
    """sum over sources j sharing target i's bucket of (a_i . b_j) c_j, visiting only the colliding
    pairs (section 1.4's sparse procedure): a sparse CSR pattern (targets x sources) built by
    counting, a sampled dense-dense product (SDDMM) and a sparse-dense product; O(nnz d).
    ``source_counts`` is ``sources.counts`` with the buckets handled otherwise set to 0."""
    per_target = source_counts[target_ids]
    crow = F.pad(torch.cumsum(per_target, 0), (1, 0))
    rank = torch.arange(int(crow[-1]), device=crow.device) - torch.repeat_interleave(crow[:-1], per_target)
    cols = sources.order[torch.repeat_interleave(sources.first[target_ids], per_target) + rank]
    ones = torch.ones(len(cols), dtype=a.dtype, device=a.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        pattern = torch.sparse_csr_tensor(crow, cols, ones, (len(target_ids), len(b)), check_invariants=False)
        return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0) @ c


#: Namespace of this module's custom op, one per copy of the module: the package's own, and the copy
#: shipped as remote code beside a model (``hea_methods_yoso.py``), which may be imported beside it.
_OP_NAMESPACE = re.sub(r"\W", "_", __name__)


@torch.library.custom_op(f"{_OP_NAMESPACE}::lsh_eq3_terms", mutates_args=())
def lsh_eq3_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad: torch.Tensor,
    query_ids: torch.Tensor,
    key_ids: torch.Tensor,
    table_rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over the m hashes of eq. (3)'s dQ and dK terms with B replaced by each hash's collision
    indicator (unscaled), for rows (B*H*N, d) and bucket ids (m, B*H*N) as in _LSHCollisionAttention::

        dQ_i = sum_h sum_{j ~_h i} (dY_i . V_j) K_j,   dK_j = sum_h sum_{i ~_h j} (dY_i . V_j) Q_i

    A custom op: its per-bucket choice of procedure reads the bucket sizes, which a compiler cannot
    trace, so a compiled graph calls it as one node and it runs eagerly."""
    grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
    for q_ids, k_ids in zip(query_ids, key_ids):
        _add_eq3_terms(q, k, v, grad, q_ids, k_ids, table_rows, grad_q, grad_k)
    return grad_q, grad_k


@lsh_eq3_terms.register_fake
def _(q, k, v, grad, query_ids, key_ids, table_rows):
    return torch.empty_like(q), torch.empty_like(k)


class _LSHCollisionAttention(torch.autograd.Function):
    """Hash-estimated Y and the hash estimate of the eq. (3) backward, with the forward's hashes.

    Inputs are flattened to rows (B*H*N, d); ``query_ids`` / ``key_ids`` (m, B*H*N) are bucket
    rows of a table with ``table_rows`` rows (see _bucket_ids)."""

    @staticmethod
    def forward(ctx, q, k, v, query_ids, key_ids, hash_code_len, table_rows):
        out = torch.zeros_like(v)
        for q_ids, k_ids in zip(query_ids, key_ids):
            out += _gather_bucket_sums(v, k_ids, q_ids, table_rows)
        ctx.save_for_backward(q, k, v, query_ids, key_ids)
        ctx.hash_code_len, ctx.table_rows = hash_code_len, table_rows
        return out / len(query_ids)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, query_ids, key_ids = ctx.saved_tensors
        grad_v = torch.zeros_like(v)
        for q_ids, k_ids in zip(query_ids, key_ids):
            # dV_j = sum_i B_ij dY_i: the forward's bucket sums with queries and keys swapped.
            grad_v += _gather_bucket_sums(grad, q_ids, k_ids, ctx.table_rows)
        grad_q, grad_k = lsh_eq3_terms(q, k, v, grad, query_ids, key_ids, ctx.table_rows)
        scale = ctx.hash_code_len / (2 * len(query_ids))  # tau/2 of eq. (3), mean over the m hashes
        return grad_q * scale, grad_k * scale, grad_v / len(query_ids), None, None, None, None


def _add_eq3_terms(q, k, v, grad, query_ids, key_ids, table_rows, grad_q, grad_k) -> None:
    """One hash's eq. (3) terms, per bucket by the cheaper of section 1.4's two procedures: the
    colliding pairs of small buckets (O(nnz d)), and for large buckets T_b = V_b^T K_b, the main
    text's bucket sums of outer products done as matrix products (O(n d^2)). Each bucket costs at
    most O((n_q + n_k) d^2), so the backward stays linear in n however the hash groups tokens."""
    queries, keys = _group_by_bucket(query_ids, table_rows), _group_by_bucket(key_ids, table_rows)
    large = _gemm_buckets(queries.counts, keys.counts, v.shape[-1])
    grad_q += _pair_weighted_sum(query_ids, keys, keys.counts.masked_fill(large, 0), grad, v, k)
    grad_k += _pair_weighted_sum(key_ids, queries, queries.counts.masked_fill(large, 0), v, grad, q)
    spans = [torch.stack([g.first[large], g.counts[large]], 1).tolist() for g in (queries, keys)]
    for (q_first, q_count), (k_first, k_count) in zip(*spans):
        i = queries.order[q_first : q_first + q_count]
        j = keys.order[k_first : k_first + k_count]
        grad_q.index_add_(0, i, grad[i] @ (v[j].t() @ k[j]))  # dY_i^T T_b with T_b = V_b^T K_b
        grad_k.index_add_(0, j, v[j] @ (grad[i].t() @ q[i]))


def _compact_ids(query_ids: torch.Tensor, key_ids: torch.Tensor, table_rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Renumber each hash's occupied buckets 0, 1, ... in the order of their ids, with static shapes:
    one sort of all hashes' ids (offset by hash, so each hash fills its own stretch of 2 B H N sorted
    ids), a count of where the sorted value changes, and the counts sent back to the ids' places. A
    table then needs 2 B H N rows (every query and key in a bucket of its own at most) instead of
    B H 2**tau + 2, which matters for large tau or short sequences."""
    num_hash, rows = query_ids.shape
    offsets = torch.arange(num_hash, device=query_ids.device).view(num_hash, 1) * table_rows
    ids = (torch.cat([query_ids, key_ids], 1) + offsets).flatten()
    sorted_ids, order = ids.sort()
    changes = (sorted_ids[1:] != sorted_ids[:-1]).long()
    dense = torch.cat([changes.new_zeros(1), changes]).cumsum(0).view(num_hash, 2 * rows)
    dense = dense - dense[:, :1]  # hash h's stretch starts at its smallest id
    compact = torch.empty_like(ids).scatter(0, order, dense.flatten()).view(num_hash, 2 * rows)
    return compact[:, :rows].contiguous(), compact[:, rows:].contiguous(), 2 * rows


def lsh_collision_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_codes: torch.Tensor,
    key_codes: torch.Tensor,
    hash_code_len: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(1/m) sum_h sum_{j real, key_codes[j,h] == query_codes[i,h]} v_j: the unbiased estimate of
    ``expected_collision_attention`` for unit q, k (B, H, N, d) and (B, H, N, m) codes; ``mask``
    (B, 1, N, 1) float, 1 = real token. Padded queries get 0. Backward: hash estimate of eq. (3)."""
    num_buckets = 2**hash_code_len
    padded_id = q.shape[0] * q.shape[1] * num_buckets  # rows padded_id (keys), + 1 (queries): empty
    query_ids = _bucket_ids(query_codes, num_buckets, mask, padded_id + 1)
    key_ids = _bucket_ids(key_codes, num_buckets, mask, padded_id)
    table_rows = padded_id + 2
    if table_rows > 2 * query_ids.shape[1]:  # decided by shapes alone
        query_ids, key_ids, table_rows = _compact_ids(query_ids, key_ids, table_rows)
    flat = [x.reshape(-1, x.shape[-1]) for x in (q, k, v)]
    return _LSHCollisionAttention.apply(*flat, query_ids, key_ids, hash_code_len, table_rows).view(v.shape)


# ----------------------------------------------------------------------------- modules


class _YosoBase(AttentionMethod):
    """Normalise Q, K; cumulate; l2-normalise the rows; add the optional depthwise convolution."""

    approximates_softmax = False  # weights (1 - arccos/pi)^tau, not softmax

    def __init__(self, options: YosoEOptions | YosoOptions, shape: AttentionShape):
        super().__init__(options, shape)
        self.conv = depthwise_value_conv(shape.num_heads, options.conv_window)  # YOSO-C

    def cumulate(self, q, k, v, mask, raw_qk):
        """sum_j B(q_i, k_j) v_j (exact or sampled) for unit q, k; (B, H, N, D). ``raw_qk``: q and k
        as given, before normalisation (what ``yoso`` hashes)."""
        raise NotImplementedError

    def attend(self, q, k, v, key_padding_mask, scaling):
        # ``scaling`` is unused: YOSO works on unit-norm q, k (section 1.1).
        dtype = compute_dtype(q)  # arccos, powers and sums in fp32 under fp16 / bf16
        raw_qk = (q, k)
        q, k, v = F.normalize(q.to(dtype), dim=-1), F.normalize(k.to(dtype), dim=-1), v.to(dtype)
        mask = None if key_padding_mask is None else key_padding_mask[:, None, :, None].to(dtype)
        out = F.normalize(self.cumulate(q, k, v, mask, raw_qk), dim=-1)
        if self.conv is not None:
            out = out + apply_value_conv(self.conv, v)
        return out


@register_method
class YosoE(_YosoBase):
    """YOSO-E: the expectation of YOSO, (1 - arccos(Q K^T)/pi)^tau V, computed exactly (O(n^2))."""

    name = "yoso_e"
    paper = YOSO_PAPER
    cost = "O(n² d)"
    options_cls = YosoEOptions

    def cumulate(self, q, k, v, mask, raw_qk):
        exact = self.options.gradient == "exact"
        return expected_collision_attention(q, k, v, self.options.hash_code_len, mask, exact)


@register_method
class Yoso(_YosoBase):
    """YOSO: m LSH hashes of tau bits sample (1 - arccos(Q K^T)/pi)^tau V in O(n)."""

    name = "yoso"
    paper = YOSO_PAPER
    cost = "O(n m τ d)"
    budget_option = "num_hash"
    exact_reference = "yoso_e"
    options_cls = YosoOptions
    samples = True  # fresh hashes every training step, fixed seeded ones in eval

    def seeded_draws(self, generator):
        # One draw per head, shared by the batch: an example's eval output does not depend on
        # the other examples of its batch (the official code draws per (example, head)).
        return {"projections": self._draw_projections(generator)}

    def _draw_projections(self, generator=None, device=None) -> torch.Tensor:
        """The fast hash's D1, D2, D3 signs, or the Gaussian hyperplanes."""
        opts, shape = self.options, self.shape
        draw = draw_hadamard_signs if opts.use_fast_hash else draw_hyperplanes
        return draw(shape.num_heads, shape.head_dim, opts.num_hash, opts.hash_code_len, generator, device)

    def cumulate(self, q, k, v, mask, raw_qk):
        opts = self.options
        with torch.no_grad():
            projections = self._draw_projections(device=q.device) if self.training else self.projections
            # The unnormalised q, k: the same signs as the unit ones, without the normalisation's
            # rounding (which a compiled graph does in another order; see HASH_DTYPE).
            if opts.use_fast_hash:
                codes = [hadamard_codes(x, projections, opts.num_hash, opts.hash_code_len) for x in raw_qk]
            else:
                codes = [hyperplane_codes(x, projections, opts.hash_code_len) for x in raw_qk]
        return lsh_collision_attention(q, k, v, codes[0], codes[1], opts.hash_code_len, mask)
