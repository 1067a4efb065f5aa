#!/usr/bin/env python
"""Export a variant to ONNX and check it with ONNX Runtime: ``python scripts/export_onnx.py --help``."""

from hf_efficient_attn.serving.cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
