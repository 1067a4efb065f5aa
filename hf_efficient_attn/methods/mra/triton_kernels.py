"""The Triton kernels of MRA-2's ``triton`` backend (Zeng et al., "Multi Resolution Analysis (MRA) for
Approximate Self-Attention", ICML 2022); :mod:`.triton` launches them and says what each
computes. Imported only when the backend runs (it imports Triton).

Written to what Triton 3.6 (the GPU machines) and 3.9 (here) both run, compiled and interpreted
(``TRITON_INTERPRET=1``, how the tests run them on CPU): plain pointer arithmetic, ``tl.load`` /
``tl.store`` / ``tl.dot`` / ``tl.cumsum``, no atomics. Shapes in the comments: BS = block size (a query or
key block), TILE = block means handled at once, D = head size (BLOCK_D its power-of-two tile).
Every accumulator, block mean, logit, running maximum and sum is fp32; fp16/bf16 inputs enter the
exact blocks' matrix products as they are, with the probabilities rounded to the input dtype for
their product with V (FlashAttention's scheme).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Precision of the products of block means (selection logits, the low-resolution part and its backward),
#: fp32 operands: three TF32 tensor-core products that recover fp32's mantissa (about fp32's accuracy, so the
#: selection ranks as with fp32 products), where IEEE fp32 runs as FMA loops. Kernels read module constants
#: only as constexprs (Triton 3.x).
MEANS_PRECISION = tl.constexpr("tf32x3")
#: Integer arguments that follow the sequence's length: compiled as plain integers, not specialised as
#: Triton does by default (on being 1, on divisibility by 16), so that a new length does not compile
#: every kernel again. They scale scalar offsets only: nothing to vectorise.
LENGTH_ARGUMENTS = [
    "N", "NB", "NW", "K", "ITEMS", "SLOTS", "plane", "bitmap_plane", "tally_plane", "part_plane",
    "stride_qb", "stride_kb", "stride_vb", "stride_ob", "stride_gb", "stride_xb",
]  # fmt: skip


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


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
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
    return tl.dot(query_means, tl.trans(key_means), input_precision=MEANS_PRECISION) * scaling


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def selection_scores_kernel(
    means_ptr, counts_ptr, cut_levels_ptr, scores_ptr, plane, scaling,
    H, NB, D, FIRST_N, DIAGONAL_N,
    PRIORS: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, TILE), B * H). Alg. 1's ranking of every block pair (x, y) as one fp32 value,
    larger = ranked first (``scores`` (B * H, NB * NB)): its score log mu - row maximum, -inf for a
    pair with a block without real tokens. With priors, a pair's level is the number of prior sets
    holding it (0 when not eligible); pairs above the sequence's cut level (``cut_levels`` (B,): the
    level at which its budget runs out) get +inf, those below -inf, so that one fp32 top-k and the
    lowest pair index among ties at the threshold give the order (level, score, pair index)."""
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
        if PRIORS:
            level = (xs[:, None] < FIRST_N).to(tl.int32) + (ys[None, :] < FIRST_N).to(tl.int32)
            if DIAGONAL_N > 0:
                level += (tl.abs(xs[:, None] - ys[None, :]) <= DIAGONAL_N // 2).to(tl.int32)
            level = tl.where(eligible, level, 0)
            cut = tl.load(cut_levels_ptr + b)
            score = tl.where(level > cut, float("inf"), tl.where(level == cut, score, float("-inf")))
        pair = xs[:, None].to(tl.int64) * NB + ys[None, :]
        tl.store(scores_ptr + bh * NB * NB + pair, score, mask=xs_ok[:, None] & ys_ok[None, :])


@triton.jit
def _budget_and_threshold(budgets_ptr, top_ptr, b, bh, K):
    """Sequence b's budget (``budgets`` (B,): :func:`.selection.budgets`) and the threshold: the
    budget-th largest value of head bh (``top`` (B * H, K), descending)."""
    budget = tl.load(budgets_ptr + b).to(tl.int32)  # at most nb², an int32
    return budget, tl.load(top_ptr + bh * K + tl.maximum(budget - 1, 0))


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def threshold_tally_kernel(
    scores_ptr, top_ptr, budgets_ptr, tally_ptr, tally_plane,
    H, NB, K,
    ROWS: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, ROWS), B * H). Per query block x, its pairs ranked above the threshold and those
    tied with it (``tally`` (2, B * H, NB) int32)."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    _, threshold = _budget_and_threshold(budgets_ptr, top_ptr, b, bh, K)
    xs = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    xs_ok = xs < NB
    above = tl.zeros([ROWS], tl.int32)
    tied = tl.zeros([ROWS], tl.int32)
    for y0 in range(0, NB, 32):
        ys = y0 + tl.arange(0, 32)
        ok = xs_ok[:, None] & (ys < NB)[None, :]
        value = tl.load(scores_ptr + bh * NB * NB + xs[:, None].to(tl.int64) * NB + ys[None, :], mask=ok, other=0.0)
        above += tl.sum((ok & (value > threshold)).to(tl.int32), 1)
        tied += tl.sum((ok & (value == threshold)).to(tl.int32), 1)
    tl.store(tally_ptr + bh * NB + xs, above, mask=xs_ok)
    tl.store(tally_ptr + tally_plane + bh * NB + xs, tied, mask=xs_ok)


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def selected_pairs_kernel(
    scores_ptr, top_ptr, budgets_ptr, tally_ptr, bitmaps_ptr, pairs_ptr, offsets_ptr, tally_plane, bitmap_plane,
    H, NB, NW, K,
    BITMAPS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (NW, B * H): query blocks x0 = 32 x program .. x0 + 31. The budget's pairs: those above
    the threshold, then of those tied with it the lowest (x, y) in row-major order, as many as the
    budget leaves (Alg. 1's tie rule: appended padding cannot change the choice). Writes each query
    block's selected key blocks, ascending, as the pair indices x * NB + y of the head's list
    (``pairs`` (B * H, K) int32, row x at [``offsets``[x], ``offsets``[x + 1]), ``offsets``
    (B * H, NB + 1) int32) and, with BITMAPS, the row-major bitmap (bit y of word y // 32 of row x)
    and the column-major one (bit x of row y) (``bitmaps`` (2, B * H, NB, NW) int32), every word
    written once, no atomics."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    budget, threshold = _budget_and_threshold(budgets_ptr, top_ptr, b, bh, K)
    x0 = tl.program_id(0) * 32
    # The pairs above the threshold, and the ties and selected pairs of the query blocks before x0.
    above_total = 0
    for c0 in range(0, NB, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        above_total += tl.sum(tl.load(tally_ptr + bh * NB + c, mask=c < NB, other=0), 0)
    tied_left = budget - above_total  # ties the budget keeps
    tied_before = 0
    selected_before = 0
    for c0 in range(0, x0, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        c_ok = c < x0
        above = tl.load(tally_ptr + bh * NB + c, mask=c_ok, other=0)
        tied = tl.load(tally_ptr + tally_plane + bh * NB + c, mask=c_ok, other=0)
        tied_rank = tied_before + tl.cumsum(tied, 0) - tied  # ties of the earlier rows
        selected_before += tl.sum(above + tl.minimum(tl.maximum(tied_left - tied_rank, 0), tied), 0)
        tied_before += tl.sum(tied, 0)
    xs = x0 + tl.arange(0, 32)
    xs_ok = xs < NB
    above = tl.load(tally_ptr + bh * NB + xs, mask=xs_ok, other=0)
    tied = tl.load(tally_ptr + tally_plane + bh * NB + xs, mask=xs_ok, other=0)
    tied_rank = tied_before + tl.cumsum(tied, 0) - tied  # (32,) ties before each own row
    selected = above + tl.minimum(tl.maximum(tied_left - tied_rank, 0), tied)
    ends = selected_before + tl.cumsum(selected, 0)
    tl.store(offsets_ptr + bh * (NB + 1) + xs + 1, ends, mask=xs_ok)
    if x0 == 0:
        tl.store(offsets_ptr + bh * (NB + 1), 0)
    position = ends - selected  # (32,) the next list position of each own row
    for w in range(0, NW):
        ys = w * 32 + tl.arange(0, 32)
        ok = xs_ok[:, None] & (ys < NB)[None, :]
        pair = xs[:, None] * NB + ys[None, :]
        value = tl.load(scores_ptr + bh * NB * NB + pair.to(tl.int64), mask=ok, other=0.0)
        is_tied = (ok & (value == threshold)).to(tl.int32)
        kept = ok & ((value > threshold) | ((is_tied != 0) & (tied_rank[:, None] + tl.cumsum(is_tied, 1) <= tied_left)))
        tied_rank += tl.sum(is_tied, 1)
        kept_count = kept.to(tl.int32)
        target = position[:, None] + tl.cumsum(kept_count, 1) - 1
        tl.store(pairs_ptr + bh * K + target, pair, mask=kept)
        position += tl.sum(kept_count, 1)
        if BITMAPS:  # distinct bits: their sum is their union
            row_words = tl.sum(kept_count << (ys % 32)[None, :], 1)
            tl.store(bitmaps_ptr + (bh * NB + xs) * NW + w, row_words, mask=xs_ok)
            column_words = tl.sum(kept_count << (xs % 32)[:, None], 0)
            tl.store(bitmaps_ptr + bitmap_plane + (bh * NB + ys) * NW + tl.program_id(0), column_words, mask=ys < NB)


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


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
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
        acc = acc * rescale[:, None] + tl.dot(probs, value_means, input_precision=MEANS_PRECISION)
        row_max = new_max
    nonempty = total > 0
    lse = tl.where(nonempty, row_max + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, total, 1.0)[:, None], 0.0)
    tl.store(low_lse_ptr + bh * NB + xs, lse, mask=xs_ok)
    tl.store(low_out_ptr + (bh * NB + xs[:, None]) * D + d[None, :], out, mask=xs_ok[:, None] & d_ok[None, :])


@triton.jit
def _merged(row_max, total, acc, score, weight, value):
    """The online softmax's state (running maximum, sum, weighted values of BS rows) with another part
    merged in: scores ``score`` (its maximum), ``weight`` = sum of exp(score_j - score), ``value`` =
    sum of exp(score_j - score) v_j; -inf (an empty part or state) contributes nothing (eq. 14)."""
    new_max = tl.maximum(row_max, score)
    reference = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp(row_max - reference)
    other = tl.exp(score - reference)
    return new_max, total * rescale + weight * other, acc * rescale[:, None] + other[:, None] * value


@triton.jit
def _list_piece(item, bh, offsets_ptr, starts_ptr, owners_ptr, slots_ptr, NB, ITEMS, PIECE):
    """Work item ``item`` of head bh: the block that owns it (NB past the head's last item), the span
    [first, last) of that block's list it walks (at most PIECE entries), the block's number of pieces,
    and the item's workspace slot where that is more than one (``starts``, ``owners``, ``slots``:
    :func:`.triton._list_pieces`)."""
    own = tl.load(owners_ptr + bh * ITEMS + item)
    span = bh * (NB + 1) + tl.minimum(own, NB - 1)
    start = tl.load(starts_ptr + span)
    piece = item - start
    first = tl.load(offsets_ptr + span) + piece * PIECE
    last = tl.minimum(first + PIECE, tl.load(offsets_ptr + span + 1))
    return own, first, last, tl.load(starts_ptr + span + 1) - start, tl.load(slots_ptr + span) + piece


@triton.jit
def _store_rows(
    row_max, total, acc, x, bh, b, h, rows, rows_ok, d, d_ok, low_out_ptr, low_lse_ptr, out_ptr, lse_ptr,
    stride_ob, stride_oh, stride_on, stride_od, NB, D, BS: tl.constexpr, LOW_RESOLUTION: tl.constexpr,
):  # fmt: skip
    """Query block x's output and log-sum-exps from its exact part's softmax state: the low-resolution
    part merged as one extra key (value ``low_out[x]``, score ``low_lse[x]``; eq. 14); rows with no
    key at all give 0 and -inf."""
    if LOW_RESOLUTION:
        extra_score = tl.load(low_lse_ptr + bh * NB + x)
        extra_value = tl.load(low_out_ptr + (bh * NB + x) * D + d, mask=d_ok, other=0.0)
        row_max, total, acc = _merged(row_max, total, acc, extra_score, 1.0, extra_value[None, :])
    nonempty = total > 0
    safe_total = tl.where(nonempty, total, 1.0)
    lse = tl.where(nonempty, row_max + tl.log(safe_total), float("-inf"))
    out = tl.where(nonempty[:, None], acc / safe_total[:, None], 0.0)
    tl.store(lse_ptr + bh * NB * BS + rows, lse)
    target = out_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + d[None, :] * stride_od
    tl.store(target, out.to(out_ptr.dtype.element_ty), mask=rows_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def exact_forward_kernel(
    q_ptr, k_ptr, v_ptr, real_ptr, pairs_ptr, offsets_ptr, starts_ptr, owners_ptr, slots_ptr,
    low_out_ptr, low_lse_ptr, out_ptr, lse_ptr, parts_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    scaling, H, N, NB, K, D, ITEMS, SLOTS, PIECE,
    HAS_MASK: tl.constexpr, LOW_RESOLUTION: tl.constexpr, PRECISION: tl.constexpr,
    BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (ITEMS, B * H): a piece of at most PIECE entries of query block x's list of selected key
    blocks (ascending) a program. Alg. 2 at resolution 1 for the BS queries of block x: an online
    softmax over the keys of the piece's blocks. A block of one piece then merges the low-resolution
    part and writes ``out`` (B, H, N, D) in q's dtype and ``lse`` (B * H, NB * BS) fp32
    (:func:`_store_rows`); a longer list writes each piece's state to its slot of ``parts``
    ((B * H, SLOTS, BS, D + 2) fp32: weighted values, running maximum and sum), which
    :func:`merge_pieces_kernel` merges, so that a block selected by many rows costs no single
    program more than PIECE blocks."""
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    item = tl.program_id(0)
    x, first, last, pieces, slot = _list_piece(item, bh, offsets_ptr, starts_ptr, owners_ptr, slots_ptr, NB, ITEMS, PIECE)
    if x < NB:
        rows = x * BS + tl.arange(0, BS)
        rows_ok = rows < N
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        q = _block_rows(q_ptr, b * stride_qb + h * stride_qh, rows, rows_ok, stride_qn, stride_qd, d, d_ok)
        row_max = tl.full([BS], float("-inf"), tl.float32)
        total = tl.zeros([BS], tl.float32)
        acc = tl.zeros([BS, BLOCK_D], tl.float32)
        for i in range(first, last):
            cols = (tl.load(pairs_ptr + bh * K + i) - x * NB) * BS + tl.arange(0, BS)
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
        if pieces == 1:
            _store_rows(
                row_max, total, acc, x, bh, b, h, rows, rows_ok, d, d_ok, low_out_ptr, low_lse_ptr, out_ptr, lse_ptr,
                stride_ob, stride_oh, stride_on, stride_od, NB, D, BS, LOW_RESOLUTION,
            )  # fmt: skip
        else:
            part = parts_ptr + ((bh * SLOTS + slot) * BS + tl.arange(0, BS)) * (D + 2)
            tl.store(part[:, None] + d[None, :], acc, mask=d_ok[None, :])
            tl.store(part + D, row_max)
            tl.store(part + D + 1, total)


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def merge_pieces_kernel(
    starts_ptr, slots_ptr, parts_ptr, low_out_ptr, low_lse_ptr, out_ptr, lse_ptr,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, NB, D, SLOTS,
    LOW_RESOLUTION: tl.constexpr, BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H). For a query block whose list :func:`exact_forward_kernel` walked in several
    pieces: their softmax states merged in order (FlashDecoding's split, by log-sum-exp; no atomics),
    then the low-resolution part, and its output and log-sum-exps written (:func:`_store_rows`)."""
    x = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    span = bh * (NB + 1) + x
    pieces = tl.load(starts_ptr + span + 1) - tl.load(starts_ptr + span)
    if pieces > 1:
        rows = x * BS + tl.arange(0, BS)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        row_max = tl.full([BS], float("-inf"), tl.float32)
        total = tl.zeros([BS], tl.float32)
        acc = tl.zeros([BS, BLOCK_D], tl.float32)
        first_slot = tl.load(slots_ptr + span)
        for slot in range(first_slot, first_slot + pieces):
            part = parts_ptr + ((bh * SLOTS + slot) * BS + tl.arange(0, BS)) * (D + 2)
            value = tl.load(part[:, None] + d[None, :], mask=d_ok[None, :], other=0.0)
            row_max, total, acc = _merged(row_max, total, acc, tl.load(part + D), tl.load(part + D + 1), value)
        _store_rows(
            row_max, total, acc, x, bh, b, h, rows, rows < N, d, d_ok, low_out_ptr, low_lse_ptr, out_ptr, lse_ptr,
            stride_ob, stride_oh, stride_on, stride_od, NB, D, BS, LOW_RESOLUTION,
        )  # fmt: skip


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
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


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def low_resolution_backward_kernel(
    means_ptr, counts_ptr, bitmaps_ptr, low_grad_ptr, low_weight_ptr, low_ref_ptr, grad_means_ptr,
    plane, bitmap_plane, scaling,
    H, NB, NW, D,
    AXIS: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (cdiv(NB, TILE), B * H), launched once per AXIS: gradients of the block means through the low-resolution
    part (``grad_means`` (3, B * H, NB, D) fp32). With w_xy = exp(log(c_y mu_xy) - m_x) over the kept
    pairs, dl_xy = w_xy (G_x . v~_y - E_x) is the gradient of the score log(c_y mu_xy) (the
    softmax's, merged with the exact part); AXIS 0 sums over y per query-block tile
    (d q~_x = scaling sum_y dl_xy k~_y), AXIS 1 over x per key-block tile
    (d k~_y = scaling sum_x dl_xy q~_x, d v~_y = sum_x w_xy G_x). A compile-time axis: each branch
    its own kernel, with the registers of that branch only."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    own = tl.program_id(0) * TILE + tl.arange(0, TILE)
    own_ok = own < NB
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    if AXIS == 0:  # own = query blocks x
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
            dot_value = tl.dot(low_grad, tl.trans(value_means), input_precision=MEANS_PRECISION)
            grad_scores = weights * (dot_value - low_weight[:, None])
            grad_query += tl.dot(grad_scores, key_means, input_precision=MEANS_PRECISION)
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
            scores = tl.dot(key_means, tl.trans(query_means), input_precision=MEANS_PRECISION) * scaling + log_counts[:, None]
            words = tl.load(
                bitmaps_ptr + bitmap_plane + (bh * NB + own[:, None]) * NW + xs[None, :] // 32,
                mask=own_ok[:, None] & xs_ok[None, :],
                other=0,
            )
            kept = (counts > 0)[:, None] & (((words >> (xs[None, :] % 32)) & 1) == 0) & xs_ok[None, :]
            weights = tl.where(kept, tl.exp(scores - reference[None, :]), 0.0)
            dot_value = tl.dot(value_means, tl.trans(low_grad), input_precision=MEANS_PRECISION)
            grad_scores = weights * (dot_value - low_weight[None, :])
            grad_key += tl.dot(grad_scores, query_means, input_precision=MEANS_PRECISION)
            grad_value += tl.dot(weights, low_grad, input_precision=MEANS_PRECISION)
        target = grad_means_ptr + (bh * NB + own[:, None]) * D + d[None, :]
        tile_ok = own_ok[:, None] & d_ok[None, :]
        tl.store(target + plane, grad_key * scaling, mask=tile_ok)
        tl.store(target + 2 * plane, grad_value, mask=tile_ok)


@triton.jit
def _own_block(own, b, N, NB, real_ptr, counts_ptr, BS: tl.constexpr, HAS_MASK: tl.constexpr):
    """Block ``own``'s rows, which of them are in the sequence and which are real tokens, and its
    number of real tokens (at least 1)."""
    own_rows = own * BS + tl.arange(0, BS)
    own_ok = own_rows < N
    own_real = own_ok
    if HAS_MASK:
        own_real = own_real & (tl.load(real_ptr + b * N + own_rows, mask=own_ok, other=0) != 0)
    return own_rows, own_ok, own_real, tl.maximum(tl.load(counts_ptr + b * NB + own), 1).to(tl.float32)


@triton.jit
def _store_gradient(grad, scale, mean_grad_ptr, own_real, count, target, tile_ok, d, d_ok, LOW_RESOLUTION: tl.constexpr):
    """grad x scale plus, with the low-resolution part, each real token's share of its block mean's
    gradient (``mean_grad`` its row of D; eqs. 11, 17), stored at ``target`` in its dtype."""
    grad = grad * scale
    if LOW_RESOLUTION:
        grad += tl.where(own_real[:, None], tl.load(mean_grad_ptr + d, mask=d_ok, other=0.0)[None, :] / count, 0.0)
    tl.store(target, grad.to(target.dtype.element_ty), mask=tile_ok)


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def exact_backward_kernel(
    q_ptr, k_ptr, v_ptr, real_ptr, grad_ptr, lse_ptr, delta_ptr, pairs_ptr, offsets_ptr, starts_ptr, owners_ptr,
    slots_ptr, counts_ptr, grad_means_ptr, dq_ptr, dk_ptr, dv_ptr, parts_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_xb, stride_xh, stride_xn, stride_xd,
    plane, part_plane, scaling, H, N, NB, K, D, ITEMS, SLOTS, PIECE,
    AXIS: tl.constexpr, HAS_MASK: tl.constexpr, LOW_RESOLUTION: tl.constexpr, PRECISION: tl.constexpr,
    BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (ITEMS, B * H), launched once per AXIS (a compile-time axis: each branch its own kernel); a
    piece of at most PIECE entries of block ``own``'s list a program. The exact blocks' backward,
    recomputing P = exp(S - lse): dS = P (dO V^T - delta). AXIS 0: query block x's dQ = scaling dS K
    over its selected key blocks (the row-major pair list, entries x * NB + y); AXIS 1: key block y's
    dK = scaling dS^T Q and dV = P^T dO over the query blocks that selected it (the column-major list,
    entries y * NB + x); ``pairs`` (B * H, K) int32, block ``own``'s at [``offsets``[own],
    ``offsets``[own + 1]). A block of one piece writes its gradients, with the low-resolution part
    plus each real token's share of its block mean's gradient (eqs. 11, 17); a longer list writes each
    piece's sums to its slot of ``parts`` ((1 or 2), B * H, SLOTS, BS, D) fp32, which
    :func:`merge_gradient_pieces_kernel` adds up. Each gradient written once, no atomics; ``dq``,
    ``dk``, ``dv`` share one layout (strides ``stride_x*``)."""
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    item = tl.program_id(0)
    own, first, last, pieces, slot = _list_piece(item, bh, offsets_ptr, starts_ptr, owners_ptr, slots_ptr, NB, ITEMS, PIECE)
    if own < NB:
        own_rows, own_ok, own_real, count = _own_block(own, b, N, NB, real_ptr, counts_ptr, BS, HAS_MASK)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        q_base, k_base, v_base = b * stride_qb + h * stride_qh, b * stride_kb + h * stride_kh, b * stride_vb + h * stride_vh
        g_base = b * stride_gb + h * stride_gh
        target = b * stride_xb + h * stride_xh + own_rows[:, None] * stride_xn + d[None, :] * stride_xd
        tile_ok = own_ok[:, None] & d_ok[None, :]
        mean_grad = grad_means_ptr + (bh * NB + own) * D
        part = parts_ptr + ((bh * SLOTS + slot) * BS + tl.arange(0, BS))[:, None] * D + d[None, :]
        if AXIS == 0:  # own = query block x
            q = _block_rows(q_ptr, q_base, own_rows, own_ok, stride_qn, stride_qd, d, d_ok)
            grad = _block_rows(grad_ptr, g_base, own_rows, own_ok, stride_gn, stride_gd, d, d_ok)
            lse = tl.load(lse_ptr + bh * NB * BS + own_rows)
            lse = tl.where(lse == float("-inf"), float("inf"), lse)  # a row without keys: P = 0
            delta = tl.load(delta_ptr + bh * NB * BS + own_rows)
            grad_q = tl.zeros([BS, BLOCK_D], tl.float32)
            for i in range(first, last):
                cols = (tl.load(pairs_ptr + bh * K + i) - own * NB) * BS + tl.arange(0, BS)
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
            if pieces == 1:
                _store_gradient(grad_q, scaling, mean_grad, own_real, count, dq_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION)
            else:
                tl.store(part, grad_q, mask=d_ok[None, :])
        else:  # own = key block y; scores and probabilities transposed: (keys, queries)
            k = _block_rows(k_ptr, k_base, own_rows, own_ok, stride_kn, stride_kd, d, d_ok)
            v = _block_rows(v_ptr, v_base, own_rows, own_ok, stride_vn, stride_vd, d, d_ok)
            grad_k = tl.zeros([BS, BLOCK_D], tl.float32)
            grad_v = tl.zeros([BS, BLOCK_D], tl.float32)
            for i in range(first, last):
                rows = (tl.load(pairs_ptr + bh * K + i) - own * NB) * BS + tl.arange(0, BS)
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
            if pieces == 1:
                _store_gradient(
                    grad_k, scaling, mean_grad + plane, own_real, count, dk_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION
                )
                _store_gradient(
                    grad_v, 1.0, mean_grad + 2 * plane, own_real, count, dv_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION
                )
            else:
                tl.store(part, grad_k, mask=d_ok[None, :])
                tl.store(part + part_plane, grad_v, mask=d_ok[None, :])


@triton.jit(do_not_specialize=LENGTH_ARGUMENTS)
def merge_gradient_pieces_kernel(
    real_ptr, counts_ptr, starts_ptr, slots_ptr, parts_ptr, grad_means_ptr, dq_ptr, dk_ptr, dv_ptr,
    stride_xb, stride_xh, stride_xn, stride_xd,
    plane, part_plane, scaling, H, N, NB, D, SLOTS,
    AXIS: tl.constexpr, HAS_MASK: tl.constexpr, LOW_RESOLUTION: tl.constexpr, BS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid (NB, B * H), once per AXIS. For a block whose list :func:`exact_backward_kernel` walked in
    several pieces: their sums added in order (deterministic, no atomics), then its gradients written
    as a block of one piece writes them (AXIS 0: dQ; AXIS 1: dK, dV)."""
    own = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    span = bh * (NB + 1) + own
    pieces = tl.load(starts_ptr + span + 1) - tl.load(starts_ptr + span)
    if pieces > 1:
        own_rows, own_ok, own_real, count = _own_block(own, b, N, NB, real_ptr, counts_ptr, BS, HAS_MASK)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < D
        first_slot = tl.load(slots_ptr + span)
        grad_a = tl.zeros([BS, BLOCK_D], tl.float32)  # dQ, or dK
        grad_b = tl.zeros([BS, BLOCK_D], tl.float32)  # dV
        for slot in range(first_slot, first_slot + pieces):
            part = parts_ptr + ((bh * SLOTS + slot) * BS + tl.arange(0, BS))[:, None] * D + d[None, :]
            grad_a += tl.load(part, mask=d_ok[None, :], other=0.0)
            if AXIS == 1:
                grad_b += tl.load(part + part_plane, mask=d_ok[None, :], other=0.0)
        target = b * stride_xb + h * stride_xh + own_rows[:, None] * stride_xn + d[None, :] * stride_xd
        tile_ok = own_ok[:, None] & d_ok[None, :]
        mean_grad = grad_means_ptr + (bh * NB + own) * D
        if AXIS == 0:
            _store_gradient(grad_a, scaling, mean_grad, own_real, count, dq_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION)
        else:
            _store_gradient(
                grad_a, scaling, mean_grad + plane, own_real, count, dk_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION
            )
            _store_gradient(
                grad_b, 1.0, mean_grad + 2 * plane, own_real, count, dv_ptr + target, tile_ok, d, d_ok, LOW_RESOLUTION
            )
