"""Export a saved variant (or a plain checkpoint) to ONNX for serving, and check it with ONNX Runtime
(``scripts/export_onnx.py``): ONNX Runtime must equal PyTorch on a padded batch at --export_length
and at other lengths (--check_lengths), and on --validation_file's texts; a failed check is an error
and leaves no folder behind. Prints each check.

Reads: --model_dir: a folder with config.json, the weights and the tokenizer (a training run's
--output_dir, convert_to_long.py's, ...); --validation_file: .txt (one text per line), or .jsonl /
.csv with a text or sentence column.
Writes: into --output_dir (new or empty): model.onnx (dynamic batch and sequence dimensions), the
tokenizer, config.json, a sentence-transformers model's pooling files (modules.json, its module
folders), onnx_validation.json (the checks), and with --int8 model_quantized.onnx;
scripts/encode_onnx.py runs the folder.

examples:
  python scripts/export_onnx.py --model_dir outputs/mlm --output_dir outputs/mlm-onnx
  python scripts/export_onnx.py --model_dir outputs/mlm --output_dir outputs/mlm-onnx --task feature-extraction --int8
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..tasks.common.args import check_positive_flags, parse_arguments
from .encoding import read_texts
from .onnx import check_task, describe, export_folder


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
        metadata={
            "help": "Other lengths ONNX Runtime is checked at. Default: one, 1.5x --export_length + 1 (half of it + 1 "
            "when that exceeds the position table)."
        },
    )
    opset: int | None = field(default=None, metadata={"help": "ONNX opset. Default: torch.onnx's."})
    task: str | None = field(
        default=None,
        metadata={
            "help": "feature-extraction: export the encoder alone (last_hidden_state), e.g. of a masked-LM "
            "folder, to embed texts. Default: the model with the head its config.json records (architectures)."
        },
    )
    int8: bool = field(
        default=False,
        metadata={
            "help": "Also write model_quantized.onnx (int8 weights, activations quantized at run time: ONNX "
            "Runtime's dynamic quantization) and report how far it is from PyTorch."
        },
    )
    validation_file: str | None = field(
        default=None,
        metadata={
            "help": "Texts to check the export on (.txt one per line, or .jsonl / .csv with a text or sentence "
            "column): each text's embedding (an encoder, pooled as the model records) or logits (a "
            "classifier) against PyTorch's."
        },
    )
    validation_length: int | None = field(
        default=None, metadata={"help": "Tokens kept per --validation_file text. Default: the model's position table."}
    )

    def __post_init__(self) -> None:
        check_positive_flags(self, "validation_length")
        check_task(self.task)
        if self.validation_length is not None and self.validation_file is None:
            raise ValueError("--validation_length applies to --validation_file texts: give --validation_file too")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of ``scripts/export_onnx.py``."""
    (args,) = parse_arguments((ExportArguments,), argv, __doc__)
    texts = read_texts(args.validation_file) if args.validation_file else None
    # torch.onnx logs a warning per torchvision operator it cannot register: not this model's concern
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    checks = export_folder(args.model_dir, args.output_dir, args.export_length, args.check_lengths, args.opset,
                           int8=args.int8, texts=texts, text_length=args.validation_length, task=args.task)  # fmt: skip
    print(describe(checks, Path(args.output_dir)))
