#!/usr/bin/env python
"""Continue masked-LM pretraining with an efficient attention: ``python scripts/pretrain_mlm.py --help``."""

from hf_efficient_attn.tasks.mlm.pretrain import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
