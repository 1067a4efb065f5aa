#!/usr/bin/env python
"""Fine-tune on WikiHop: ``python scripts/finetune_wikihop.py --help``."""

from hf_efficient_attn.tasks.wikihop.finetune import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
