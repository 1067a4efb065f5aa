"""Approximation error vs time of every method on real Q/K/V of all-MiniLM-L6-v2 on real
Wikipedia text, and sentence-embedding agreement (``--embeddings``):
``python scripts/quality.py --help``."""

from hf_efficient_attn.tools.quality.cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
