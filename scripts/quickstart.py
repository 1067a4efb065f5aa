#!/usr/bin/env python
"""The whole workflow end to end on offline real data (see hf_efficient_attn/tools/quickstart.py):
convert -> continued MLM pretraining -> fine-tuning -> Hub upload folder.

    python scripts/quickstart.py [--attn_impl mra2] [--max_length 1024] [--output_dir outputs/quickstart]
"""

from hf_efficient_attn.tools.quickstart import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
