"""The Triton kernels of MRA-2's ``triton`` backend (Zeng et al., "Multi Resolution Analysis (MRA) for
Approximate Self-Attention", ICML 2022); :mod:`.triton` launches them and says what each
computes. Imported only when the backend runs (it imports Triton).

Written to what Triton 3.6 (the GPU machines) and 3.9 (here) both run, compiled and interpreted
(``TRITON_INTERPRET=1``, how the tests run them on CPU): plain pointer arithmetic, ``tl.load`` /
``tl.store`` / ``tl.dot`` / ``tl.atomic_or``. Shapes in the comments: BS = block size (a query or
key block), TILE = block means handled at once, D = head size (BLOCK_D its power-of-two tile).
Every accumulator, block mean, logit, running maximum and sum is fp32; fp16/bf16 inputs enter the
exact blocks' matrix products as they are, with the probabilities rounded to the input dtype for
their product with V (FlashAttention's scheme).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Low bits of a selection key that hold the pair index x * nb + y (reversed, for the tie rule).
PAIR_BITS = 26
#: Blocks per sequence the selection keys can index (nb² pairs in PAIR_BITS bits).
MAX_BLOCKS = 2 ** (PAIR_BITS // 2)

# A selection key, from its highest bits: prior sets (2 bits), the order-preserving score (32 bits),
# the pair index x * nb + y reversed (PAIR_BITS bits, all ones minus the index). Kernels read module
# constants only as constexprs (Triton 3.x).
PAIR_MASK = tl.constexpr((1 << PAIR_BITS) - 1)
SCORE_SHIFT = tl.constexpr(PAIR_BITS)
PRIOR_SHIFT = tl.constexpr(PAIR_BITS + 32)


@triton.jit
def _bit_index(single_bit):
    """Position (0-31) of the one set bit of an int32: the exponent of its (exact) float value."""
    as_float = single_bit.to(tl.float32)
    return ((as_float.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _block_rows(ptr, base, rows, rows_ok, stride_n, stride_d, d, d_ok):
    """The (BS, BLOCK_D) tile of rows ``rows`` of one (batch, head) of a (B, H, N, D) tensor; 0 outside."""
    return tl.load(
        ptr + base + rows[:, None] * stride_n + d[None, :] * stride_d, mask=rows_ok[:, None] & d_ok[None, :], other=0.0
    )


@triton.jit
def _means_tile(means_ptr, bh, blocks, blocks_ok, NB, D, d, d_ok):
    """(TILE, BLOCK_D) fp32 rows ``blocks`` of one (batch, head) of a (B * H, NB, D) tensor; 0 outside."""
    offsets = (bh * NB + blocks[:, None]) * D + d[None, :]
    return tl.load(means_ptr + offsets, mask=blocks_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def block_means_kernel(
    q_ptr, k_ptr, v_ptr, real_ptr, means_ptr, counts_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, N, NB, D, plane,
    HAS_MASK: tl.constexpr, BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H). Eqs. 11 and 17: the means of the real queries, keys and values of block x
    (``means`` (3, B * H, NB, D) fp32) and its number of real tokens (``counts`` (B, NB) int32)."""
    x = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = x * BS + tl.arange(0, BS)
    real = rows < N
    if HAS_MASK:
        real = real & (tl.load(real_ptr + b * N + rows, mask=real, other=0) != 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    count = tl.sum(real.to(tl.int32), 0)
    inverse = 1.0 / tl.maximum(count, 1).to(tl.float32)
    target = means_ptr + (bh * NB + x) * D + d
    q = _block_rows(q_ptr, b * stride_qb + h * stride_qh, rows, real, stride_qn, stride_qd, d, d_ok).to(tl.float32)
    tl.store(target, tl.sum(q, 0) * inverse, mask=d_ok)
    k = _block_rows(k_ptr, b * stride_kb + h * stride_kh, rows, real, stride_kn, stride_kd, d, d_ok).to(tl.float32)
    tl.store(target + plane, tl.sum(k, 0) * inverse, mask=d_ok)
    v = _block_rows(v_ptr, b * stride_vb + h * stride_vh, rows, real, stride_vn, stride_vd, d, d_ok).to(tl.float32)
    tl.store(target + 2 * plane, tl.sum(v, 0) * inverse, mask=d_ok)
    if h == 0:
        tl.store(counts_ptr + b * NB + x, count)


@triton.jit
def _block_logits(query_means, means_ptr, plane, bh, ys, ys_ok, NB, D, d, d_ok, scaling):
    """log mu (eq. 12) of TILE query blocks against key blocks ``ys``: (TILE, TILE) fp32."""
    key_means = _means_tile(means_ptr + plane, bh, ys, ys_ok, NB, D, d, d_ok)
    return tl.dot(query_means, tl.trans(key_means), input_precision="ieee") * scaling


@triton.jit
def selection_keys_kernel(
    means_ptr, counts_ptr, keys_ptr, plane, scaling,
    H, NB, D, FIRST_N, DIAGONAL_N,
    TILE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, TILE), B * H). Alg. 1's ranking of every block pair (x, y) as one int64 key,
    larger = ranked first: the number of prior sets holding the pair (2 bits), then its score
    log mu - row maximum as an order-preserving integer (32 bits), then the reversed pair index
    (PAIR_BITS bits: ties go to the lowest x * NB + y). Pairs with a block without real tokens get
    the lowest score (-inf) and no prior set. ``keys`` (B * H, NB * NB)."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    xs = tl.program_id(0) * TILE + tl.arange(0, TILE)
    xs_ok = xs < NB
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    query_means = _means_tile(means_ptr, bh, xs, xs_ok, NB, D, d, d_ok)
    query_real = tl.load(counts_ptr + b * NB + xs, mask=xs_ok, other=0) > 0
    row_max = tl.full([TILE], float("-inf"), tl.float32)
    for y0 in range(0, NB, TILE):
        ys = y0 + tl.arange(0, TILE)
        ys_ok = ys < NB
        eligible = query_real[:, None] & (tl.load(counts_ptr + b * NB + ys, mask=ys_ok, other=0) > 0)[None, :]
        logits = _block_logits(query_means, means_ptr, plane, bh, ys, ys_ok, NB, D, d, d_ok, scaling)
        row_max = tl.maximum(row_max, tl.max(tl.where(eligible, logits, float("-inf")), 1))
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    for y0 in range(0, NB, TILE):
        ys = y0 + tl.arange(0, TILE)
        ys_ok = ys < NB
        eligible = query_real[:, None] & (tl.load(counts_ptr + b * NB + ys, mask=ys_ok, other=0) > 0)[None, :]
        logits = _block_logits(query_means, means_ptr, plane, bh, ys, ys_ok, NB, D, d, d_ok, scaling)
        score = tl.where(eligible, logits - row_max[:, None], float("-inf"))
        score = tl.where(score == 0.0, 0.0, score)  # -0.0 and 0.0 rank alike
        bits = score.to(tl.int32, bitcast=True)
        # IEEE floats order as sign-magnitude integers: flip the magnitude of negatives, then shift
        # the signed range to [0, 2**32).
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
        prior_sets = (xs[:, None] < FIRST_N).to(tl.int64) + (ys[None, :] < FIRST_N).to(tl.int64)
        if DIAGONAL_N > 0:
            prior_sets += (tl.abs(xs[:, None] - ys[None, :]) <= DIAGONAL_N // 2).to(tl.int64)
        prior_sets = tl.where(eligible, prior_sets, 0)
        pair = xs[:, None].to(tl.int64) * NB + ys[None, :]
        key = (prior_sets << PRIOR_SHIFT) | (ordered << SCORE_SHIFT) | (pair ^ PAIR_MASK)
        tl.store(keys_ptr + bh * NB * NB + pair, key, mask=xs_ok[:, None] & ys_ok[None, :])


@triton.jit
def selected_bitmaps_kernel(
    top_keys_ptr, counts_ptr, bitmaps_ptr, bitmap_plane,
    H, NB, NW, K, BLOCK_PER_ROW,
    BLOCK: tl.constexpr, BLOCK_NB: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(K, BLOCK), B * H). The budget of sequence b (block_per_row x its query blocks
    holding a real token, at most all real pairs) keeps the first ``budget`` of the K largest keys
    (``top_keys`` (B * H, K), descending); each kept pair (x, y) sets bit y of row x in the
    row-major bitmap and bit x of row y in the column-major one (``bitmaps`` (2, B * H, NB, NW) int32,
    zeroed)."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    real_blocks = 0
    for c0 in range(0, NB, BLOCK_NB):
        c = c0 + tl.arange(0, BLOCK_NB)
        real_blocks += tl.sum((tl.load(counts_ptr + b * NB + c, mask=c < NB, other=0) > 0).to(tl.int32), 0)
    budget = tl.minimum(real_blocks * BLOCK_PER_ROW, real_blocks * real_blocks)
    rank = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kept = (rank < K) & (rank < budget)
    key = tl.load(top_keys_ptr + bh * K + rank, mask=kept, other=0)
    pair = ((key & PAIR_MASK) ^ PAIR_MASK).to(tl.int32)
    x, y = pair // NB, pair % NB
    tl.atomic_or(bitmaps_ptr + (bh * NB + x) * NW + y // 32, 1 << (y % 32), mask=kept)
    tl.atomic_or(bitmaps_ptr + bitmap_plane + (bh * NB + y) * NW + x // 32, 1 << (x % 32), mask=kept)


@triton.jit
def _low_resolution_weights(
    query_means, means_ptr, counts_ptr, bitmaps_ptr, plane, scaling, bh, b, xs, xs_ok, ys, ys_ok, NB, NW, D, d, d_ok
):
    """Eqs. 13 and 17 for TILE query blocks ``xs`` against key blocks ``ys``: the scores
    log(c_y mu_xy) (TILE, TILE) fp32 of the pairs kept at low resolution (key block with a real token,
    not selected), -inf for the others."""
    counts = tl.load(counts_ptr + b * NB + ys, mask=ys_ok, other=0)
    scores = _block_logits(query_means, means_ptr, plane, bh, ys, ys_ok, NB, D, d, d_ok, scaling)
    scores += tl.log(tl.maximum(counts, 1).to(tl.float32))[None, :]
    words = tl.load(bitmaps_ptr + (bh * NB + xs[:, None]) * NW + ys[None, :] // 32, mask=xs_ok[:, None] & ys_ok[None, :], other=0)
    selected = ((words >> (ys[None, :] % 32)) & 1) != 0
    return tl.where((counts > 0)[None, :] & ~selected, scores, float("-inf"))


@triton.jit
def low_resolution_kernel(
    means_ptr, counts_ptr, bitmaps_ptr, low_out_ptr, low_lse_ptr, plane, scaling,
    H, NB, NW, D,
    TILE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, TILE), B * H). Alg. 2 at resolution BS: per query block x, softmax over the
    key blocks kept at low resolution of log(c_y mu_xy), applied to the value means (eq. 13, 17).
    ``low_out`` (B * H, NB, D) and ``low_lse`` (B * H, NB), 0 and -inf where no block is kept."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    xs = tl.program_id(0) * TILE + tl.arange(0, TILE)
    xs_ok = xs < NB
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    query_means = _means_tile(means_ptr, bh, xs, xs_ok, NB, D, d, d_ok)
    row_max = tl.full([TILE], float("-inf"), tl.float32)
    total = tl.zeros([TILE], tl.float32)
    acc = tl.zeros([TILE, BLOCK_D], tl.float32)
    for y0 in range(0, NB, TILE):
        ys = y0 + tl.arange(0, TILE)
        ys_ok = ys < NB
        scores = _low_resolution_weights(
            query_means, means_ptr, counts_ptr, bitmaps_ptr, plane, scaling, bh, b, xs, xs_ok, ys, ys_ok, NB, NW, D, d, d_ok
        )
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        reference = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(scores - reference[:, None])
        rescale = tl.exp(row_max - reference)
        value_means = _means_tile(means_ptr + 2 * plane, bh, ys, ys_ok, NB, D, d, d_ok)
        total = total * rescale + tl.sum(probs, 1)
        acc = acc * rescale[:, None] + tl.dot(probs, value_means, input_precision="ieee")
        row_max = new_max
    nonempty = total > 0
    lse = tl.where(nonempty, row_max + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, total, 1.0)[:, None], 0.0)
    tl.store(low_lse_ptr + bh * NB + xs, lse, mask=xs_ok)
    tl.store(low_out_ptr + (bh * NB + xs[:, None]) * D + d[None, :], out, mask=xs_ok[:, None] & d_ok[None, :])


@triton.jit
def exact_forward_kernel(
    q_ptr, k_ptr, v_ptr, real_ptr, bitmaps_ptr, low_out_ptr, low_lse_ptr, out_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    scaling, H, N, NB, NW, D,
    HAS_MASK: tl.constexpr, LOW_RESOLUTION: tl.constexpr, PRECISION: tl.constexpr,
    BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H). Alg. 2 at resolution 1 for the BS queries of block x: an online softmax over
    the keys of its selected blocks (its bitmap row, ascending), then the low-resolution part as one
    extra key (value ``low_out[x]``, score ``low_lse[x]``), which merges both parts by their
    log-sum-exps (eq. 14). ``out`` (B, H, N, D) in q's dtype, ``lse`` (B * H, NB * BS) fp32; rows
    with no key at all give 0 and -inf."""
    x = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = x * BS + tl.arange(0, BS)
    rows_ok = rows < N
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = _block_rows(q_ptr, b * stride_qb + h * stride_qh, rows, rows_ok, stride_qn, stride_qd, d, d_ok)
    row_max = tl.full([BS], float("-inf"), tl.float32)
    total = tl.zeros([BS], tl.float32)
    acc = tl.zeros([BS, BLOCK_D], tl.float32)
    for w in range(0, NW):
        word = tl.load(bitmaps_ptr + (bh * NB + x) * NW + w)
        while word != 0:
            lowest_bit = word & -word
            word = word ^ lowest_bit
            cols = (w * 32 + _bit_index(lowest_bit)) * BS + tl.arange(0, BS)
            keys_ok = cols < N
            if HAS_MASK:
                keys_ok = keys_ok & (tl.load(real_ptr + b * N + cols, mask=keys_ok, other=0) != 0)
            k = _block_rows(k_ptr, b * stride_kb + h * stride_kh, cols, cols < N, stride_kn, stride_kd, d, d_ok)
            v = _block_rows(v_ptr, b * stride_vb + h * stride_vh, cols, cols < N, stride_vn, stride_vd, d, d_ok)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling
            scores = tl.where(keys_ok[None, :], scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))  # finite: a selected block holds a real key
            probs = tl.exp(scores - new_max[:, None])
            rescale = tl.exp(row_max - new_max)
            total = total * rescale + tl.sum(probs, 1)
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
            row_max = new_max
    if LOW_RESOLUTION:
        extra_score = tl.load(low_lse_ptr + bh * NB + x)
        extra_value = tl.load(low_out_ptr + (bh * NB + x) * D + d, mask=d_ok, other=0.0)
        new_max = tl.maximum(row_max, extra_score)
        reference = tl.where(new_max == float("-inf"), 0.0, new_max)
        rescale = tl.exp(row_max - reference)
        extra_weight = tl.exp(extra_score - reference)
        total = total * rescale + extra_weight
        acc = acc * rescale[:, None] + extra_weight[:, None] * extra_value[None, :]
        row_max = new_max
    nonempty = total > 0
    safe_total = tl.where(nonempty, total, 1.0)
    lse = tl.where(nonempty, row_max + tl.log(safe_total), float("-inf"))
    out = tl.where(nonempty[:, None], acc / safe_total[:, None], 0.0)
    tl.store(lse_ptr + bh * NB * BS + rows, lse)
    target = out_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + d[None, :] * stride_od
    tl.store(target, out.to(out_ptr.dtype.element_ty), mask=rows_ok[:, None] & d_ok[None, :])


@triton.jit
def backward_preprocess_kernel(
    out_ptr, grad_ptr, lse_ptr, delta_ptr, low_grad_ptr, low_weight_ptr, low_ref_ptr,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_gb, stride_gh, stride_gn, stride_gd,
    H, N, NB, D,
    LOW_RESOLUTION: tl.constexpr, BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H). delta_i = dO_i . O_i for the rows of block x (``delta`` (B * H, NB * BS)) and,
    for the low-resolution part, with m_x = the smallest finite lse of its rows (``low_ref``):
    G_x = sum_i dO_i exp(m_x - lse_i) (``low_grad`` (B * H, NB, D)) and
    E_x = sum_i delta_i exp(m_x - lse_i) (``low_weight``), every factor at most 1."""
    x = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = x * BS + tl.arange(0, BS)
    rows_ok = rows < N
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    out = _block_rows(out_ptr, b * stride_ob + h * stride_oh, rows, rows_ok, stride_on, stride_od, d, d_ok).to(tl.float32)
    grad = _block_rows(grad_ptr, b * stride_gb + h * stride_gh, rows, rows_ok, stride_gn, stride_gd, d, d_ok).to(tl.float32)
    delta = tl.sum(out * grad, 1)
    tl.store(delta_ptr + bh * NB * BS + rows, delta)
    if LOW_RESOLUTION:
        lse = tl.load(lse_ptr + bh * NB * BS + rows, mask=rows_ok, other=float("-inf"))
        finite = lse > float("-inf")
        reference = tl.min(tl.where(finite, lse, float("inf")), 0)
        reference = tl.where(reference == float("inf"), 0.0, reference)
        factor = tl.where(finite, tl.exp(reference - tl.where(finite, lse, 0.0)), 0.0)
        tl.store(low_grad_ptr + (bh * NB + x) * D + d, tl.sum(grad * factor[:, None], 0), mask=d_ok)
        tl.store(low_weight_ptr + bh * NB + x, tl.sum(delta * factor, 0))
        tl.store(low_ref_ptr + bh * NB + x, reference)


@triton.jit
def low_resolution_backward_kernel(
    means_ptr, counts_ptr, bitmaps_ptr, low_grad_ptr, low_weight_ptr, low_ref_ptr, grad_means_ptr,
    plane, bitmap_plane, scaling,
    H, NB, NW, D,
    TILE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, TILE), B * H, 2): gradients of the block means through the low-resolution
    part (``grad_means`` (3, B * H, NB, D) fp32). With w_xy = exp(log(c_y mu_xy) - m_x) over the kept
    pairs, dl_xy = w_xy (G_x . v~_y - E_x) is the gradient of the score log(c_y mu_xy) (the
    softmax's, merged with the exact part); programs of axis 2 = 0 sum over y per query-block tile
    (d q~_x = scaling sum_y dl_xy k~_y), of axis 2 = 1 over x per key-block tile
    (d k~_y = scaling sum_x dl_xy q~_x, d v~_y = sum_x w_xy G_x)."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    own = tl.program_id(0) * TILE + tl.arange(0, TILE)
    own_ok = own < NB
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    if tl.program_id(2) == 0:  # own = query blocks x
        query_means = _means_tile(means_ptr, bh, own, own_ok, NB, D, d, d_ok)
        low_grad = _means_tile(low_grad_ptr, bh, own, own_ok, NB, D, d, d_ok)
        low_weight = tl.load(low_weight_ptr + bh * NB + own, mask=own_ok, other=0.0)
        reference = tl.load(low_ref_ptr + bh * NB + own, mask=own_ok, other=0.0)
        grad_query = tl.zeros([TILE, BLOCK_D], tl.float32)
        for y0 in range(0, NB, TILE):
            ys = y0 + tl.arange(0, TILE)
            ys_ok = ys < NB
            scores = _low_resolution_weights(
                query_means, means_ptr, counts_ptr, bitmaps_ptr, plane, scaling, bh, b, own, own_ok, ys, ys_ok, NB, NW, D, d, d_ok
            )
            weights = tl.exp(scores - reference[:, None])
            key_means = _means_tile(means_ptr + plane, bh, ys, ys_ok, NB, D, d, d_ok)
            value_means = _means_tile(means_ptr + 2 * plane, bh, ys, ys_ok, NB, D, d, d_ok)
            dot_value = tl.dot(low_grad, tl.trans(value_means), input_precision="ieee")
            grad_scores = weights * (dot_value - low_weight[:, None])
            grad_query += tl.dot(grad_scores, key_means, input_precision="ieee")
        target = grad_means_ptr + (bh * NB + own[:, None]) * D + d[None, :]
        tl.store(target, grad_query * scaling, mask=own_ok[:, None] & d_ok[None, :])
    else:  # own = key blocks y; scores and weights transposed: (y, x)
        key_means = _means_tile(means_ptr + plane, bh, own, own_ok, NB, D, d, d_ok)
        value_means = _means_tile(means_ptr + 2 * plane, bh, own, own_ok, NB, D, d, d_ok)
        counts = tl.load(counts_ptr + b * NB + own, mask=own_ok, other=0)
        log_counts = tl.log(tl.maximum(counts, 1).to(tl.float32))
        grad_key = tl.zeros([TILE, BLOCK_D], tl.float32)
        grad_value = tl.zeros([TILE, BLOCK_D], tl.float32)
        for x0 in range(0, NB, TILE):
            xs = x0 + tl.arange(0, TILE)
            xs_ok = xs < NB
            query_means = _means_tile(means_ptr, bh, xs, xs_ok, NB, D, d, d_ok)
            low_grad = _means_tile(low_grad_ptr, bh, xs, xs_ok, NB, D, d, d_ok)
            low_weight = tl.load(low_weight_ptr + bh * NB + xs, mask=xs_ok, other=0.0)
            reference = tl.load(low_ref_ptr + bh * NB + xs, mask=xs_ok, other=0.0)
            scores = tl.dot(key_means, tl.trans(query_means), input_precision="ieee") * scaling + log_counts[:, None]
            words = tl.load(
                bitmaps_ptr + bitmap_plane + (bh * NB + own[:, None]) * NW + xs[None, :] // 32,
                mask=own_ok[:, None] & xs_ok[None, :],
                other=0,
            )
            kept = (counts > 0)[:, None] & (((words >> (xs[None, :] % 32)) & 1) == 0) & xs_ok[None, :]
            weights = tl.where(kept, tl.exp(scores - reference[None, :]), 0.0)
            dot_value = tl.dot(value_means, tl.trans(low_grad), input_precision="ieee")
            grad_scores = weights * (dot_value - low_weight[None, :])
            grad_key += tl.dot(grad_scores, query_means, input_precision="ieee")
            grad_value += tl.dot(weights, low_grad, input_precision="ieee")
        target = grad_means_ptr + (bh * NB + own[:, None]) * D + d[None, :]
        tile_ok = own_ok[:, None] & d_ok[None, :]
        tl.store(target + plane, grad_key * scaling, mask=tile_ok)
        tl.store(target + 2 * plane, grad_value, mask=tile_ok)


@triton.jit
def exact_backward_kernel(
    q_ptr, k_ptr, v_ptr, real_ptr, grad_ptr, lse_ptr, delta_ptr, bitmaps_ptr, counts_ptr, grad_means_ptr,
    dq_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_xb, stride_xh, stride_xn, stride_xd,
    plane, bitmap_plane, scaling, H, N, NB, NW, D,
    HAS_MASK: tl.constexpr, LOW_RESOLUTION: tl.constexpr, PRECISION: tl.constexpr,
    BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H, 2). The exact blocks' backward, recomputing P = exp(S - lse):
    dS = P (dO V^T - delta). Axis 2 = 0: block x's dQ = scaling dS K over its selected key blocks
    (its bitmap row); axis 2 = 1: block y's dK = scaling dS^T Q and dV = P^T dO over the query
    blocks that selected it (its column-major bitmap row), each written once, no atomics. With the
    low-resolution part, each real token also gets its block mean's gradient / c (eqs. 11, 17).
    ``dq``, ``dk``, ``dv`` share one layout (strides ``stride_x*``)."""
    own = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    own_rows = own * BS + tl.arange(0, BS)
    own_ok = own_rows < N
    own_real = own_ok
    if HAS_MASK:
        own_real = own_real & (tl.load(real_ptr + b * N + own_rows, mask=own_ok, other=0) != 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q_base, k_base, v_base = b * stride_qb + h * stride_qh, b * stride_kb + h * stride_kh, b * stride_vb + h * stride_vh
    g_base = b * stride_gb + h * stride_gh
    bitmap_row = bitmaps_ptr + tl.program_id(2) * bitmap_plane + (bh * NB + own) * NW
    target = b * stride_xb + h * stride_xh + own_rows[:, None] * stride_xn + d[None, :] * stride_xd
    tile_ok = own_ok[:, None] & d_ok[None, :]
    count = tl.maximum(tl.load(counts_ptr + b * NB + own), 1).to(tl.float32)
    if tl.program_id(2) == 0:  # own = query block x
        q = _block_rows(q_ptr, q_base, own_rows, own_ok, stride_qn, stride_qd, d, d_ok)
        grad = _block_rows(grad_ptr, g_base, own_rows, own_ok, stride_gn, stride_gd, d, d_ok)
        lse = tl.load(lse_ptr + bh * NB * BS + own_rows)
        lse = tl.where(lse == float("-inf"), float("inf"), lse)  # a row without keys: P = 0
        delta = tl.load(delta_ptr + bh * NB * BS + own_rows)
        grad_q = tl.zeros([BS, BLOCK_D], tl.float32)
        for w in range(0, NW):
            word = tl.load(bitmap_row + w)
            while word != 0:
                lowest_bit = word & -word
                word = word ^ lowest_bit
                cols = (w * 32 + _bit_index(lowest_bit)) * BS + tl.arange(0, BS)
                keys_ok = cols < N
                if HAS_MASK:
                    keys_ok = keys_ok & (tl.load(real_ptr + b * N + cols, mask=keys_ok, other=0) != 0)
                k = _block_rows(k_ptr, k_base, cols, cols < N, stride_kn, stride_kd, d, d_ok)
                v = _block_rows(v_ptr, v_base, cols, cols < N, stride_vn, stride_vd, d, d_ok)
                scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling
                probs = tl.where(keys_ok[None, :], tl.exp(scores - lse[:, None]), 0.0)
                grad_probs = tl.dot(grad, tl.trans(v), input_precision=PRECISION)
                grad_scores = probs * (grad_probs - delta[:, None])
                grad_q += tl.dot(grad_scores.to(k.dtype), k, input_precision=PRECISION)
        grad_q *= scaling
        if LOW_RESOLUTION:
            grad_mean = tl.load(grad_means_ptr + (bh * NB + own) * D + d, mask=d_ok, other=0.0)
            grad_q += tl.where(own_real[:, None], grad_mean[None, :] / count, 0.0)
        tl.store(dq_ptr + target, grad_q.to(dq_ptr.dtype.element_ty), mask=tile_ok)
    else:  # own = key block y; scores and probabilities transposed: (keys, queries)
        k = _block_rows(k_ptr, k_base, own_rows, own_ok, stride_kn, stride_kd, d, d_ok)
        v = _block_rows(v_ptr, v_base, own_rows, own_ok, stride_vn, stride_vd, d, d_ok)
        grad_k = tl.zeros([BS, BLOCK_D], tl.float32)
        grad_v = tl.zeros([BS, BLOCK_D], tl.float32)
        for w in range(0, NW):
            word = tl.load(bitmap_row + w)
            while word != 0:
                lowest_bit = word & -word
                word = word ^ lowest_bit
                rows = (w * 32 + _bit_index(lowest_bit)) * BS + tl.arange(0, BS)
                rows_ok = rows < N
                q = _block_rows(q_ptr, q_base, rows, rows_ok, stride_qn, stride_qd, d, d_ok)
                grad = _block_rows(grad_ptr, g_base, rows, rows_ok, stride_gn, stride_gd, d, d_ok)
                lse = tl.load(lse_ptr + bh * NB * BS + rows)
                lse = tl.where(lse == float("-inf"), float("inf"), lse)
                delta = tl.load(delta_ptr + bh * NB * BS + rows)
                scores = tl.dot(k, tl.trans(q), input_precision=PRECISION) * scaling
                probs = tl.where(own_real[:, None], tl.exp(scores - lse[None, :]), 0.0)
                grad_v += tl.dot(probs.to(grad.dtype), grad, input_precision=PRECISION)
                grad_probs = tl.dot(v, tl.trans(grad), input_precision=PRECISION)
                grad_scores = probs * (grad_probs - delta[None, :])
                grad_k += tl.dot(grad_scores.to(q.dtype), q, input_precision=PRECISION)
        grad_k *= scaling
        if LOW_RESOLUTION:
            grad_means = grad_means_ptr + (bh * NB + own) * D + d
            grad_k += tl.where(own_real[:, None], tl.load(grad_means + plane, mask=d_ok, other=0.0)[None, :] / count, 0.0)
            grad_v += tl.where(own_real[:, None], tl.load(grad_means + 2 * plane, mask=d_ok, other=0.0)[None, :] / count, 0.0)
        tl.store(dk_ptr + target, grad_k.to(dk_ptr.dtype.element_ty), mask=tile_ok)
        tl.store(dv_ptr + target, grad_v.to(dv_ptr.dtype.element_ty), mask=tile_ok)
