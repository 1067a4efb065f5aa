#!/usr/bin/env python
"""Compare attention methods on your checkpoint, length and text by continued masked-LM training:
``python scripts/compare_methods.py --help``."""

from hf_efficient_attn.tasks.mlm.compare import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
