#!/usr/bin/env python
"""Encode texts with an ONNX export in ONNX Runtime: ``python scripts/encode_onnx.py --help``."""

from hf_efficient_attn.serving.encode_cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
