#!/usr/bin/env python
"""Write an offline WikiHop set in the original qangaroo format for scripts/finetune_wikihop.py:
train.json (synthetic examples: the answer is the one candidate the documents mention, among real
news sentences) and dev.json (the two real WikiHop development examples from the allennlp wheel,
then synthetic ones):

    pip download allennlp==0.9.0 --no-deps -d ~/.cache/hf_efficient_attn   # once
    python scripts/prepare_wikihop.py --output_dir outputs/wikihop
"""

import argparse

from hf_efficient_attn.cli_errors import run_cli
from hf_efficient_attn.data.qangaroo import write_wikihop_files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="folder for train.json and dev.json")
    parser.add_argument("--train_examples", type=int, default=256, help="synthetic training examples")
    parser.add_argument("--dev_examples", type=int, default=64, help="synthetic examples after the 2 real ones")
    counts = write_wikihop_files(**vars(parser.parse_args(argv)))
    print(f"wrote {counts['train']} training and {counts['dev']} development examples")


if __name__ == "__main__":
    run_cli(main)
