#!/usr/bin/env python
"""The whole workflow end to end on offline real data (see hf_efficient_attn/quickstart.py):
convert -> continued MLM pretraining -> fine-tuning -> Hub upload folder.

    python scripts/quickstart.py [--attn_impl mra2] [--max_length 1024] [--output_dir outputs/quickstart]
"""

from hf_efficient_attn.cli_errors import run_cli
from hf_efficient_attn.quickstart import main

if __name__ == "__main__":
    run_cli(main)
