#!/usr/bin/env python
"""Write an offline WikiHop set in the original qangaroo format for scripts/finetune_wikihop.py.

Reads: the two real WikiHop development examples in the allennlp 0.9.0 wheel (downloaded once, see
below) and real news sentences from gensim's test data.
Writes: into --output_dir: train.json (synthetic examples: the answer is the one candidate the
documents mention, among real news sentences) and dev.json (the two real examples, then synthetic
ones).

examples:
    pip download allennlp==0.9.0 --no-deps -d ~/.cache/hf_efficient_attn   # once
    python scripts/prepare_wikihop.py --output_dir outputs/wikihop
"""

from dataclasses import asdict, dataclass, field

from hf_efficient_attn.tasks.common.args import check_positive_flags, parse_arguments
from hf_efficient_attn.tasks.wikihop.qangaroo import write_wikihop_files
from hf_efficient_attn.utils.cli_errors import run_cli


@dataclass
class WikiHopFilesArguments:
    output_dir: str = field(metadata={"help": "Folder for train.json and dev.json."})
    train_examples: int = field(default=256, metadata={"help": "Synthetic training examples."})
    dev_examples: int = field(default=64, metadata={"help": "Synthetic examples after the 2 real ones."})

    def __post_init__(self):
        check_positive_flags(self, "train_examples", "dev_examples")


def main(argv=None):
    (args,) = parse_arguments([WikiHopFilesArguments], argv, description=__doc__)
    counts = write_wikihop_files(**asdict(args))
    print(f"wrote {counts['train']} training and {counts['dev']} development examples")


if __name__ == "__main__":
    run_cli(main)
