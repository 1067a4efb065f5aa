#!/usr/bin/env python
"""Fine-tune on a GLUE task or your own labelled text: ``python scripts/finetune_glue.py --help``."""

from hf_efficient_attn.tasks.glue import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
