#!/usr/bin/env python
"""Convert a paper's released MRA / YOSO / Nystromformer checkpoint into a saved variant:
``python scripts/convert_checkpoint.py --help``."""

from hf_efficient_attn.tasks.convert_released import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
