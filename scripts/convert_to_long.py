#!/usr/bin/env python
"""Stretch a 512-position checkpoint to long inputs with an efficient attention, as a masked-LM
model ready for scripts/pretrain_mlm.py:

    python scripts/convert_to_long.py --model_name_or_path roberta-base --max_length 4096 \
        --attn_impl mra2 --output_dir outputs/roberta-base-4096-mra2

Prints what it did (positions copied, method, new MLM head if the checkpoint had none).
"""

from hf_efficient_attn.tasks.convert import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
