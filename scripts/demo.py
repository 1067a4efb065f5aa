"""Swap the attention of a real checkpoint and compare with exact: ``python scripts/demo.py --help``."""

from hf_efficient_attn.tools.demo import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
