"""``scripts/push_to_hub.py``: its flags (parsed by ``HfArgumentParser``) and entry point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import hf_efficient_attn as hea

from ..training.args import parse_arguments, parse_attn_config
from .push import push_variant


@dataclass
class PushArguments:
    """What to share and where (``python scripts/push_to_hub.py --help``)."""

    model_dir: str = field(
        metadata={
            "help": "A saved variant (its config.json has attn_impl), e.g. a training run's --output_dir, or a plain "
            "checkpoint (folder or Hub id) together with --attn_impl."
        }
    )
    repo_id: str = field(
        metadata={
            "help": "The Hub repository, user/name; or only a namespace (user or organisation), which names the "
            "repository by the convention <base>-<method>-<max_len>[-<dataset_config_name>]."
        }
    )
    attn_impl: str | None = field(
        default=None,
        metadata={
            "help": "Method for a plain checkpoint (or to re-convert a variant): one of "
            + ", ".join(hea.list_methods())
        },
    )
    attn_config: str | None = field(
        default=None, metadata={"help": "Method options as a JSON object, e.g. '{\"block_per_row\": 16}'."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer to ship, if not the one saved in --model_dir."}
    )
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Hub id of the checkpoint the variant was made from; when omitted, the base_model of "
            "--model_dir's README.md."
        },
    )
    license: str | None = field(
        default=None,
        metadata={
            "help": "The Hub's license identifier, normally the base model's; when omitted, the license of "
            "--model_dir's README.md."
        },
    )
    results_file: str | None = field(
        default=None,
        metadata={
            "help": "A Trainer eval_results.json / test_results.json / all_results.json for the card's model-index."
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub id of the dataset trained or evaluated on (required with --results_file)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. sst2."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private (when it is created)."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing)."})
    commit_message: str | None = field(default=None, metadata={"help": "Message of the upload commit."})
    dry_run: str | None = field(
        default=None,
        metadata={"help": "Write the folder that would be pushed to this (new or empty) folder; upload nothing."},
    )

    @property
    def attn_options(self) -> dict[str, Any] | None:
        """``--attn_config`` as a dict (None when not given); ``ValueError`` unless it is a JSON object."""
        return None if self.attn_config is None else parse_attn_config(self.attn_config)

    def __post_init__(self) -> None:
        self.attn_options  # noqa: B018  (validates --attn_config when parsed)


def main(argv: Sequence[str] | None = None) -> str:
    """Parse the flags (or a single ``.json`` file of them) and push; prints and returns the result."""
    (args,) = parse_arguments([PushArguments], argv)
    options = {**asdict(args), "attn_config": args.attn_options}
    result = push_variant(**options)
    print(f"wrote {result} (nothing uploaded)" if args.dry_run else f"pushed: {result}")
    return result
