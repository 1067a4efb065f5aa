"""Speed and peak memory against SDPA, versus sequence length (``scripts/benchmark.py``); every
measurement in a fresh process. What each benchmark measures, how time and peak memory are taken
(warm-up, rounds, the allocator) and the results: docs/benchmarks.md.

Default: one attention call per method, forward and forward+backward, on random q, k, v; --model (an MLM
training step of an encoder, roberta-base-width by default: --arch), --compile (eager against torch.compile), --onnx
(ONNX Runtime against eager) or --mixed_lengths (padded against packed batches) benchmark a whole
model instead.
Reads: nothing but the flags (random inputs; --mixed_lengths: the lengths of gensim's Wikipedia
articles under all-MiniLM-L6-v2's tokenizer).
Writes: into --output_dir, the benchmark's table (a .md and a .csv) and raw measurements (a .json),
named after it: attention.* and model_step.* (each with a .png plot), compile.*, onnx.*,
mixed_lengths.*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ...integration.architectures import TESTED_ARCHITECTURES
from ...registry import list_methods
from ...tasks.common.args import (
    check_flag_choice,
    check_positive_flags,
    parse_arguments,
    parse_method_configs,
    parse_method_names,
)
from .processes import measure_all, measure_timings
from .report import (
    attention_table,
    compile_table,
    markdown,
    mixed_lengths_table,
    model_step_table,
    onnx_table,
    write_outputs,
    write_table,
)
from .steps import (
    ATTENTION_REFERENCE,
    DTYPES,
    MIXED_DOCUMENTS,
    MODEL_FLOOR,
    MODEL_REFERENCE,
    document_lengths,
    encoder_name,
)

DEFAULT_MODEL_METHODS = ["mra2", "mra2_s"]


def _setting(args: BenchmarkArguments) -> str:
    if args.device == "cuda":
        where = f"cuda ({torch.cuda.get_device_name()}, SDPA with its flash kernel where it applies)"
    else:
        where = f"cpu, {args.threads or torch.get_num_threads()} CPU threads"
    options = "".join(f"; {name} {json.dumps(config)}" for name, config in args.method_configs.items())
    return f"{where}, {args.dtype}, torch {torch.__version__}{options}"


BUSY_TITLE = "; busy: beside one process spinning on a core"


def _malloc(args: BenchmarkArguments) -> str:
    """How the CPU timing processes of the attention and model benchmarks set glibc's malloc."""
    if args.device != "cpu":
        return ""
    return ", glibc's default malloc" if args.glibc_malloc else ", malloc keeping freed memory"


def run(args: BenchmarkArguments) -> list[dict[str, Any]]:
    """Run the benchmark that ``args`` asks for; write and return its table."""
    common = dict(
        batch=args.batch, device=args.device, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup, threads=args.threads
    )
    if args.glibc_malloc:  # the attention and model steps (KEEPS_FREED_MEMORY); refused for the others
        common["glibc_malloc"] = True
    out = Path(args.output_dir)
    beside_busy = [False, True] if args.competing_process else [False]  # attention and --onnx only

    def job(method: str, **values: Any) -> dict[str, Any]:
        return dict(method=method, options=args.method_configs.get(method, {}), **values, **common)

    if args.compile or args.onnx or args.mixed_lengths:
        kind = "compile" if args.compile else "onnx" if args.onnx else "mixed_lengths"
        extra = ({"train": args.train} if args.compile
                 else {"lengths": document_lengths(MIXED_DOCUMENTS, max(args.seq_lens))} if args.mixed_lengths
                 else {"int8": args.int8})  # fmt: skip
        seq_lens = [max(args.seq_lens)] if args.mixed_lengths else args.seq_lens
        jobs = [
            job(m, kind=kind, seq_len=n, layers=args.layers, vocab_size=args.vocab_size, arch=args.arch, busy=busy, **extra)
            for n in seq_lens
            for m in args.measured
            for busy in beside_busy
        ]
        results, skipped = measure_timings(jobs, args.rounds)
        if args.onnx:  # a failed job keeps its row, with the reason (SDPA's scores past the memory)
            rows = onnx_table(jobs, results, skipped)
            title = (
                f"ONNX Runtime (CPU provider, {torch.get_num_threads() if args.threads is None else args.threads} "
                f"threads) against eager PyTorch: inference forward of {encoder_name(args.arch)}, "
                f"{args.layers} layer(s), batch {args.batch}"
                + (", fp32 and int8 (dynamic quantization, as export_onnx.py --int8)" if args.int8 else "")
                + f"; {_setting(args)}"
                + (BUSY_TITLE if args.competing_process else "")
            )
        measured = [(j, r) for i, (j, r) in enumerate(zip(jobs, results)) if i not in skipped]  # failed: skipped
        jobs, results = [j for j, _ in measured], [r for _, r in measured]
        if args.mixed_lengths:
            rows = mixed_lengths_table(jobs, results)
            title = (
                f"Padded against packed batches: {len(extra['lengths'])} documents of real lengths (offline "
                f"Wikipedia articles, at most {seq_lens[0]} tokens), {args.batch} per batch, through "
                f"{encoder_name(args.arch)}, {args.layers} layer(s); inference forwards and training steps "
                f"(MLM forward + backward + AdamW); {_setting(args)}"
            )
        elif args.compile:
            rows = compile_table(jobs, results)
            call = "training step (MLM forward + backward + AdamW)" if args.train else "inference forward"
            title = (
                f"torch.compile against eager: {call} of {encoder_name(args.arch)}, {args.layers} layer(s), "
                f"batch {args.batch} (the last row a quarter padding); {_setting(args)}; Inductor caches off"
            )
        write_table(rows, out, kind, title)
        (out / f"{kind}.json").write_text(json.dumps({"title": title, "rows": rows, "rounds": results}, indent=1))
    elif args.model:
        jobs = [
            job(m, kind="model", seq_len=n, layers=args.layers, vocab_size=args.vocab_size, arch=args.arch)
            for n in args.seq_lens
            for m in args.measured
        ]
        measurements = measure_all(jobs, args.rounds)
        rows = model_step_table(measurements, args.batch)
        title = (
            f"Training step (MLM forward + backward + AdamW) of {encoder_name(args.arch)}, {args.layers} "
            f"layer(s), vocabulary {args.vocab_size}, batch {args.batch}; {_setting(args)}{_malloc(args)}"
        )
        write_outputs(rows, measurements, out, "model_step", title)
    else:
        modes = [False] if args.forward_only else [False, True]
        jobs = [
            job(m, kind="attention", seq_len=n, backward=b, busy=busy, heads=args.heads, head_dim=args.head_dim)
            for m in args.measured
            for n in args.seq_lens
            for b in modes
            for busy in beside_busy
        ]
        measurements = measure_all(jobs, args.rounds)
        rows = attention_table(measurements)
        title = (
            f"Attention call, batch {args.batch}, {args.heads} heads, head_dim {args.head_dim}; {_setting(args)}{_malloc(args)}"
        )
        if args.competing_process:
            title += BUSY_TITLE
        write_outputs(rows, measurements, out, "attention", title)
    print(markdown(rows))
    return rows


EXAMPLES = """
examples:
  python scripts/benchmark.py --methods mra2,nystromformer --seq_lens 1024 4096
  python scripts/benchmark.py --methods mra2 --seq_lens 3360 --forward_only --threads 2 --competing_process
  python scripts/benchmark.py --model                    # mra2, mra2_s vs sdpa and vmean
  python scripts/benchmark.py --model --arch modernbert --methods mra2 --seq_lens 4096 8192
  python scripts/benchmark.py --model --device cuda --dtype bf16 --methods mra2 --attn_config '{"mra2": {"backend": "flex"}}'
  python scripts/benchmark.py --compile --methods mra2,nystromformer --seq_lens 1024
  python scripts/benchmark.py --onnx --methods mra2 --int8
  python scripts/benchmark.py --onnx --methods mra2 --seq_lens 4096 --threads 2 --competing_process
  python scripts/benchmark.py --mixed_lengths --methods mra2   # padded vs packed, softmax beside
"""


@dataclass
class BenchmarkArguments:
    """The flags of ``scripts/benchmark.py``; defaults that depend on the benchmark are filled in, and
    every value checked, on construction."""

    model: bool = field(default=False, metadata={"help": "Benchmark a whole-model training step instead of attention."})
    compile: bool = field(
        default=False,
        metadata={"help": "Benchmark torch.compile against eager for a whole model (SDPA beside)."},
    )
    train: bool = field(default=False, metadata={"help": "--compile only: time a training step instead of a forward."})
    onnx: bool = field(
        default=False,
        metadata={"help": "Benchmark ONNX Runtime against eager PyTorch for a whole model (SDPA beside)."},
    )
    int8: bool = field(
        default=False,
        metadata={
            "help": "--onnx only: also time the int8 model (ONNX Runtime's dynamic quantization, as "
            "export_onnx.py --int8 writes it)."
        },
    )
    mixed_lengths: bool = field(
        default=False,
        metadata={
            "help": "Benchmark padded against packed batches of documents of real lengths, inference and "
            "training, for a whole model (softmax beside)."
        },
    )
    methods: str | None = field(
        default=None,
        metadata={
            "help": f"Methods to compare with SDPA, comma-separated. Default: every method "
            f"({','.join(list_methods())}); with --model, --compile, --onnx or --mixed_lengths: "
            f"{','.join(DEFAULT_MODEL_METHODS)}."
        },
    )
    attn_config: str | None = field(
        default=None,
        metadata={
            "help": "Options per method, a JSON object keyed by method name, e.g. "
            '\'{"mra2": {"block_per_row": 8}}\'; a method left out runs at its defaults.'
        },
    )
    seq_lens: list[int] | None = field(
        default=None,
        metadata={
            "help": "Sequence lengths, space-separated. Default: 512 1024 2048 4096; with --model: 1024 2048 "
            "4096 8192 16384; with --compile: 1024; with --onnx: 1024 4096 8192 16384; with --mixed_lengths: 4096 "
            "(the longest document)."
        },
    )
    batch: int | None = field(
        default=None,
        metadata={"help": "Default: 1; with --compile: 2 (the last row a quarter padding); with --mixed_lengths: 4 documents."},
    )
    heads: int = field(default=12, metadata={"help": "Attention benchmark only: heads."})
    head_dim: int = field(default=64, metadata={"help": "Attention benchmark only: head dimension."})
    layers: int = field(default=2, metadata={"help": "Whole-model benchmarks: encoder layers."})
    arch: str = field(
        default="roberta",
        metadata={
            "help": "Whole-model benchmarks: the encoder's model type, at the width of roberta-base, ModernBERT-base "
            "(modernbert: every third layer global, the others windowed) or ESM-2-150M (esm, rotary); other "
            "tested architectures at roberta-base's.",
            "choices": list(TESTED_ARCHITECTURES),
        },
    )
    vocab_size: int = field(
        default=1024,
        metadata={
            "help": "Whole-model benchmarks: MLM vocabulary (small, so that the step measures the encoder; "
            "roberta-base's 50265 adds the same cost to every method)."
        },
    )
    device: str = field(default="cuda" if torch.cuda.is_available() else "cpu", metadata={"help": "cpu or cuda."})
    dtype: str = field(
        default="fp32",
        metadata={
            "help": f"One of {', '.join(DTYPES)}. Attention: the dtype of q, k, v; whole model: the autocast dtype (fp32 = none)."
        },
    )
    repeats: int | None = field(
        default=None,
        metadata={
            "help": "Timed calls per process after the warm-up, their median kept. Default: 3; with --model or "
            "--mixed_lengths: 1 (a pass over every document)."
        },
    )
    warmup: int | None = field(
        default=None,
        metadata={
            "help": "Untimed calls per process before the timed ones. Default: 1; with --model: 2 (the first "
            "step allocates the optimizer state, the second still grows the heap); with --mixed_lengths: "
            "0."
        },
    )
    rounds: int | None = field(
        default=None,
        metadata={
            "help": "Times every measurement is taken, each time in a new process, the jobs in turn; the "
            "median is reported, ratios are medians of per-round ratios. Default: 1; with --model: 3."
        },
    )
    threads: int | None = field(
        default=None, metadata={"help": "CPU threads of each measuring process. Default: torch's default."}
    )
    forward_only: bool = field(default=False, metadata={"help": "Attention benchmark only: no backward."})
    competing_process: bool = field(
        default=False,
        metadata={
            "help": "The attention benchmark and --onnx, on CPU: time every call a second time, in a process "
            "started beside one busy process (an interpreter spinning on a core, as on a shared machine), and "
            "report the slowdown."
        },
    )
    glibc_malloc: bool = field(
        default=False,
        metadata={
            "help": "--model and the attention benchmark on CPU: time with glibc's default malloc, which returns "
            "freed memory to the system, instead of keeping it for reuse as the training scripts do."
        },
    )
    output_dir: str = field(default="outputs/benchmark", metadata={"help": "Folder for the tables and plots."})

    def __post_init__(self) -> None:
        whole_model = self.model or self.compile or self.onnx or self.mixed_lengths
        if self.model + self.compile + self.onnx + self.mixed_lengths > 1:
            raise ValueError("--model, --compile, --onnx and --mixed_lengths are four benchmarks: give one of them")
        if self.train and not self.compile:
            raise ValueError("--train applies to --compile (--model always times a training step)")
        if self.int8 and not self.onnx:
            raise ValueError("--int8 applies to --onnx only")
        if whole_model and self.forward_only:
            raise ValueError("--forward_only applies to the attention benchmark only")
        if self.arch != "roberta" and not whole_model:
            raise ValueError("--arch applies to the whole-model benchmarks (--model, --compile, --onnx, --mixed_lengths)")
        if self.competing_process and (self.model or self.compile or self.mixed_lengths or self.device != "cpu"):
            raise ValueError("--competing_process applies to the attention benchmark and --onnx on CPU only")
        check_flag_choice("device", self.device, ["cpu", "cuda"])
        check_flag_choice("dtype", self.dtype, list(DTYPES))
        if self.glibc_malloc and (self.compile or self.onnx or self.mixed_lengths or self.device != "cpu"):
            raise ValueError("--glibc_malloc applies to --model and the attention benchmark on CPU only")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available; use --device cpu")
        if self.onnx and (self.device, self.dtype) != ("cpu", "fp32"):
            raise ValueError("--onnx times ONNX Runtime's CPU provider in fp32: leave --device and --dtype at cpu / fp32")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")
        check_positive_flags(self, "batch", "heads", "head_dim", "layers", "vocab_size", "repeats", "rounds", "threads")
        if self.seq_lens is not None and any(n < 1 for n in self.seq_lens):
            raise ValueError(f"--seq_lens must be positive integers, got {self.seq_lens}")
        self._fill_defaults()
        allowed = list_methods() + ([MODEL_REFERENCE] if whole_model and not self.mixed_lengths else [])
        self.method_names = parse_method_names(self.methods, allowed, DEFAULT_MODEL_METHODS if whole_model else list_methods())
        references = (
            [MODEL_REFERENCE]
            if self.compile
            else [MODEL_REFERENCE, MODEL_FLOOR]
            if self.model or self.onnx
            else [ATTENTION_REFERENCE]
        )  # --mixed_lengths too: softmax keeps packed sequences apart, SDPA would not
        #: What is measured: the references first, then the methods asked for.
        self.measured = references + [m for m in self.method_names if m not in references]
        self.method_configs = parse_method_configs(self.attn_config, [m for m in self.measured if m != MODEL_REFERENCE])

    def _fill_defaults(self) -> None:
        if self.batch is None:  # --compile: a padded batch, as served or trained; --mixed_lengths: a few documents
            self.batch = 2 if self.compile else 4 if self.mixed_lengths else 1
        if self.repeats is None:  # --mixed_lengths: one pass over every document, each batch a step
            self.repeats = 1 if self.model or self.mixed_lengths else 3
        if self.rounds is None:
            self.rounds = 3 if self.model else 1
        if self.warmup is None:
            self.warmup = 2 if self.model else 0 if self.mixed_lengths else 1
        if self.seq_lens is None:
            self.seq_lens = (
                [1024]
                if self.compile
                else [1024, 4096, 8192, 16384]
                if self.onnx
                else [4096]
                if self.mixed_lengths
                else [1024, 2048, 4096, 8192, 16384]
                if self.model
                else [512, 1024, 2048, 4096]
            )


def parse_args(argv: Sequence[str] | None = None) -> BenchmarkArguments:
    """The command line as :class:`BenchmarkArguments`; bad values raise ``ValueError`` naming what is
    allowed, before anything is measured."""
    (args,) = parse_arguments([BenchmarkArguments], argv, description=__doc__ + EXAMPLES)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line of ``scripts/benchmark.py``."""
    return run(parse_args(argv))
