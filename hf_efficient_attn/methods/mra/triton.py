"""MRA-2's ``triton`` backend: the whole attention call of ``mra2`` / ``mra2_s`` (block means,
selection, low-resolution and exact parts) and its backward in a few fused Triton kernels
(:mod:`.triton_kernels`), behind two custom operators, so that ``torch.compile`` traces a model
in one graph and runs them as opaque calls. The same function as the ``gather`` and ``pairs``
backends (docs/methods/mra.md), computed without host reads or data-dependent shapes:

- forward, 7 launches and a top-k: the block means and counts of q, k, v (eqs. 11, 17); the score of
  every block pair as one fp32 value that orders pairs by (prior sets, score) (Alg. 1; with priors,
  pairs above the level where the sequence's budget runs out are +inf, those below -inf); one
  ``torch.topk`` of the largest budget, of the values only: each head's threshold; per query block
  the pairs above it and tied with it; the budget's pairs (the ties to the lowest pair index), as
  each query block's ascending list of key blocks and (``mra2``) row- and column-major bitmaps; the
  low-resolution part per query block (eq. 13, ``mra2`` only); the exact blocks of each query block,
  walking its list, with an online softmax that merges the low-resolution part as one extra key
  (Alg. 2, eq. 14), lists longer than :data:`LIST_PIECE` in pieces merged by a last kernel. Saved for
  the backward: the output, each row's log-sum-exp, the block means and counts, the bitmaps (nb²
  bits a head) and the pair lists, nothing of size n x blocks.
- backward, 7 launches and a sort: dO . O per row and the low-resolution part's per-block sums; the
  block means' gradients through the low-resolution part (``mra2``), query side and key side; the
  exact blocks' dQ per query block and dK, dV per key block (its list of query blocks: the pair
  lists sorted by key block), FlashAttention-2's split, each written once, no atomics, which also
  hand each real token its block mean's gradient; long lists in pieces added up by a last kernel.
  Each backward kernel is compiled once per side (a compile-time axis), so that neither side pays
  the other's registers.

Supported: CUDA (elsewhere only under Triton's interpreter, ``TRITON_INTERPRET=1``, how the tests run
it on CPU), fp32 / fp16 / bf16, ``block_size`` in :data:`BLOCK_SIZES`, head size up to
:data:`MAX_HEAD_DIM`, at most :data:`MAX_BLOCKS` blocks; :func:`triton_unavailable` says why not.
Precision: the products of block means as ``tf32x3`` (:data:`.triton_kernels.MEANS_PRECISION`); fp32
inputs enter the exact blocks' products in IEEE fp32 (not TF32); fp16/bf16 inputs enter them in their
dtype, with probabilities and score gradients rounded to it (FlashAttention's scheme); everything
else fp32. Tolerances against an fp64
reference: docs/methods/mra.md, "Backends".
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
from typing import TYPE_CHECKING

import torch

from .selection import budgets, cut_levels, max_budget

if TYPE_CHECKING:
    from .options import MraOptions

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Block sizes the kernels take: Triton's matrix tiles are powers of two of at least 16.
BLOCK_SIZES = (16, 32, 64, 128)
MAX_HEAD_DIM = 256
#: Blocks per sequence: the pair lists hold x * nb + y, and nb² marks an unused entry, in int32.
MAX_BLOCKS = 2**15
#: batch x heads runs on the second axis of the launch grid (CUDA's limit).
MAX_BATCH_HEADS = 65535
#: Block means handled together by the selection and low-resolution kernels (a matrix tile), and their
#: warps and pipeline stages: their tf32x3 products take 170-255 registers a thread, without spills at
#: 8 warps and 1 stage, where 2-3 stages spill or reach 255 in the backward (ptxas, Triton 3.9, sm_90,
#: ``python -m hf_efficient_attn.tools.triton_kernels``; docs/gpu.md). Not yet timed on a GPU.
MEANS_TILE = 32
MEANS_TILE_WARPS = 8
MEANS_TILE_STAGES = 1
#: Most entries of a block's pair list one program of the exact kernels walks: a longer list (a key
#: block that many query blocks selected, a query block with a flat row of scores) is cut into pieces
#: of this many, merged by log-sum-exp forward and added up backward, so that no program walks more
#: than this many blocks. A list holds block_per_row entries on average.
LIST_PIECE = 32
#: Per-block tallies summed per step by the selection's pair kernel.
SUM_BLOCK = 1024
#: Query blocks a program of the selection's tally and pair kernels handles: one int32 word of the
#: column-major bitmap, so that each word has one writer.
SELECTION_ROWS = 32

OP_NAMESPACE = re.sub(r"\W", "_", __name__)


def kernels_interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` when they were
    imported: Triton reads it when the kernels are defined, on this backend's first use)."""
    from triton.runtime.interpreter import InterpretedFunction

    from .triton_kernels import exact_forward_kernel

    return isinstance(exact_forward_kernel, InterpretedFunction)


@functools.cache
def _triton_installed() -> bool:
    """Whether Triton can be imported (looked up once: ``auto`` asks on every CUDA call)."""
    return importlib.util.find_spec("triton") is not None


def triton_unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: "MraOptions") -> str | None:
    """Why the ``triton`` backend cannot run MRA-2 on these inputs, or None when it can."""
    if not _triton_installed():
        return "needs the triton package (pip install triton; CUDA builds of torch install it)"
    if q.dtype not in DTYPES:
        return f"supports dtypes {list(DTYPES)}, got {q.dtype}"
    if options.block_size not in BLOCK_SIZES:
        return f"needs block_size in {list(BLOCK_SIZES)} (Triton's matrix tiles), got {options.block_size}"
    batch, heads, length, head_dim = q.shape
    if head_dim > MAX_HEAD_DIM:
        return f"supports head sizes up to {MAX_HEAD_DIM}, got {head_dim}"
    if batch * heads > MAX_BATCH_HEADS:
        return f"supports batch x heads up to {MAX_BATCH_HEADS}, got {batch * heads}"
    blocks = _blocks(length, options.block_size)[0]
    if blocks > MAX_BLOCKS:
        return f"supports up to {MAX_BLOCKS} blocks ({MAX_BLOCKS * options.block_size} tokens), got {length} tokens"
    if {k.dtype, v.dtype} != {q.dtype}:
        return f"needs q, k and v of one dtype, got {q.dtype}, {k.dtype} and {v.dtype}"
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        # The kernels size v's tiles and the output by q's head size: another v would be read past its rows.
        return f"needs k's and v's head size equal to q's ({head_dim}), got {k.shape[-1]} and {v.shape[-1]}"
    # The kernels' in-sequence offsets (row x the tensors' token stride; the output is laid out (B, N, H, D)) and
    # those of the block means (3 planes of B x H x nb x D) are int32.
    row_span = length * max(heads * head_dim, *(t.stride(2) for t in (q, k, v)))
    means_span = 3 * batch * heads * blocks * head_dim
    if max(row_span, means_span) >= 2**31:
        return (
            "supports inputs whose offsets fit int32 (tokens x heads x head size, and 3 x batch x heads x blocks x "
            f"head size, below 2**31), got {row_span} and {means_span}"
        )
    if q.device.type != "cuda" and not kernels_interpreted():
        return f"runs on CUDA (on {q.device.type} only under Triton's interpreter, TRITON_INTERPRET=1, as the tests do)"
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _head_tile(head_dim: int) -> int:
    """The power-of-two tile (at least 16, Triton's smallest matrix tile) holding a head."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _block_warps(block_size: int, block_d: int, dtype: torch.dtype) -> int:
    """Warps of the exact blocks' kernels: 4 up to a 64 x 64 tile of a block in half precision, 8 beyond
    and in fp32 (ptxas, Triton 3.9, sm_90: blocks of 128 with heads of 128 spill 8.6 kB a thread in the
    bf16 backward with 4, 2.3 kB with 8; with blocks of 32, fp32's FMA products spill 0.5-0.8 kB in the
    backward's key side and a little in the forward at 4, none at 8). Not yet timed on a GPU."""
    return 4 if block_size * block_d <= 64 * 64 and dtype != torch.float32 else 8


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: IEEE for fp32 (not TF32's 10-bit mantissa); half types are exact."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _blocks(length: int, block_size: int) -> tuple[int, int]:
    """(nb, words): blocks of a sequence and int32 words of a bitmap row of nb bits."""
    blocks = (length + block_size - 1) // block_size
    return blocks, (blocks + 31) // 32


def _output_like(q: torch.Tensor) -> torch.Tensor:
    """An empty (B, H, N, D) tensor laid out as (B, N, H, D): what the bridge returns to the model."""
    batch, heads, length, head_dim = q.shape
    return q.new_empty(batch, length, heads, head_dim).transpose(1, 2)


def _mask_arguments(q: torch.Tensor, key_real: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """The key-padding mask as int8 for the kernels (any tensor when None) and whether there is one."""
    if key_real is None:
        return q, False
    return key_real.contiguous().view(torch.int8), True


def _on_gpu_of(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Triton launches a kernel on the current CUDA device: with layers spread over GPUs, each call's
    kernels must run on its tensors' device (a no-op off CUDA: the interpreter, meta tensors)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def launch_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_real: torch.Tensor | None,
    scaling: float,
    block_size: int,
    block_per_row: int,
    first_n: int,
    diagonal_n: int,
    low_resolution: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MRA-2 (``low_resolution``) or MRA-2-s of q, k, v (B, H, N, D) (module docstring): the forward's
    launches. Returns the output (B, H, N, D) in q's dtype, laid out as (B, N, H, D), and what the
    backward needs: each row's log-sum-exp (B * H, nb * block_size), the block means (3, B * H, nb, D),
    the counts of real tokens (B, nb), the selection bitmaps (2, B * H, nb, words; nb = 0 without the
    low-resolution part), and the row-major pair lists (B * H, K) with each query block's span in them
    (B * H, nb + 1) (:func:`.triton_kernels.selected_pairs_kernel`). The custom
    operator :data:`mra_forward` runs it; ``tools/triton_kernels.py`` calls it on meta tensors to
    learn each launch's arguments."""
    from .triton_kernels import (
        block_means_kernel,
        exact_forward_kernel,
        low_resolution_kernel,
        merge_pieces_kernel,
        selected_pairs_kernel,
        selection_scores_kernel,
        threshold_tally_kernel,
    )

    with _on_gpu_of(q):  # q's GPU, not the current one: Triton launches on the current device
        batch, heads, length, head_dim = q.shape
        batch_heads = batch * heads
        blocks, words = _blocks(length, block_size)
        most_pairs = max_budget(blocks, block_per_row)
        real, has_mask = _mask_arguments(q, key_real)
        block_d = _head_tile(head_dim)
        plane = batch_heads * blocks * head_dim
        means = q.new_empty(3, batch_heads, blocks, head_dim, dtype=torch.float32)
        counts = q.new_empty(batch, blocks, dtype=torch.int32)
        block_means_kernel[(blocks, batch_heads)](
            q, k, v, real, means, counts, *q.stride(), *k.stride(), *v.stride(),
            heads, length, blocks, head_dim, plane, HAS_MASK=has_mask, BS=block_size, BLOCK_D=block_d,
        )  # fmt: skip
        priors = first_n > 0 or diagonal_n > 0
        sequence_cut_levels = cut_levels(counts, block_per_row, first_n, diagonal_n) if priors else counts
        scores = q.new_empty(batch_heads, blocks * blocks, dtype=torch.float32)
        selection_scores_kernel[(_cdiv(blocks, MEANS_TILE), batch_heads)](
            means, counts, sequence_cut_levels, scores, plane, scaling, heads, blocks, head_dim, first_n, diagonal_n,
            PRIORS=priors, TILE=MEANS_TILE, BLOCK_D=block_d, num_warps=MEANS_TILE_WARPS, num_stages=MEANS_TILE_STAGES,
            # No fused multiply-add of `logit - row_max` (Triton fuses by default on GPUs): a row's best pair
            # must score exactly 0, as in `pairs` and `gather`, for the tie rule to pick the same pairs.
            enable_fp_fusion=False,
        )  # fmt: skip
        # The values only: which of the pairs tied at the threshold are kept is the kernels' tie rule.
        top = scores.topk(most_pairs, dim=-1).values
        sequence_budgets = budgets(counts, block_per_row)  # (B,), once for every program of both kernels
        tally = q.new_empty(2, batch_heads, blocks, dtype=torch.int32)
        threshold_tally_kernel[(_cdiv(blocks, SELECTION_ROWS), batch_heads)](
            scores, top, sequence_budgets, tally, tally[0].numel(), heads, blocks, most_pairs, ROWS=SELECTION_ROWS,
        )  # fmt: skip
        pairs = q.new_empty(batch_heads, most_pairs, dtype=torch.int32)
        offsets = q.new_empty(batch_heads, blocks + 1, dtype=torch.int32)
        bitmaps = q.new_empty(2, batch_heads, blocks if low_resolution else 0, words, dtype=torch.int32)
        selected_pairs_kernel[(words, batch_heads)](
            scores, top, sequence_budgets, tally, bitmaps, pairs, offsets, tally[0].numel(), bitmaps[0].numel(),
            heads, blocks, words, most_pairs, BITMAPS=low_resolution, BLOCK=SUM_BLOCK,
        )  # fmt: skip
        del scores, top, tally
        low_out = low_lse = means  # unused by the kernel without the low-resolution part
        if low_resolution:
            low_out = q.new_empty(batch_heads, blocks, head_dim, dtype=torch.float32)
            low_lse = q.new_empty(batch_heads, blocks, dtype=torch.float32)
            low_resolution_kernel[(_cdiv(blocks, MEANS_TILE), batch_heads)](
                means, counts, bitmaps, low_out, low_lse, plane, scaling, heads, blocks, words, head_dim,
                TILE=MEANS_TILE, BLOCK_D=block_d, num_warps=MEANS_TILE_WARPS, num_stages=MEANS_TILE_STAGES,
            )  # fmt: skip
        out = _output_like(q)
        lse = q.new_empty(batch_heads, blocks * block_size, dtype=torch.float32)
        starts, owners, slots, items, slot_count = _list_pieces(offsets, most_pairs)
        parts = q.new_empty(batch_heads, slot_count, block_size, head_dim + 2, dtype=torch.float32)
        exact_forward_kernel[(items, batch_heads)](
            q, k, v, real, pairs, offsets, starts, owners, slots, low_out, low_lse, out, lse, parts,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), scaling, heads, length, blocks, most_pairs, head_dim,
            items, slot_count, LIST_PIECE, HAS_MASK=has_mask, LOW_RESOLUTION=low_resolution,
            PRECISION=_precision(q.dtype), BS=block_size, BLOCK_D=block_d, num_warps=_block_warps(block_size, block_d, q.dtype),
        )  # fmt: skip
        merge_pieces_kernel[(blocks, batch_heads)](
            starts, slots, parts, low_out, low_lse, out, lse, *out.stride(), heads, length, blocks, head_dim, slot_count,
            LOW_RESOLUTION=low_resolution, BS=block_size, BLOCK_D=block_d,
        )  # fmt: skip
        return out, lse, means, counts, bitmaps, pairs, offsets


mra_forward = torch.library.custom_op(f"{OP_NAMESPACE}::mra_forward", launch_forward, mutates_args=())


@mra_forward.register_fake
def _(q, k, v, key_real, scaling, block_size, block_per_row, first_n, diagonal_n, low_resolution):
    batch, heads, length, head_dim = q.shape
    blocks, words = _blocks(length, block_size)
    return (
        _output_like(q),
        q.new_empty(batch * heads, blocks * block_size, dtype=torch.float32),
        q.new_empty(3, batch * heads, blocks, head_dim, dtype=torch.float32),
        q.new_empty(batch, blocks, dtype=torch.int32),
        q.new_empty(2, batch * heads, blocks if low_resolution else 0, words, dtype=torch.int32),
        q.new_empty(batch * heads, max_budget(blocks, block_per_row), dtype=torch.int32),
        q.new_empty(batch * heads, blocks + 1, dtype=torch.int32),
    )


def _column_lists(pairs: torch.Tensor, offsets: torch.Tensor, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The column-major pair lists of :func:`launch_forward`'s row-major ones: per key block y, the
    query blocks that selected it, ascending, as entries y * nb + x, and each key block's span."""
    listed = torch.arange(pairs.shape[1], device=pairs.device, dtype=torch.int32) < offsets[:, -1:]
    transposed = torch.where(listed, pairs % blocks * blocks + pairs // blocks, blocks * blocks)  # unlisted: last
    transposed = transposed.sort(dim=-1).values
    starts = torch.arange(blocks + 1, device=pairs.device, dtype=torch.int32) * blocks
    return transposed, torch.searchsorted(transposed, starts.expand(pairs.shape[0], -1).contiguous(), out_int32=True)


def _list_pieces(offsets: torch.Tensor, most_pairs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """The exact kernels' work items for pair lists whose spans are ``offsets`` (B * H, nb + 1): each
    block's list in pieces of at most LIST_PIECE entries (one at least). Returns each block's first
    item (B * H, nb + 1), each item's block (B * H, items; nb past the head's last item), each block's
    first workspace slot, counting only blocks of several pieces (B * H, nb + 1), and the static
    numbers of items and slots: a piece per block and per LIST_PIECE entries bound the items; a block
    of several pieces has fewer than 2 x its entries / LIST_PIECE."""
    batch_heads, blocks = offsets.shape[0], offsets.shape[1] - 1
    pieces = (offsets.diff(dim=-1) + LIST_PIECE - 1).div(LIST_PIECE, rounding_mode="floor").clamp(min=1)
    starts = torch.nn.functional.pad(pieces.cumsum(-1, dtype=torch.int32), (1, 0))
    items = blocks + _cdiv(most_pairs, LIST_PIECE)
    numbers = torch.arange(items, device=offsets.device, dtype=torch.int32).expand(batch_heads, -1).contiguous()
    owners = torch.searchsorted(starts, numbers, right=True, out_int32=True) - 1
    slots = torch.nn.functional.pad(torch.where(pieces > 1, pieces, 0).cumsum(-1, dtype=torch.int32), (1, 0))
    return starts, owners, slots, items, max(1, _cdiv(2 * most_pairs, LIST_PIECE))


def launch_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_real: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    means: torch.Tensor,
    counts: torch.Tensor,
    bitmaps: torch.Tensor,
    pairs: torch.Tensor,
    offsets: torch.Tensor,
    scaling: float,
    block_size: int,
    low_resolution: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of :func:`launch_forward`'s output (module docstring), laid out as its
    output: the backward's launches, run by the custom operator :data:`mra_backward`."""
    from .triton_kernels import (
        backward_preprocess_kernel,
        exact_backward_kernel,
        low_resolution_backward_kernel,
        merge_gradient_pieces_kernel,
    )

    with _on_gpu_of(q):
        grad_out = grad_out.to(q.dtype)
        batch, heads, length, head_dim = q.shape
        batch_heads = batch * heads
        blocks, words = _blocks(length, block_size)
        real, has_mask = _mask_arguments(q, key_real)
        block_d = _head_tile(head_dim)
        plane, bitmap_plane = means[0].numel(), bitmaps[0].numel()
        delta = q.new_empty(batch_heads, blocks * block_size, dtype=torch.float32)
        low_grad = low_weight = low_ref = grad_means = means  # unused without the low-resolution part
        if low_resolution:
            low_grad = torch.empty_like(means[0])
            low_weight, low_ref = (q.new_empty(batch_heads, blocks, dtype=torch.float32) for _ in range(2))
        backward_preprocess_kernel[(blocks, batch_heads)](
            out, grad_out, lse, delta, low_grad, low_weight, low_ref, *out.stride(), *grad_out.stride(),
            heads, length, blocks, head_dim, LOW_RESOLUTION=low_resolution, BS=block_size, BLOCK_D=block_d,
        )  # fmt: skip
        if low_resolution:
            grad_means = torch.empty_like(means)
            for axis in (0, 1):
                low_resolution_backward_kernel[(_cdiv(blocks, MEANS_TILE), batch_heads)](
                    means, counts, bitmaps, low_grad, low_weight, low_ref, grad_means, plane, bitmap_plane, scaling,
                    heads, blocks, words, head_dim, AXIS=axis, TILE=MEANS_TILE, BLOCK_D=block_d,
                    num_warps=MEANS_TILE_WARPS, num_stages=MEANS_TILE_STAGES,
                )  # fmt: skip
        dq, dk, dv = _output_like(q), _output_like(q), _output_like(q)
        most_pairs = pairs.shape[1]
        for axis, (own_pairs, own_offsets) in enumerate([(pairs, offsets), _column_lists(pairs, offsets, blocks)]):
            starts, owners, slots, items, slot_count = _list_pieces(own_offsets, most_pairs)
            parts = q.new_empty(1 + axis, batch_heads, slot_count, block_size, head_dim, dtype=torch.float32)
            exact_backward_kernel[(items, batch_heads)](
                q, k, v, real, grad_out, lse, delta, own_pairs, own_offsets, starts, owners, slots, counts, grad_means,
                dq, dk, dv, parts, *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dq.stride(),
                plane, parts[0].numel(), scaling, heads, length, blocks, most_pairs, head_dim, items, slot_count, LIST_PIECE,
                AXIS=axis, HAS_MASK=has_mask, LOW_RESOLUTION=low_resolution, PRECISION=_precision(q.dtype),
                BS=block_size, BLOCK_D=block_d, num_warps=_block_warps(block_size, block_d, q.dtype),
            )  # fmt: skip
            merge_gradient_pieces_kernel[(blocks, batch_heads)](
                real, counts, starts, slots, parts, grad_means, dq, dk, dv, *dq.stride(), plane, parts[0].numel(),
                scaling, heads, length, blocks, head_dim, slot_count, AXIS=axis, HAS_MASK=has_mask,
                LOW_RESOLUTION=low_resolution, BS=block_size, BLOCK_D=block_d,
            )  # fmt: skip
        return dq, dk, dv


mra_backward = torch.library.custom_op(f"{OP_NAMESPACE}::mra_backward", launch_backward, mutates_args=())


@mra_backward.register_fake
def _(grad_out, q, k, v, key_real, out, lse, means, counts, bitmaps, pairs, offsets, scaling, block_size, low_resolution):
    return _output_like(q), _output_like(q), _output_like(q)


def _setup_context(ctx, inputs, output):
    q, k, v, key_real, scaling, block_size, _, _, _, low_resolution = inputs
    ctx.save_for_backward(q, k, v, key_real, *output)
    ctx.scaling, ctx.block_size, ctx.low_resolution = scaling, block_size, low_resolution


def _backward(ctx, grad_out, *_):
    # Only the output reaches the caller (triton_mra_attention): the other outputs get no gradient.
    grads = mra_backward(grad_out, *ctx.saved_tensors, ctx.scaling, ctx.block_size, ctx.low_resolution)
    return *grads, None, None, None, None, None, None, None


torch.library.register_autograd(mra_forward, _backward, setup_context=_setup_context)


def triton_mra_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scaling: float,
    options: "MraOptions",
    low_resolution: bool,
) -> torch.Tensor:
    """MRA-2 (``low_resolution``) or MRA-2-s of q, k, v (B, H, N, D), padded positions zero,
    ``key_padding_mask`` (B, N) True for real tokens or None: (B, H, N, D) in q's dtype."""
    return mra_forward(
        q,
        k,
        v,
        key_padding_mask,
        scaling,
        options.block_size,
        options.block_per_row,
        options.initial_prior_first_n_blocks,
        options.initial_prior_diagonal_n_blocks,
        low_resolution,
    )[0]
