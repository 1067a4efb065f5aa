#!/usr/bin/env python
"""Stretch a checkpoint to long inputs with an efficient attention:
``python scripts/convert_to_long.py --help``."""

from hf_efficient_attn.tasks.convert import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
