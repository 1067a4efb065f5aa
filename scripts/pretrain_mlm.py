#!/usr/bin/env python
"""Continue masked-language-model pretraining with an efficient attention (Trainer).

    python scripts/pretrain_mlm.py --model_name_or_path outputs/roberta-base-4096-mra2 \
        --train_file train.txt --validation_file valid.txt --max_seq_length 4096 \
        --do_train --do_eval --output_dir outputs/mlm
    python scripts/pretrain_mlm.py configs/train/roberta-base-4096-mra2.json   # a whole configuration

Flags: those of Transformers' run_mlm.py and every TrainingArguments flag, plus --attn_impl /
--attn_config. Works under torchrun and accelerate launch (configs/accelerate/).
"""

from hf_efficient_attn.tasks.mlm.pretrain import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
