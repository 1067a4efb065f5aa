#!/usr/bin/env python
"""Encode texts with an ONNX export (scripts/export_onnx.py) in ONNX Runtime: embeddings of an encoder,
pooled as the model records (sentence-transformers' modules.json, else mean pooling), or the logits
of a classifier, one row per text in the order given.

    python scripts/encode_onnx.py --export_dir outputs/minilm-onnx --texts_file texts.txt --output_file rows.npy
"""

from hf_efficient_attn.serving.encode_cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
