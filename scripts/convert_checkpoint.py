#!/usr/bin/env python
"""Convert a paper's released checkpoint (saved by Transformers' Mra*, Yoso* or Nystromformer*
classes) into a saved variant: the BERT model running the method its config records, which reloads
as itself with the plugin and with plain Transformers:

    python scripts/convert_checkpoint.py --model_name_or_path uw-madison/mra-base-512-4 \
        --output_dir outputs/mra-base-512-4

Prints what it did (method and options, weights taken, new and left-over tensors).
"""

from hf_efficient_attn.tasks.convert_released import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
