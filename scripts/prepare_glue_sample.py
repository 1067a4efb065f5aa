#!/usr/bin/env python
"""Write real labelled English text shipped with gensim's test data (offline) as train.csv /
validation.csv in SST-2's layout (sentence,label) for scripts/finetune_glue.py:

    python scripts/prepare_glue_sample.py --sample movie_reviews --output_dir outputs/movie_reviews
    python scripts/prepare_glue_sample.py --sample newsgroups --output_dir outputs/newsgroups
"""

import argparse

from hf_efficient_attn.cli_errors import run_cli
from hf_efficient_attn.training.glue import OFFLINE_SAMPLES, write_offline_sample


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", required=True, choices=OFFLINE_SAMPLES, help="which real labelled text")
    parser.add_argument("--output_dir", required=True, help="folder for train.csv and validation.csv")
    parser.add_argument("--validation_every", type=int, default=4, help="hold out every n-th example of each label")
    args = parser.parse_args(argv)
    counts = write_offline_sample(args.sample, args.output_dir, args.validation_every)
    print(f"wrote {counts['train']} training and {counts['validation']} validation examples to {args.output_dir}")


if __name__ == "__main__":
    run_cli(main)
