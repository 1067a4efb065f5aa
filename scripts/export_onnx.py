#!/usr/bin/env python
"""Export a variant to ONNX for serving and check it with ONNX Runtime.

    python scripts/export_onnx.py --model_dir outputs/mlm --output_dir outputs/mlm-onnx

Writes model.onnx (dynamic batch and sequence dimensions), the tokenizer and config.json, then
checks that ONNX Runtime equals PyTorch on a padded batch at the export length and another length.
"""

from hf_efficient_attn.serving.cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
