"""``scripts/export_onnx.py``: its flags (parsed by ``HfArgumentParser``) and entry point."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..tasks.common.args import parse_arguments
from .onnx import describe, export_folder


@dataclass
class ExportArguments:
    """What to export and where (``python scripts/export_onnx.py --help``)."""

    model_dir: str = field(metadata={"help": "A saved variant (or plain checkpoint) folder: config.json, weights, tokenizer."})
    output_dir: str = field(metadata={"help": "New or empty folder for model.onnx, the tokenizer and config.json."})
    export_length: int = field(
        default=128, metadata={"help": "Tokens per row of the example batch the export traces (any length runs after)."}
    )
    check_lengths: list[int] = field(
        default_factory=list,
        metadata={"help": "Other lengths ONNX Runtime is checked at (default: one, about 1.5x --export_length)."},
    )
    opset: int | None = field(default=None, metadata={"help": "ONNX opset (default: torch.onnx's)."})


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of ``scripts/export_onnx.py``."""
    (args,) = parse_arguments((ExportArguments,), argv)
    # torch.onnx logs a warning per torchvision operator it cannot register: not this model's concern
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    checks = export_folder(args.model_dir, args.output_dir, args.export_length, args.check_lengths, args.opset)
    print(describe(checks, Path(args.output_dir)))
