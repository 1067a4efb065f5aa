"""Share a variant on the Hugging Face Hub (``scripts/push_to_hub.py``): write its upload folder
(config.json with attn_impl, attn_config and auto_map; the weights; the tokenizer; the method's code
for trust_remote_code=True; README.md, the model card) and upload it with huggingface_hub
(create_repo, upload_folder; the token: HF_TOKEN or `hf auth login`), or with --dry_run write the
folder only. --repo_id given a namespace alone names the repository <base>-<method>-<max_len>[-<task>].

Reads: --model_dir (a saved variant, or a plain checkpoint with --attn_impl) and its tokenizer (or
--tokenizer_name); from --model_dir, when there: provenance.json (base model, license, each training
stage and its data) and trainer_state.json; --results_file, a Trainer eval_results.json /
test_results.json / all_results.json.
Writes: a commit to the Hub repository --repo_id (its main branch, or --revision), or with --dry_run
the folder --dry_run: README.md, config.json, model.safetensors, the tokenizer's files,
modeling_efficient_attn.py and the hea_*.py files it imports (and a sentence-transformers model's
modules.json and module folders).

examples:
  python scripts/push_to_hub.py --model_dir outputs/quickstart/3-newsgroups --repo_id your-name --dry_run upload/
  python scripts/push_to_hub.py --model_dir outputs/newsgroups-minilm-mra2 --repo_id your-name --results_file \\
      outputs/newsgroups-minilm-mra2/all_results.json --base_model sentence-transformers/all-MiniLM-L6-v2
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hf_efficient_attn as hea

from ..tasks.common.args import check_model_source, parse_arguments, parse_attn_config
from .export import prepare_upload
from .push import push_variant

#: Flags of the upload itself, not of the folder's contents.
_UPLOAD_ONLY = ("model_dir", "private", "revision", "commit_message", "dry_run")


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
            "repository by the convention <base>-<method>-<max_len>[-<task>] (<task>: --dataset_config_name, else the "
            "last training stage's GLUE task, dataset, or mlm / classification / wikihop)."
        }
    )
    attn_impl: str | None = field(
        default=None,
        metadata={"help": "Method for a plain checkpoint (or to re-convert a variant): one of " + ", ".join(hea.list_methods())},
    )
    attn_config: str | None = field(
        default=None, metadata={"help": "Method options as a JSON object, e.g. '{\"block_per_row\": 16}'."}
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer to ship, if not the one saved in --model_dir."})
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Hub id of the checkpoint the variant was made from; when omitted, what --model_dir records "
            "(provenance.json, written by convert_to_long and the training scripts, else its README.md)."
        },
    )
    license: str | None = field(
        default=None,
        metadata={
            "help": "The Hub's license identifier, normally the base model's; when omitted, what --model_dir "
            "records (provenance.json, else its README.md)."
        },
    )
    results_file: str | None = field(
        default=None,
        metadata={
            "help": "A Trainer eval_results.json / test_results.json / all_results.json for the card's model-index and "
            "results table; the data they were measured on is what --model_dir's provenance.json records for the run "
            "that wrote them (a Hub dataset or local files), unless --dataset_name names it."
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub id of the dataset the --results_file was measured on (default: the one the run recorded)."},
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
        check_model_source("model_dir", self.model_dir)
        self.attn_options  # noqa: B018  (validates --attn_config when parsed)


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """The hub module's warnings as ``warning: ...`` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    hub_logger = logging.getLogger("hf_efficient_attn.hub")
    hub_logger.addHandler(handler)
    try:
        yield
    finally:
        hub_logger.removeHandler(handler)


def main(argv: Sequence[str] | None = None) -> str:
    """Parse the flags (or a single ``.json`` file of them) and push, or with ``--dry_run`` write the
    folder and print the repository and the files a push would upload. Returns the commit URL or
    the folder. A card field that nothing records is left out with a one-line warning."""
    (args,) = parse_arguments([PushArguments], argv, __doc__)
    options = {**asdict(args), "attn_config": args.attn_options}
    with _warnings_on_stderr():
        if args.dry_run is None:
            url = push_variant(**options)
            print(f"pushed: {url}")
            return url
        folder = Path(args.dry_run)
        repo_id = prepare_upload(args.model_dir, folder, **{k: v for k, v in options.items() if k not in _UPLOAD_ONLY})
    print(f"dry run, nothing uploaded: a push would upload these files of {folder} to https://huggingface.co/{repo_id}")
    for path in sorted(folder.iterdir()):
        print(f"  {path.name:<32} {_size(path)}")
    return str(folder)
