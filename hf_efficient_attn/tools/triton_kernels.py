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
import collections
import contextlib
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..methods.mra import triton as triton_backend

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

#: Blocks per query block of the reported call (MRA-2's default budget).
BLOCK_PER_ROW = 4


def kernel_work(length: int, heads: int, head_dim: int, block_size: int, dtype_bytes: int) -> dict[str, tuple[float, float]]:
    """(FLOPs, fewest bytes) of each launch (:func:`launch_name`) of one ``mra2`` call on batch 1, with
    every query block attending to BLOCK_PER_ROW key blocks. Matrix products count 2 FLOPs a
    multiply-add; the exact blocks' products run on the input dtype, the block means' (logits, low
    resolution) in fp32."""
    n, d, b, nb = length, head_dim, block_size, -(-length // block_size)
    pairs = min(BLOCK_PER_ROW * nb, nb * nb)
    tokens, means = heads * n * d * dtype_bytes, heads * nb * d * 4  # one (n, d) tensor of the input; of block means
    rows = heads * nb * b * 4  # one fp32 value per row (lse, delta)
    scores, bitmap, lists = heads * nb * nb * 4, heads * nb * -(-nb // 32) * 4, heads * (pairs + nb + 1) * 4
    logits = 2 * heads * nb * nb * d  # one product of the query means with the key means
    block_pairs = 2 * heads * pairs * b * b * d  # one product over the selected blocks' tokens
    work = {
        "block_means_kernel": (3 * heads * n * d, 3 * tokens + 3 * means),
        "selection_scores_kernel": (2 * logits, 2 * means + scores),  # the logits twice
        "threshold_tally_kernel": (0, scores + heads * nb * 8),
        "selected_pairs_kernel": (0, scores + heads * nb * 8 + 2 * bitmap + lists),
        "low_resolution_kernel": (2 * logits, 3 * means + bitmap + means),
        "exact_forward_kernel": (2 * block_pairs, 4 * tokens + lists + means + rows),
        # with every list within one piece (BLOCK_PER_ROW each), the merges only read each block's pieces
        "merge_pieces_kernel": (0, 2 * heads * nb * 4),
        "merge_gradient_pieces_kernel[AXIS=0]": (0, 2 * heads * nb * 4),
        "merge_gradient_pieces_kernel[AXIS=1]": (0, 2 * heads * nb * 4),
        "backward_preprocess_kernel": (2 * heads * n * d, 2 * tokens + 2 * rows + means),
        # query side: logits, G . v~, dq~; key side: logits, v~ . G, dk~, dv~
        "low_resolution_backward_kernel[AXIS=0]": (3 * logits, 4 * means + bitmap + means),
        "low_resolution_backward_kernel[AXIS=1]": (4 * logits, 4 * means + bitmap + 2 * means),
        # dQ side: S, dP, dQ (reads q, dO, k, v; writes dq); dK/dV side: S, dP, dV, dK (writes dk, dv)
        "exact_backward_kernel[AXIS=0]": (3 * block_pairs, 5 * tokens + 2 * rows + lists + means),
        "exact_backward_kernel[AXIS=1]": (4 * block_pairs, 6 * tokens + 2 * rows + lists + 2 * means),
    }
    return {name: (float(flops), float(moved)) for name, (flops, moved) in work.items()}


def launch_name(kernel, kwargs: dict) -> str:
    """The kernel's name, with its compile-time axis where it is launched once per axis."""
    return kernel.__name__ + (f"[AXIS={kwargs['AXIS']}]" if "AXIS" in kwargs else "")


def call_options(head_dim: int, block_size: int) -> tuple:
    """The reported call's ``launch_forward`` options: scaling, block size, blocks per query block,
    the priors (first rows and columns, diagonal band), the low-resolution part."""
    return head_dim**-0.5, block_size, BLOCK_PER_ROW, 1, 5, True


@contextlib.contextmanager
def intercepted_launches(handle):
    """Within it, every launch of the backend's kernels calls ``handle(kernel, launch, args, kwargs)``,
    ``launch`` being the kernel's own (``launch(*args, **kwargs)`` runs it)."""
    from ..methods.mra import triton_kernels as kernels

    patched = [getattr(kernels, name) for name in dir(kernels) if name.endswith("_kernel")]
    for kernel in patched:
        kernel.run = lambda *args, _kernel=kernel, _launch=kernel.run, **kwargs: handle(_kernel, _launch, args, kwargs)
    try:
        yield
    finally:
        for kernel in patched:
            del kernel.run


def run_call(dtype: torch.dtype, length: int, heads: int, head_dim: int, block_size: int, batch: int = 1) -> tuple:
    """One ``mra2`` forward and backward through the backend's launch code on random inputs of the
    current default device (the last block padded, priors on); returns the forward's outputs."""
    q, k, v = (torch.randn(batch, length, heads, head_dim, dtype=dtype).transpose(1, 2) for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool)
    options = call_options(head_dim, block_size)
    forward = triton_backend.launch_forward(q, k, v, mask, *options)
    triton_backend.launch_backward(torch.randn_like(forward[0]), q, k, v, mask, *forward, *options[:2], True)
    return forward


def recorded_launches(dtype: torch.dtype, length: int, heads: int, head_dim: int, block_size: int) -> list[tuple]:
    """(kernel, positional arguments, keyword arguments) of every launch of one ``mra2`` forward and
    backward (batch 1), on meta tensors (nothing runs)."""
    launches = []

    def record(kernel, launch, args, kwargs):
        launches.append((kernel, args, {key: value for key, value in kwargs.items() if key not in ("grid", "warmup")}))

    with intercepted_launches(record), torch.device("meta"):
        run_call(dtype, length, heads, head_dim, block_size)
    return launches


def launch_times(dtype: torch.dtype, length: int, heads: int, head_dim: int, block_size: int, batch: int, repeats: int) -> dict:
    """Milliseconds of each launch of one ``mra2`` forward and backward, timed alone (CUDA events
    around it; on CPU, Triton's interpreter, a clock), the median of ``repeats`` calls after one
    warm-up; beside them the selection's ``torch.topk`` of fp32 values and the int64 one it replaced,
    and the longest pair list of a query block and of a key block against the mean (the skew)."""
    cuda = torch.get_default_device().type == "cuda"

    def timed(work) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        start = time.perf_counter()
        work()
        return (time.perf_counter() - start) * 1000

    times = collections.defaultdict(list)

    def time_launch(kernel, launch, args, kwargs):
        times[launch_name(kernel, kwargs)].append(timed(lambda: launch(*args, **kwargs)))

    with intercepted_launches(time_launch):
        for _ in range(repeats + 1):
            forward = run_call(dtype, length, heads, head_dim, block_size, batch)
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    blocks = -(-length // block_size)
    values = torch.randn(batch * heads, blocks * blocks)
    most_pairs = min(BLOCK_PER_ROW * blocks, blocks * blocks)
    replaced = values.double().view(torch.int64)  # the int64 keys of the former selection, as many
    for label, tensor in (("torch.topk, fp32 values", values), ("torch.topk, int64 keys (replaced)", replaced)):
        medians[label] = statistics.median(timed(lambda: tensor.topk(most_pairs, dim=-1)) for _ in range(repeats + 1))
    pairs, offsets = forward[5:]
    columns = triton_backend._column_lists(pairs, offsets, blocks)[1]
    for side, spans in (("query block", offsets), ("key block", columns)):
        lengths = spans.diff(dim=-1).float()
        medians[f"longest pair list of a {side} / mean"] = float(lengths.max() / lengths.mean())
    return medians


def compile_source(kernel, args: tuple, kwargs: dict, target) -> tuple:
    """(source, options) of one launch as ``JITFunction.run`` builds them for ``target`` at run time:
    Triton's own binder (an int equal to 1 becomes a constexpr, ints and pointers divisible by 16
    are marked so, except the kernel's ``do_not_specialize`` arguments) and the launch's options
    (warps, stages, fusion). ``_pack_args`` is private: Triton has no public way to get a launch's
    compile inputs without a GPU."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs), options


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
    parser.add_argument(
        "--time",
        action="store_true",
        help="instead of compiling, run the call on random inputs on CUDA (on CPU under TRITON_INTERPRET=1) and "
        "print each launch's time alone, the selection's top-k beside the int64 one it replaced, and the "
        "longest pair list of a block against the mean",
    )
    parser.add_argument("--batch", type=int, default=1, help="batch of the timed call (--time; default: 1)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls after one warm-up, median (--time; default: 10)")
    args = parser.parse_args(argv)
    if args.time:
        if not torch.cuda.is_available() and not triton_backend.kernels_interpreted():
            parser.error("--time runs the kernels: it needs a CUDA device, or TRITON_INTERPRET=1 on CPU")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"{device}, {args.dtype}, {args.length} tokens, batch {args.batch}, {args.heads} heads of {args.head_dim}")
        with torch.device(device):
            measured = launch_times(
                DTYPES[args.dtype], args.length, args.heads, args.head_dim, args.block_size, args.batch, args.repeats
            )
        for name, value in measured.items():
            print(f"{name}: {value:.4f}" + ("" if name.startswith("longest") else " ms"))
        return
    import triton
    from triton.backends.compiler import GPUTarget

    if triton_backend.kernels_interpreted():
        parser.error("TRITON_INTERPRET=1 is set: unset it, the kernels must be compiled")
    target = GPUTarget("cuda", args.arch, 32)
    dtype = DTYPES[args.dtype]
    work = kernel_work(args.length, args.heads, args.head_dim, args.block_size, dtype.itemsize)
    print(
        f"triton {triton.__version__}, sm_{args.arch}, {args.dtype}, {args.length} tokens, {args.heads} heads of {args.head_dim}"
    )
    for kernel, positional, keywords in recorded_launches(dtype, args.length, args.heads, args.head_dim, args.block_size):
        source, options = compile_source(kernel, positional, keywords, target)
        compiled = triton.compile(source, target=target, options=options.__dict__)
        name = launch_name(kernel, keywords)
        flops, moved = work[name]
        print(
            f"{name}: {resources(compiled.asm['ptx'], args.arch)}, shared {compiled.metadata.shared} B, "
            f"warps {compiled.metadata.num_warps}, stages {compiled.metadata.num_stages}, "
            f"fp fusion {'on' if compiled.metadata.enable_fp_fusion else 'off'}; {flops / 1e9:.3f} GFLOP, {moved / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
