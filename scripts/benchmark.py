"""Speed and peak memory against SDPA: one attention call, or with ``--model`` a whole training
step, versus sequence length. ``python scripts/benchmark.py --help``."""

from hf_efficient_attn.tools.benchmark import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
