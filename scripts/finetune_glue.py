#!/usr/bin/env python
"""Fine-tune an efficient-attention model on a GLUE task (or your own csv/json/tsv files) with Trainer.

    python scripts/finetune_glue.py --model_name_or_path roberta-base --attn_impl mra2 \
        --task_name mnli --max_seq_length 512 --do_train --do_eval --output_dir outputs/mnli-mra2
    python scripts/finetune_glue.py configs/train/glue-mnli-roberta-base-mra2.json   # a whole configuration

Flags: those of Transformers' run_glue.py and every TrainingArguments flag, plus --attn_impl /
--attn_config and --peft lora (--lora_r, --lora_alpha, --lora_dropout, --lora_target_modules).
Works under torchrun and accelerate launch (configs/accelerate/).
"""

from hf_efficient_attn.tasks.glue import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
