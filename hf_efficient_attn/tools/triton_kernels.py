"""Compile MRA-2's Triton kernels (``methods/mra/triton_kernels.py``) for an NVIDIA GPU on a machine
without one, and report each kernel's resources (registers, spills, shared memory) and its work: the
floating-point operations it must do and the fewest bytes it must move (each input read once, each
output written once), the "two numbers" a measured time is compared with (docs/gpu.md). It checks
what Triton's interpreter (how the tests run the kernels on CPU) does not: rules of compiled Triton
(constexpr globals, layouts), and what ptxas makes of the kernels, the first thing to tune.

    python -m hf_efficient_attn.tools.triton_kernels --arch 90 --dtype bf16 --length 8192

Each kernel is compiled with the arguments the backend passes it in one forward and backward call
of ``mra2`` (batch 1, ``block_per_row`` 4) at ``--length`` tokens, learned by running the backend's
launch code on meta tensors, by Triton's compiler and the ptxas it ships.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from ..methods.mra import triton as triton_backend

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Triton's names of the element types the kernels' pointers point to.
POINTER_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
}


#: Blocks per query block of the reported call (MRA-2's default budget).
BLOCK_PER_ROW = 4


def kernel_work(length: int, heads: int, head_dim: int, block_size: int, dtype_bytes: int) -> dict[str, tuple[float, float]]:
    """(FLOPs, fewest bytes) of each kernel for one ``mra2`` call on batch 1, with every query block
    attending to BLOCK_PER_ROW key blocks. Matrix products count 2 FLOPs a multiply-add; the exact
    blocks' products run on the input dtype, the block means' (logits, low resolution) in fp32."""
    n, d, b, nb = length, head_dim, block_size, -(-length // block_size)
    pairs = min(BLOCK_PER_ROW * nb, nb * nb)
    tokens, means = heads * n * d * dtype_bytes, heads * nb * d * 4  # one (n, d) tensor of the input; of block means
    rows = heads * nb * b * 4  # one fp32 value per row (lse, delta)
    keys, bitmap = heads * nb * nb * 8, heads * nb * -(-nb // 32) * 4
    work = {
        "block_means_kernel": (3 * heads * n * d, 3 * tokens + 3 * means),
        "selection_keys_kernel": (2 * 2 * heads * nb * nb * d, 2 * means + keys),  # the logits twice
        "selected_bitmaps_kernel": (0, heads * pairs * 8 + 2 * bitmap),
        "low_resolution_kernel": (2 * 2 * heads * nb * nb * d, 3 * means + bitmap + means),
        "exact_forward_kernel": (2 * 2 * heads * pairs * b * b * d, 4 * tokens + means + rows),
        "backward_preprocess_kernel": (2 * heads * n * d, 2 * tokens + 2 * rows + means),
        # rows: logits, G . v~, dq~; columns: logits, v~ . G, dk~, dv~ (2 FLOPs x nb² x d each)
        "low_resolution_backward_kernel": (7 * 2 * heads * nb * nb * d, 5 * means + 2 * bitmap + 3 * means),
        # dQ side: S, dP, dQ; dK/dV side: S, dP, dV, dK
        "exact_backward_kernel": (7 * 2 * heads * pairs * b * b * d, 4 * tokens + 2 * rows + 2 * bitmap + 3 * means + 3 * tokens),
    }
    return {name: (float(flops), float(moved)) for name, (flops, moved) in work.items()}


#: The compile options a launch may set, which the tool compiles with as Triton does at run time.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def recorded_launches(dtype: torch.dtype, length: int, heads: int, head_dim: int, block_size: int) -> list[tuple]:
    """(kernel, positional arguments, keyword arguments) of every launch of one ``mra2`` forward and
    backward (batch 1, the last block padded, priors on), on meta tensors (nothing runs)."""
    from ..methods.mra import triton_kernels as kernels

    launches = []
    patched = [getattr(kernels, name) for name in dir(kernels) if name.endswith("_kernel")]
    for kernel in patched:
        kernel.run = lambda *args, grid, warmup, _kernel=kernel, **kwargs: launches.append((_kernel, args, kwargs))
    try:
        with torch.device("meta"):
            q, k, v = (torch.empty(1, length, heads, head_dim, dtype=dtype).transpose(1, 2) for _ in range(3))
            mask = torch.ones(1, length, dtype=torch.bool)
            options = (head_dim**-0.5, block_size, BLOCK_PER_ROW, 1, 5, True)
            out, lse, means, counts, bitmaps = triton_backend.launch_forward(q, k, v, mask, *options)
            saved = (out, lse, means, counts, bitmaps, *options[:2], True)
            triton_backend.launch_backward(torch.empty_like(out), q, k, v, mask, *saved)
    finally:
        for kernel in patched:
            del kernel.run
    return launches


def signature(kernel, args: tuple, kwargs: dict) -> tuple[dict[str, str], dict[tuple[int], object]]:
    """Triton's signature and constexprs of one recorded launch."""
    bound = {**dict(zip(kernel.arg_names, args)), **kwargs}
    types, constexprs = {}, {}
    for index, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        value = bound[name]
        if param.is_constexpr:
            types[name], constexprs[(index,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            types[name] = "*" + POINTER_TYPES[value.dtype]
        elif isinstance(value, float):
            types[name] = "fp32"
        else:
            types[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
    return types, constexprs


def resources(ptx: str, arch: int) -> str:
    """ptxas' report of one kernel's registers, spills and stack (its ``-v`` lines)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder, "kernel.ptx")
        source.write_text(ptx)
        suffix = "a" if arch >= 90 else ""
        report = subprocess.run(
            [get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", str(source), "-o", str(Path(folder, "kernel.cubin"))],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    used = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return f"registers {used.group(1)}, spill stores {spills.group(1)} B, spill loads {spills.group(2)} B"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100/H200), 80 (A100) (default: 90)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="dtype of q, k, v (default: bf16)")
    parser.add_argument(
        "--length", type=int, default=8192, help="tokens of the call whose arguments are compiled (default: 8192)"
    )
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    parser.add_argument("--head_dim", type=int, default=64, help="head size (default: 64)")
    parser.add_argument("--block_size", type=int, default=32, help="MRA-2's block size (default: 32)")
    args = parser.parse_args(argv)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if triton_backend.kernels_interpreted():
        parser.error("TRITON_INTERPRET=1 is set: unset it, the kernels must be compiled")
    target = GPUTarget("cuda", args.arch, 32)
    dtype = DTYPES[args.dtype]
    work = kernel_work(args.length, args.heads, args.head_dim, args.block_size, dtype.itemsize)
    print(
        f"triton {triton.__version__}, sm_{args.arch}, {args.dtype}, {args.length} tokens, {args.heads} heads of {args.head_dim}"
    )
    for kernel, positional, keywords in recorded_launches(dtype, args.length, args.heads, args.head_dim, args.block_size):
        types, constexprs = signature(kernel, positional, keywords)
        launch_options = {key: keywords[key] for key in LAUNCH_OPTIONS if key in keywords}
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=types, constexprs=constexprs), target=target, options=launch_options
        )
        flops, moved = work[kernel.__name__]
        print(
            f"{kernel.__name__}: {resources(compiled.asm['ptx'], args.arch)}, shared {compiled.metadata.shared} B, "
            f"warps {compiled.metadata.num_warps}; {flops / 1e9:.3f} GFLOP, {moved / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
