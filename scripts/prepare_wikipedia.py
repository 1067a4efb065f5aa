#!/usr/bin/env python
"""Write the real English Wikipedia articles shipped with gensim's test data (offline) as
train.jsonl / validation.jsonl for scripts/pretrain_mlm.py (one whole article per line):

    python scripts/prepare_wikipedia.py --output_dir outputs/wikipedia
"""

import argparse

from hf_efficient_attn.cli_errors import run_cli
from hf_efficient_attn.training.data import write_wikipedia_jsonl


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="folder for train.jsonl and validation.jsonl")
    parser.add_argument("--validation_articles", type=int, default=8, help="articles held out (the last ones)")
    parser.add_argument("--min_words", type=int, default=0, help="keep only articles with at least this many words")
    counts = write_wikipedia_jsonl(**vars(parser.parse_args(argv)))
    print(f"wrote {counts['train']} training and {counts['validation']} validation articles")


if __name__ == "__main__":
    run_cli(main)
