#!/usr/bin/env python
"""Compare attention methods on your checkpoint, your length and your text: continued masked-LM
training with each method from the same weights, the same batches and the same seed.

    python scripts/convert_to_long.py --model_name_or_path roberta-base --max_length 2048 \
        --output_dir outputs/roberta-base-2048
    python scripts/compare_methods.py --model_name_or_path outputs/roberta-base-2048 \
        --methods softmax,mra2,linformer --max_seq_length 2048 --max_steps 300 --eval_steps 50 \
        --per_device_train_batch_size 4 --output_dir outputs/compare-2048

Writes results.csv, comparison.png and summary.md into --output_dir; rerunning the same command
resumes an interrupted comparison (finished methods are not rerun). Without --train_file /
--validation_file it trains on the real English Wikipedia articles bundled with gensim. Flags:
--methods, --attn_config (a JSON object keyed by method name), --head_warmup_steps, those of
scripts/pretrain_mlm.py and every TrainingArguments flag.
"""

from hf_efficient_attn.tasks.mlm.compare import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
