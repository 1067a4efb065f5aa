"""Encode texts with an ONNX export in ONNX Runtime (``scripts/encode_onnx.py``): the embeddings of an
encoder, pooled as the model records (sentence-transformers' modules.json, else mean pooling), or the
logits of a classifier, one row per text in the order given. The flags are checked before ONNX
Runtime, the tokenizer or the texts are loaded.

Reads: --export_dir, a folder written by scripts/export_onnx.py; the texts: --texts, or
--texts_file: .txt (one text per line), or .jsonl / .csv with a text or sentence column.
Writes: --output_file: .npy (a float32 array, a row per text) or .jsonl (a line per text: index
and embedding, or index, logits and label).

examples:
  python scripts/encode_onnx.py --export_dir outputs/minilm-onnx --texts_file texts.txt --output_file rows.npy
  python scripts/encode_onnx.py --export_dir outputs/minilm-onnx --texts "a sentence" "another" --output_file rows.jsonl
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..tasks.common.args import check_positive_flags, parse_arguments

OUTPUT_SUFFIXES = (".npy", ".jsonl")


@dataclass
class EncodeArguments:
    """What to encode with which export, and where the rows go (``python scripts/encode_onnx.py --help``)."""

    export_dir: str = field(
        metadata={
            "help": "A folder written by scripts/export_onnx.py: model.onnx, the tokenizer, config.json (and "
            "a sentence-transformers model's modules.json, which says how to pool)."
        }
    )
    output_file: str = field(
        metadata={
            "help": "Where the rows go, one per text in the order given: .npy (a float32 array) or .jsonl "
            "(index and embedding, or index, logits and label, per line)."
        }
    )
    texts: list[str] = field(default_factory=list, metadata={"help": "The texts to encode (or --texts_file)."})
    texts_file: str | None = field(
        default=None,
        metadata={"help": "A file of texts: .txt (one per line), or .jsonl / .csv with a text or sentence column."},
    )
    batch_size: int = field(
        default=16, metadata={"help": "Texts per ONNX Runtime call; the texts are batched by length, longest first."}
    )
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "Tokens kept per text. Default: the model's sentence-transformers max_seq_length; with no "
            "sentence-transformers files: its position table."
        },
    )
    int8: bool = field(
        default=False, metadata={"help": "Run model_quantized.onnx (written by export_onnx.py --int8), not model.onnx."}
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": (
                "ONNX Runtime's intra-op threads. Default: the physical cores this process may use, within a container's "
                "CPU quota (ONNX Runtime's own default counts the host's)."
            )
        },
    )

    def __post_init__(self) -> None:
        check_positive_flags(self, "batch_size", "max_length", "threads")
        if not os.path.isdir(self.export_dir):
            raise ValueError(f"--export_dir {self.export_dir}: no such folder")
        if bool(self.texts) == bool(self.texts_file):
            raise ValueError("give the texts: --texts or --texts_file" if not self.texts else
                             "--texts and --texts_file: give one, not both")  # fmt: skip
        if not self.output_file.endswith(OUTPUT_SUFFIXES):
            raise ValueError(f"--output_file must end in .npy or .jsonl, got {self.output_file!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of ``scripts/encode_onnx.py``."""
    (args,) = parse_arguments((EncodeArguments,), argv, __doc__)
    import numpy as np
    from transformers import AutoConfig

    from .encoding import encode, read_texts

    texts = args.texts or read_texts(args.texts_file)
    rows = encode(args.export_dir, texts, batch_size=args.batch_size, max_length=args.max_length, int8=args.int8,
                  threads=args.threads)  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(args.output_file)), exist_ok=True)
    config = AutoConfig.from_pretrained(args.export_dir)
    classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if args.output_file.endswith(".npy"):
        np.save(args.output_file, rows)
    else:
        with open(args.output_file, "w", encoding="utf-8") as f:
            for index, row in enumerate(rows):
                line = {"index": index, "logits" if classifier else "embedding": row.tolist()}
                if classifier:
                    line["label"] = config.id2label[int(row.argmax())]
                f.write(json.dumps(line) + "\n")
    what = "logits" if classifier else "embeddings"
    print(f"wrote {len(rows)} {what} ({rows.shape[1]} values each) to {args.output_file}")
