"""Swap the attention of a real checkpoint and compare with exact: ``python scripts/demo.py --help``."""

from hf_efficient_attn.cli_errors import run_cli
from hf_efficient_attn.demo import main

if __name__ == "__main__":
    run_cli(main)
