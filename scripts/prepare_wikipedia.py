#!/usr/bin/env python
"""Write the real English Wikipedia articles shipped with gensim's test data (offline) as training
and validation files for scripts/pretrain_mlm.py.

Reads: nothing but its flags: the articles come with the gensim package.
Writes: into --output_dir: train.jsonl and validation.jsonl, one whole article per line (title, text).

examples:
    python scripts/prepare_wikipedia.py --output_dir outputs/wikipedia
"""

from dataclasses import asdict, dataclass, field

from hf_efficient_attn.tasks.common.args import check_positive_flags, parse_arguments
from hf_efficient_attn.tasks.common.data import write_wikipedia_jsonl
from hf_efficient_attn.utils.cli_errors import run_cli


@dataclass
class WikipediaFilesArguments:
    output_dir: str = field(metadata={"help": "Folder for train.jsonl and validation.jsonl."})
    validation_articles: int = field(default=8, metadata={"help": "Articles held out (the last ones)."})
    min_words: int = field(default=0, metadata={"help": "Keep only articles with at least this many words."})

    def __post_init__(self):
        check_positive_flags(self, "validation_articles")
        if self.min_words < 0:
            raise ValueError(f"--min_words must be 0 or more, got {self.min_words}")


def main(argv=None):
    (args,) = parse_arguments([WikipediaFilesArguments], argv, description=__doc__)
    counts = write_wikipedia_jsonl(**asdict(args))
    print(f"wrote {counts['train']} training and {counts['validation']} validation articles")


if __name__ == "__main__":
    run_cli(main)
