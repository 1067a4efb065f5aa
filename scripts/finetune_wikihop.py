#!/usr/bin/env python
"""Fine-tune an efficient-attention model on WikiHop (Trainer): question and candidates first,
then the documents, in chunks of --max_seq_length; one score per candidate.

    python scripts/finetune_wikihop.py --model_name_or_path outputs/mlm-roberta-base-4096-mra2 \
        --train_file qangaroo_v1.1/wikihop/train.json --validation_file qangaroo_v1.1/wikihop/dev.json \
        --max_seq_length 4096 --do_train --do_eval --output_dir outputs/wikihop
    python scripts/finetune_wikihop.py configs/train/wikihop-roberta-base-4096-mra2.json   # a whole configuration

Flags: those of Transformers' examples (run_glue.py) and every TrainingArguments flag, plus
--attn_impl / --attn_config and --max_chunks. Writes eval_results.json (eval_accuracy) and
predictions.json (id -> predicted candidate). Works under torchrun and accelerate launch
(configs/accelerate/).
"""

from hf_efficient_attn.tasks.wikihop.finetune import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
