"""Argument dataclasses shared by the training scripts, and their parsing.

The flag names are those of Transformers' examples (``run_mlm.py``, ``run_glue.py``) plus
``--attn_impl`` / ``--attn_config``. A script parses ``(ModelArguments, <its data
arguments>, transformers.TrainingArguments)`` with :func:`parse_arguments`; a single ``.json``
argument is the whole configuration, as in the examples.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from huggingface_hub.utils import validate_repo_id
from transformers import HfArgumentParser

from ..registry import list_methods, resolve_options


def parse_attn_config(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """``--attn_config``: a JSON object given as a string (command line) or a dict (``.json``
    configuration); ``ValueError`` for anything else."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"--attn_config must be a JSON object such as '{{\"block_per_row\": 16}}', got {value!r} ({err})"
            ) from None
    if not isinstance(value, dict):
        raise ValueError(f"--attn_config must be a JSON object of method options, got {value!r}")
    return value


def check_positive_flags(arguments: Any, *flags: str) -> None:
    """``ValueError`` naming the flag unless each of ``flags`` of ``arguments`` is None or a
    positive integer (bools and floats refused)."""
    for flag in flags:
        value = getattr(arguments, flag)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"--{flag} must be a positive integer, got {value!r}")


def check_model_source(flag: str, name: str | None) -> None:
    """``ValueError`` for a ``--flag`` model that is neither a local folder nor possibly a Hub id:
    a file, or a missing path that is written as one (``./x``, ``/x``, ``~/x``, ``a/b/c``, or ``a/b``
    where the folder ``a`` exists). Other names are left to ``from_pretrained`` (the Hub)."""
    if name is None or os.path.isdir(name):
        return
    if os.path.exists(name):
        raise ValueError(f"--{flag} {name!r} is a file; give a model folder or a Hub model id")
    parent = os.path.dirname(name.rstrip("/"))
    if name.startswith((".", "/", "~")) or (parent and os.path.isdir(parent)) or not _is_hub_id(name):
        raise ValueError(f"--{flag} {name!r}: no such folder (and not a Hub model id)")


def _is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except ValueError:  # HFValidationError
        return False
    return True


@dataclass
class ModelArguments:
    """Which checkpoint, tokenizer and attention method to use (``run_mlm.py``'s model flags)."""

    model_name_or_path: str = field(
        metadata={"help": "Checkpoint to start from: a Hub id or a local folder (e.g. one written by convert_to_long)."}
    )
    attn_impl: str | None = field(
        default=None,
        metadata={
            "help": "Attention method: one of "
            + ", ".join(list_methods())
            + ". Default: the method saved in the checkpoint's config, else exact attention."
        },
    )
    attn_config: str | None = field(
        default=None,
        metadata={"help": "Method options as a JSON object, e.g. '{\"block_per_row\": 16}' (see hea.method_options)."},
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Pretrained config name or path if not the same as model_name_or_path."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Pretrained tokenizer name or path if not the same as model_name_or_path."}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where to store models and datasets downloaded from the Hub."}
    )
    use_fast_tokenizer: bool = field(
        default=True, metadata={"help": "Use a fast (Rust) tokenizer when the checkpoint has one."}
    )
    model_revision: str = field(
        default="main", metadata={"help": "The model version to use (branch name, tag name or commit id)."}
    )
    token: str | None = field(
        default=None, metadata={"help": "Hub token for private models (default: the one `hf auth login` stored)."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow checkpoints whose code lives on the Hub to run it locally."}
    )

    def __post_init__(self) -> None:
        for flag in ("model_name_or_path", "config_name", "tokenizer_name"):
            check_model_source(flag, getattr(self, flag))
        if self.attn_impl is not None:
            resolve_options(self.attn_impl, self.attn_options)  # unknown method/option -> ValueError
        elif self.attn_config is not None:
            parse_attn_config(self.attn_config)

    @property
    def attn_options(self) -> dict[str, Any]:
        """``--attn_config`` as a dict."""
        return parse_attn_config(self.attn_config)

    def hub_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for every ``from_pretrained`` call."""
        return {
            "cache_dir": self.cache_dir,
            "revision": self.model_revision,
            "token": self.token,
            "trust_remote_code": self.trust_remote_code,
        }


@dataclass
class DataArguments:
    """Data flags every training script shares (``run_mlm.py`` / ``run_glue.py`` names); a
    script subclasses it with its own (task name, masking probability, ...)."""

    #: Extensions accepted for ``--train_file`` / ``--validation_file``; subclasses may widen it.
    file_extensions: ClassVar[tuple[str, ...]] = ("txt", "json", "jsonl", "csv")
    #: False for a script whose data has a default (the method comparison's bundled text).
    data_required: ClassVar[bool] = True

    dataset_name: str | None = field(default=None, metadata={"help": "A dataset on the Hub (datasets library)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "A local training file (txt, json/jsonl or csv)."})
    validation_file: str | None = field(
        default=None, metadata={"help": "A local validation file (txt, json/jsonl or csv)."}
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per sequence. Default: the tokenizer's model_max_length, capped by the model's table."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many training examples (debugging, quick runs)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many evaluation examples (debugging, quick runs)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenisation (datasets.map num_proc)."}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute cached tokenised datasets."})

    def __post_init__(self) -> None:
        local = (self.train_file, self.validation_file, getattr(self, "test_file", None))  # GLUE has a test file
        if self.data_required and self.dataset_name is None and not any(local):
            raise ValueError("give a dataset: --dataset_name NAME, or --train_file / --validation_file")
        for flag in ("train_file", "validation_file"):
            check_data_file(flag, getattr(self, flag), self.file_extensions)
        check_positive_flags(
            self, "max_seq_length", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"
        )


def check_data_file(flag: str, path: str | None, extensions: Sequence[str]) -> None:
    """``ValueError`` for a data file that is missing, empty or of an unknown format."""
    if path is None:
        return
    extension = path.rsplit(".", 1)[-1].lower()
    if extension not in extensions:
        raise ValueError(f"--{flag} {path!r}: unknown format; allowed extensions: {', '.join(extensions)}")
    if not os.path.isfile(path):
        raise ValueError(f"--{flag} {path!r}: no such file")
    if os.path.getsize(path) == 0:
        raise ValueError(f"--{flag} {path!r}: the file is empty")


def parse_arguments(dataclass_types: Sequence[type], argv: Sequence[str] | None = None) -> tuple[Any, ...]:
    """Parse the command line (``argv``, default ``sys.argv[1:]``) into the dataclasses.

    A single argument ending in ``.json`` is read as the whole configuration (its keys are the
    flag names), as in Transformers' examples. An unknown flag or key (with the closest flag), a
    missing required key and a file that is not a JSON object raise ``ValueError``, before any
    dataclass checks its values.
    """
    parser = HfArgumentParser(dataclass_types)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_dict(read_json_configuration(argv[0], dataclass_types))
    _, unknown = parser.parse_known_args(args=argv)
    if unknown:
        flags = [f"--{f.name}" for cls in dataclass_types for f in dataclasses.fields(cls) if f.init]
        first = unknown[0]
        if not first.startswith("-"):
            raise ValueError(f"unexpected argument {first!r}: every value follows its flag (see --help)")
        raise ValueError(f"unknown flag {first.split('=')[0]}{did_you_mean(first.split('=')[0], flags)} (see --help)")
    return parser.parse_args_into_dataclasses(args=argv)


def did_you_mean(name: str, allowed: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``allowed``, or nothing."""
    close = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def read_json_configuration(path: str, dataclass_types: Sequence[type]) -> dict[str, Any]:
    """The flags of a ``.json`` configuration file, checked against the dataclasses' fields."""
    if not os.path.isfile(path):
        raise ValueError(f"configuration file {path!r}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"configuration file {path!r} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"configuration file {path!r} must hold a JSON object of flag names and values")
    fields = [f for cls in dataclass_types for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    unknown = [key for key in values if key not in names]
    if unknown:
        raise ValueError(
            f"configuration file {path!r}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], names)}; "
            "its keys are the script's flag names"
        )
    required = [
        f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"configuration file {path!r} lacks the required key {missing[0]!r}")
    return values
