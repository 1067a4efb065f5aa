"""MRA-2's ``flex`` backend: the exact part and the low-resolution merge in one
``torch.nn.attention.flex_attention`` call (compiled), with a ``BlockMask`` listing each query block's
selected key blocks and the low-resolution part as one virtual key per query block
(docs/methods/mra.md, "Backends"); :func:`flex_unavailable` says when it cannot run."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

#: The flex path pads the length to a multiple of this, so that few shapes get compiled
#: (compiled shapes are static: one compilation per (batch, heads, padded length,
#: head_dim, dtype, method)). Padded blocks are never selected, so the padding costs next to nothing.
FLEX_LENGTH_MULTIPLE = 1024
#: Dynamo compiles at most this many shapes of flex_attention (its default, 8, would run any
#: further shape through eager flex, which materialises the dense score matrix).
FLEX_RECOMPILE_LIMIT = 64
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def flex_unavailable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> str | None:
    """Why FlexAttention cannot run MRA-2 on these inputs at ``block_size``, or None when it can."""
    if q.dtype not in FLEX_DTYPES:
        return f"supports dtypes {list(FLEX_DTYPES)}, got {q.dtype}"
    head_dim = q.shape[-1]
    if q.device.type == "cuda" and (block_size < 16 or block_size & (block_size - 1) or head_dim < 16):
        return (
            f"on CUDA needs block_size a power of two >= 16 and head_dim >= 16 (Triton's tiles), got block_size "
            f"{block_size}, head_dim {head_dim}; use backend='gather'"
        )
    if needs_grad(q, k, v) and q.device.type != "cuda":
        return (
            f"has no backward on {q.device.type} (compiled FlexAttention is inference-only there); use "
            "backend='gather' or 'auto', or run under torch.no_grad()"
        )
    return None


_compiled_flex: dict[bool, Callable] = {}


def _flex(autotune: bool) -> Callable:
    """flex_attention compiled for static shapes; with ``autotune``, under Inductor's max-autotune, the
    only setting whose backward tile list holds tiles narrower than 64 (see :func:`_needs_autotune`)."""
    if autotune not in _compiled_flex:
        _compiled_flex[autotune] = torch.compile(
            flex_attention, dynamic=False, options={"max_autotune": True} if autotune else None
        )
    return _compiled_flex[autotune]


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will record a call on ``tensors`` (then flex needs its backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _needs_autotune(q: torch.Tensor, block_size: int, backward: bool) -> bool:
    """Whether a CUDA backward of flex at ``block_size`` needs max-autotune: Inductor keeps only the
    backward tiles that divide the sparse block size, and its default tile for fp16/bf16 on recent GPUs
    is 64 x 128 (fp32: 16), so blocks of 32 find none by default (torch 2.11-2.13
    ``get_flex_attn_bwd_configs``)."""
    return backward and q.device.type == "cuda" and q.dtype != torch.float32 and block_size < 128


def _block_list(sel: torch.Tensor):
    """(B, H, nq, nk) bool -> BlockMask's (count, indices): int32, selected indices first."""
    order = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True)
    return sel.sum(-1, dtype=torch.int32), order.to(torch.int32)


def flex_mra_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    real: torch.Tensor,
    selected: torch.Tensor,
    block_size: int,
    scaling: float,
    low_out: torch.Tensor | None = None,
    low_lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention over the selected blocks in one FlexAttention call; given the
    low-resolution (out, lse) of every query block, (B, H, nb, D) and (B, H, nb), query block x
    also attends to one virtual key with value ``low_out[x]`` and score ``low_lse[x]``, which is
    exactly the log-sum-exp merge of both parts (docs/methods/mra.md, "Backends")."""
    batch, heads, length, dim = q.shape
    nb = length // block_size
    blocks_real = real.view(batch, nb, block_size)
    full_key_block = blocks_real.all(-1)[:, None, None, :]
    dense, partial = selected & full_key_block, selected & ~full_key_block
    score_mod, key_ok = None, real
    if low_out is not None:
        # Virtual key x sits at position length + x, in virtual block x // block_size.
        n_virtual = -(-nb // block_size) * block_size
        k = torch.cat([k, k.new_zeros(batch, heads, n_virtual, dim)], 2)
        v = torch.cat([v, F.pad(low_out, (0, 0, 0, n_virtual - nb)).to(v.dtype)], 2)
        key_ok = F.pad(real, (0, n_virtual), value=True)
        own_block = torch.arange(nb, device=q.device) // block_size
        virtual = F.one_hot(own_block, n_virtual // block_size).bool() & blocks_real.any(-1)[:, None, :, None]
        dense = torch.cat([dense, virtual.expand(batch, heads, -1, -1)], -1)
        partial = F.pad(partial, (0, n_virtual // block_size), value=False)
        first_virtual = torch.tensor(length, device=q.device)

        def score_mod(score, b, h, q_idx, kv_idx):
            x = q_idx // block_size
            virtual_score = torch.where(kv_idx - first_virtual == x, low_lse[b, h, x], -math.inf)
            return torch.where(kv_idx < first_virtual, score, virtual_score)

    def mask_mod(b, h, q_idx, kv_idx):
        return key_ok[b, kv_idx]

    backward = needs_grad(q, k, v)
    block_mask = BlockMask.from_kv_blocks(  # the backward walks the mask by key block: q blocks too
        *_block_list(partial),
        *_block_list(dense),
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(length, k.shape[2]),
        compute_q_blocks=backward,
    )
    # Triton's default tiles (64-128) must divide the sparse block size; ask for block-sized ones
    # (Triton tiles are powers of two >= 16: flex_unavailable refuses other block sizes on CUDA).
    options = {"BLOCK_M": block_size, "BLOCK_N": block_size} if q.device.type == "cuda" else None
    arguments = dict(score_mod=score_mod, block_mask=block_mask, scale=scaling, kernel_options=options)
    if torch.compiler.is_compiling():  # inside an outer compiled graph (CUDA only): compiled with it
        return flex_attention(q, k, v, **arguments)
    # Private dynamo config (no public setter for the recompile limit): scoped to this call only.
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
        return _flex(_needs_autotune(q, block_size, backward))(q, k, v, **arguments)


#: :func:`flex_mra_attention` run eagerly, with its own compiled kernel, also from a compiled graph
#: (a graph break there).
flex_mra_attention_outside_graphs = torch.compiler.disable(flex_mra_attention)
