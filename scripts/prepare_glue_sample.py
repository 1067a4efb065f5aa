#!/usr/bin/env python
"""Write real labelled English text shipped with gensim's test data (offline) as a GLUE-style
single-sentence task for scripts/finetune_glue.py: movie_reviews (200 sentences, labels 0 negative / 1
positive as SST-2's ids: fine-tune with --task_name sst2) or newsgroups (200 posts of 40-7000 tokens,
labels alt.atheism / sci.space: fine-tune without a task).

Reads: nothing but its flags: the texts come with the gensim package.
Writes: into --output_dir: train.csv and validation.csv, in SST-2's layout (columns sentence, label).

examples:
    python scripts/prepare_glue_sample.py --sample movie_reviews --output_dir outputs/movie_reviews
    python scripts/prepare_glue_sample.py --sample newsgroups --output_dir outputs/newsgroups
"""

from dataclasses import dataclass, field

from hf_efficient_attn.tasks.common.args import check_flag_choice, check_positive_flags, parse_arguments
from hf_efficient_attn.tasks.glue import OFFLINE_SAMPLES, write_offline_sample
from hf_efficient_attn.utils.cli_errors import run_cli


@dataclass
class SampleArguments:
    sample: str = field(metadata={"help": f"Which real labelled text: {', '.join(OFFLINE_SAMPLES)}."})
    output_dir: str = field(metadata={"help": "Folder for train.csv and validation.csv."})
    validation_every: int = field(default=4, metadata={"help": "Hold out every n-th example of each label."})

    def __post_init__(self):
        check_flag_choice("sample", self.sample, OFFLINE_SAMPLES)
        check_positive_flags(self, "validation_every")


def main(argv=None):
    (args,) = parse_arguments([SampleArguments], argv, description=__doc__)
    counts = write_offline_sample(args.sample, args.output_dir, args.validation_every)
    print(f"wrote {counts['train']} training and {counts['validation']} validation examples to {args.output_dir}")


if __name__ == "__main__":
    run_cli(main)
