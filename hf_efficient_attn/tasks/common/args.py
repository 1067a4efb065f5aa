"""Argument dataclasses shared by the scripts, and their parsing: every script parses its dataclasses
with :func:`parse_arguments`.

The flag names are those of Transformers' examples (``run_mlm.py``, ``run_glue.py``), with
underscores, plus ``--attn_impl NAME --attn_config JSON`` for one method. A training script parses
``(ModelArguments, <its data arguments>, transformers.TrainingArguments)``; a tool that compares
methods takes ``--methods NAME,NAME`` and ``--attn_config`` as a JSON object keyed by method name
(:func:`parse_method_names`, :func:`parse_method_configs`). A single ``.json`` argument is the whole
configuration, as in the examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import validate_repo_id
from transformers import HfArgumentParser

from ...registry import list_methods, method_options, resolve_options


def parse_attn_config(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """``--attn_config`` of one method: a JSON object of its options."""
    return parse_json_object("attn_config", value, '{"block_per_row": 16}')


def parse_json_object(flag: str, value: str | dict[str, Any] | None, example: str) -> dict[str, Any]:
    """``--flag``'s JSON object, given as a string (command line) or a dict (``.json`` configuration);
    ``ValueError`` showing ``example`` for anything else."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"--{flag} must be a JSON object such as '{example}', got {value!r} ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--{flag} must be a JSON object such as '{example}', got {value!r}")
    return value


def parse_method_names(value: str | Sequence[str] | None, allowed: Sequence[str], default: Sequence[str]) -> list[str]:
    """``--methods``: a comma list of method names (or a list, in a ``.json`` configuration), each one
    of ``allowed`` and none twice; ``default`` when not given. ``ValueError`` naming the allowed ones."""
    if value is None:
        return list(default)
    names = [name.strip() for name in value.split(",")] if isinstance(value, str) else list(value)
    for name in names:
        if name not in allowed:
            raise ValueError(f"--methods: unknown method {name!r}; known methods: {', '.join(allowed)}")
    if not names or len(set(names)) < len(names):
        raise ValueError(f"--methods must name each method once, comma-separated (e.g. mra2,softmax), got {value!r}")
    return names


def parse_method_configs(value: str | dict[str, Any] | None, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--attn_config`` of a tool comparing ``methods``: a JSON object of method name -> options
    (``'{"mra2": {"block_per_row": 8}}'``), each key one of ``methods``, its options checked by
    :func:`resolve_options`. Returns the options as given (defaults not filled in)."""
    configs = parse_json_object("attn_config", value, '{"mra2": {"block_per_row": 8}}')
    for name, options in configs.items():
        if name not in methods:
            raise ValueError(f"--attn_config: {name!r} is not a method of this run; its keys are: {', '.join(methods)}")
        if not isinstance(options, dict):
            raise ValueError(f"--attn_config: the options of {name!r} must be a JSON object, got {options!r}")
        try:
            resolve_options(name, options)
        except ValueError as err:
            raise ValueError(f"--attn_config {name!r}: {err}") from None
    return configs


def check_flag_choice(flag: str, value: Any, allowed: Sequence[Any]) -> None:
    """``ValueError`` naming the allowed values unless ``value`` is one of them."""
    if value not in allowed:
        raise ValueError(f"--{flag} {value!r}: allowed: {', '.join(map(str, allowed))}")


def check_positive_flags(arguments: Any, *flags: str) -> None:
    """``ValueError`` naming the flag unless each of ``flags`` of ``arguments`` is None or a
    positive integer (bools and floats refused)."""
    for flag in flags:
        value = getattr(arguments, flag)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"--{flag} must be a positive integer, got {value!r}")


def check_model_source(flag: str, name: str | None, cache_dir: str | None = None) -> None:
    """``ValueError`` for a ``--flag`` model that is neither a local folder nor possibly a Hub id:
    a file, or a missing path that is written as one (``./x``, ``/x``, ``~/x``, ``a/b/c``, or ``a/b``
    where the folder ``a`` exists), or in offline mode a Hub id missing from the local Hub cache
    (``cache_dir``, default Hugging Face's). Other names are left to ``from_pretrained`` (the Hub)."""
    if name is None or os.path.isdir(name):
        return
    if os.path.exists(name):
        raise ValueError(f"--{flag} {name!r} is a file; give a model folder or a Hub model id")
    parent = os.path.dirname(name.rstrip("/"))
    if name.startswith((".", "/", "~")) or (parent and os.path.isdir(parent)) or not _is_hub_id(name):
        raise ValueError(f"--{flag} {name!r}: no such folder (and not a Hub model id)")
    cached = os.path.join(cache_dir or hub_constants.HF_HUB_CACHE, "models--" + name.replace("/", "--"))
    if hub_constants.HF_HUB_OFFLINE and not os.path.isdir(cached):
        raise not_downloadable(flag, name)


def not_downloadable(flag: str, name: str) -> ValueError:
    """The error for a ``--flag`` Hub id that is not in the local Hub cache and cannot be downloaded
    (offline mode, or no network)."""
    if hub_constants.HF_HUB_OFFLINE:
        return ValueError(
            f"--{flag} {name!r} is not in the local Hub cache, and offline mode (HF_HUB_OFFLINE=1) forbids "
            "downloading it: give a local folder, or unset HF_HUB_OFFLINE"
        )
    return ValueError(
        f"--{flag} {name!r} is not in the local Hub cache, and the Hub cannot be reached (no network?): give a "
        "local folder, or rerun where huggingface.co can be reached"
    )


def _is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except ValueError:  # HFValidationError
        return False
    return True


def check_fast_tokenizer(use_fast_tokenizer: bool) -> None:
    """``--use_fast_tokenizer false`` is refused: Transformers 5's ``AutoTokenizer`` always loads the
    fast (Rust) tokenizer and drops ``use_fast``, so the flag would do nothing."""
    if not use_fast_tokenizer:
        raise ValueError(
            "--use_fast_tokenizer false has no effect with Transformers 5, whose AutoTokenizer always loads the fast "
            "(Rust) tokenizer; leave the flag out, or give --tokenizer_name for another tokenizer"
        )


def attn_impl_field(default: str | None, when_unset: str = "") -> Any:
    """The ``--attn_impl`` flag of one method (``when_unset``: what runs when it is not given)."""
    return field(default=default, metadata={"help": f"Attention method: one of {', '.join(list_methods())}.{when_unset}"})


def attn_config_field() -> Any:
    """The ``--attn_config`` flag of one method; its help lists each method's options, read from the
    options' fields as ``hea.method_options`` and the docs' option tables are."""
    options = "; ".join(f"{name}: {', '.join(method_options(name)) or 'none'}" for name in list_methods())
    return field(
        default=None,
        metadata={
            "help": "Method options as a JSON object, e.g. '{\"block_per_row\": 16}'; each option's default and "
            f"meaning: hf_efficient_attn.method_options(NAME) and docs/methods/. Options by method: {options}."
        },
    )


class _MethodChoice:
    """``attn_options``: ``--attn_config`` of one method as a dict."""

    attn_config: str | None

    @property
    def attn_options(self) -> dict[str, Any]:
        """``--attn_config`` as a dict."""
        return parse_attn_config(self.attn_config)


@dataclass
class ModelArguments(_MethodChoice):
    """Which checkpoint, tokenizer and attention method to use (``run_mlm.py``'s model flags)."""

    no_flag_help: ClassVar[dict[str, str]] = {"use_fast_tokenizer": "Refused: Transformers 5 loads the fast tokenizer only."}

    model_name_or_path: str = field(
        metadata={"help": "Checkpoint to start from: a Hub id or a local folder (e.g. one written by convert_to_long)."}
    )
    attn_impl: str | None = attn_impl_field(None, " Default: the method saved in the checkpoint's config, else exact attention.")
    attn_config: str | None = attn_config_field()
    config_name: str | None = field(
        default=None, metadata={"help": "Pretrained config name or path if not the same as model_name_or_path."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Pretrained tokenizer name or path if not the same as model_name_or_path."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store models and datasets downloaded from the Hub."})
    use_fast_tokenizer: bool = field(
        default=True,
        metadata={
            "help": "Kept for Transformers' examples' flag set: Transformers 5 always loads the fast (Rust) tokenizer, so "
            "false is refused."
        },
    )
    model_revision: str = field(
        default="main", metadata={"help": "The model version to use (branch name, tag name or commit id)."}
    )
    token: str | None = field(
        default=None, metadata={"help": "Hub token for private models. Default: the one `hf auth login` stored."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow checkpoints whose code lives on the Hub to run it locally."}
    )

    def __post_init__(self) -> None:
        for flag in ("model_name_or_path", "config_name", "tokenizer_name"):
            check_model_source(flag, getattr(self, flag), self.cache_dir)
        check_fast_tokenizer(self.use_fast_tokenizer)
        if self.attn_impl is not None:
            resolve_options(self.attn_impl, self.attn_options)  # unknown method/option -> ValueError
        elif self.attn_config is not None:
            parse_attn_config(self.attn_config)

    def hub_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for every ``from_pretrained`` call."""
        return {
            "cache_dir": self.cache_dir,
            "revision": self.model_revision,
            "token": self.token,
            "trust_remote_code": self.trust_remote_code,
        }


@dataclass
class MethodArguments(_MethodChoice):
    """``--attn_impl`` / ``--attn_config`` of a tool that runs one method on a model it chooses itself
    (the demo, the quickstart); a tool subclasses it with its own flags."""

    attn_impl: str = attn_impl_field("mra2")
    attn_config: str | None = attn_config_field()

    def __post_init__(self) -> None:
        resolve_options(self.attn_impl, self.attn_options)  # unknown method/option -> ValueError


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
    validation_file: str | None = field(default=None, metadata={"help": "A local validation file (txt, json/jsonl or csv)."})
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Tokens per sequence. Default: the tokenizer's model_max_length, capped by the model's table."},
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
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Pack each batch into one row without padding (transformers.DataCollatorWithFlattening), so a "
            "step costs its real tokens; the method's attention keeps the sequences apart (docs/packing.md). Needs "
            "an attention method of this package: Transformers' own attention would mix them."
        },
    )

    def __post_init__(self) -> None:
        local = (self.train_file, self.validation_file, getattr(self, "test_file", None))  # GLUE has a test file
        if self.data_required and self.dataset_name is None and not any(local):
            raise ValueError("give a dataset: --dataset_name NAME, or --train_file / --validation_file")
        if self.dataset_name is not None and any(local):  # the loaders would read the Hub dataset alone
            raise ValueError("--dataset_name and local files (--train_file, ...) both name the data: give one of them")
        if self.dataset_config_name is not None and self.dataset_name is None:
            raise ValueError("--dataset_config_name is a configuration of --dataset_name: give that too, or leave it out")
        for flag in ("train_file", "validation_file"):
            check_data_file(flag, getattr(self, flag), self.file_extensions)
        check_positive_flags(self, "max_seq_length", "max_train_samples", "max_eval_samples", "preprocessing_num_workers")


def check_max_seq_length(max_seq_length: int | None, model_limit: int) -> None:
    """``ValueError`` when ``--max_seq_length`` exceeds the model's position table."""
    if max_seq_length is not None and max_seq_length > model_limit:
        raise ValueError(
            f"--max_seq_length {max_seq_length} exceeds the model's position table ({model_limit} tokens); "
            f"stretch the checkpoint first: scripts/convert_to_long.py --max_length {max_seq_length}"
        )


def block_length(data_args: DataArguments, tokenizer_limit: int, model_limit: int) -> int:
    """``--max_seq_length``, or the tokenizer's limit capped by the model's position table;
    ``ValueError`` when it exceeds the table."""
    check_max_seq_length(data_args.max_seq_length, model_limit)
    return data_args.max_seq_length or min(tokenizer_limit, model_limit)


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


#: A help text that speaks of its default itself ("Default: ...", "(default)", "by default"): then
#: ``--help`` adds no ``(default: X)`` of its own.
STATES_DEFAULT = re.compile(r"\bdefault", re.IGNORECASE)


def shown_default(action: argparse.Action) -> bool:
    """Whether ``--help`` shows the default of ``action``: not for a ``--no_X`` flag (its default is the
    positive's), an unset default (None or empty, as every required flag's: the help says in words what
    happens then, where it matters), nor a help that speaks of its default itself."""
    unset = action.default in (None, argparse.SUPPRESS) or action.default == [] or action.default == ""
    return not (isinstance(action, argparse._StoreFalseAction) or unset or STATES_DEFAULT.search(action.help or ""))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help``: the description as written (examples keep their lines), each flag's default shown
    where :func:`shown_default` says so."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        return f"{help_text} (default: %(default)s)" if shown_default(action) else help_text


def describe_negative_flags(parser: argparse.ArgumentParser, dataclass_types: Sequence[type]) -> None:
    """Give each ``--no_X`` flag (HfArgumentParser adds one for a bool defaulting to True, with the
    positive's help) a help of its own: a dataclass's ``no_flag_help`` (a ClassVar: field name -> help of
    its ``--no_X``; HfArgumentParser passes any metadata key on to argparse), else what it turns off."""
    written = {name: text for cls in dataclass_types for name, text in getattr(cls, "no_flag_help", {}).items()}
    for action in parser._actions:
        if isinstance(action, argparse._StoreFalseAction) and action.option_strings[0].startswith("--no_"):
            action.help = written.get(action.dest, f"Turn off --{action.dest} (on unless this is given).")


def parse_arguments(
    dataclass_types: Sequence[type], argv: Sequence[str] | None = None, description: str | None = None
) -> tuple[Any, ...]:
    """Parse the command line (``argv``, default ``sys.argv[1:]``) into the dataclasses; ``--help``
    shows ``description`` and each field's ``metadata["help"]`` (the ``--no_X`` of a bool defaulting to
    True: :func:`describe_negative_flags`).

    ``description`` says, in this order: what the script does (a paragraph); for a script with modes,
    a line ``Default: ...`` (what it does when no mode-choosing flag is given); a line ``Reads: ...``
    (its inputs, and for local data files their format and the columns they need); a line
    ``Writes: ...`` (the files it writes and where, e.g. into --output_dir: ``train_results.json``,
    ``eval_results.json``, ``all_results.json``, ``trainer_state.json``, the model, ...); then
    ``examples:`` with commands. A flag's help that states what happens without the flag says it
    last, as ``Default: ...`` (per mode: ``Default: A; with --flag: B``); --help then shows no
    ``(default: X)`` of its own (:func:`shown_default`). tests/project/test_cli_help.py and
    tests/project/defaults_table.py read these forms.

    A single argument ending in ``.json`` is read as the whole configuration (its keys are the
    flag names), as in Transformers' examples. An unknown flag or key (with a plausible flag it
    misspells, or a dataclass's ``flag_advice`` for a flag it lacks on purpose), a missing required
    key and a file that is not a JSON object raise ``ValueError``, before any dataclass checks its
    values.
    """
    # No abbreviations: HfArgumentParser adds each flag twice (--task_name, --task-name), so argparse
    # would call any prefix ambiguous; a prefix is an unknown flag, answered with the full name.
    parser = HfArgumentParser(dataclass_types, description=description, formatter_class=_HelpFormatter, allow_abbrev=False)
    describe_negative_flags(parser, dataclass_types)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_dict(read_json_configuration(argv[0], dataclass_types))
    _, unknown = parser.parse_known_args(args=argv)
    if unknown:
        flags = [f"--{f.name}" for cls in dataclass_types for f in dataclasses.fields(cls) if f.init]
        first = unknown[0]
        if not first.startswith("-"):
            raise ValueError(f"unexpected argument {first!r}: every value follows its flag (see {parser.prog} --help)")
        flag = first.split("=")[0]
        advice = flag_advice(flag, dataclass_types)
        if advice:
            raise ValueError(f"unknown flag {flag}: {advice} (see {parser.prog} --help)")
        raise ValueError(f"unknown flag {flag}{did_you_mean(flag, flags)} (see {parser.prog} --help)")
    return parser.parse_args_into_dataclasses(args=argv)


#: Names other tools give a flag -> its name here (Transformers' older examples and TrainingArguments).
OTHER_NAMES = {
    "model": "model_name_or_path",
    "batch_size": "per_device_train_batch_size",
    "lr": "learning_rate",
    "warmup_ratio": "warmup_steps",
    "attn_implementation": "attn_impl",
}


def _words(name: str) -> list[str]:
    return [word for word in re.split(r"[-_]+", name.lower()) if word]


def _same_word(typed: str, word: str) -> bool:
    """``typed`` is ``word``, shortened or misspelt."""
    return word.startswith(typed) or _alike(typed, word) >= 0.75


def _alike(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def abbreviates(name: str, flag: str) -> bool:
    """Whether ``name``'s words are ``flag``'s first words, each maybe shortened or misspelt
    (``--task`` for ``--task_name``, ``--out-dir`` for ``--output_dir``)."""
    typed, words = _words(name), _words(flag)
    return 0 < len(typed) <= len(words) and all(_same_word(t, w) for t, w in zip(typed, words))


def misspells(name: str, flag: str) -> bool:
    """Whether ``name`` plausibly means ``flag``: it abbreviates it; or each of its words is one of
    ``flag``'s, shortened or misspelt, and the two are alike as wholes (``--lerning_rate``,
    ``--num_epochs``; not ``--text_column`` for ``--length_column_name``, nor ``--lr`` for
    ``--lr_scheduler_type``); or they differ only in separators and a typo (``--maxseqlength``)."""
    typed, words = _words(name), _words(flag)
    if abbreviates(name, flag):
        return True
    if typed and all(any(_same_word(t, w) for w in words) for t in typed) and _alike(*_joined(name, flag)) >= 0.5:
        return True
    return _alike("".join(typed), "".join(words)) >= 0.85


def _joined(name: str, flag: str) -> tuple[str, str]:
    return "_".join(_words(name)), "_".join(_words(flag))


def did_you_mean(name: str, allowed: Sequence[str]) -> str:
    """`` (did you mean X?)`` for the flag of ``allowed`` that ``name`` most plausibly means, or
    nothing: the flag of that name in another tool (:data:`OTHER_NAMES`), else of those it
    :func:`misspells`, one it abbreviates first, then the most alike."""
    prefix = "--" if name.startswith("-") else ""
    other = OTHER_NAMES.get("_".join(_words(name)))
    if other is not None and prefix + other in allowed:
        return f" (did you mean {prefix + other}?)"
    close = [flag for flag in allowed if misspells(name, flag)]
    if not close:
        return ""
    best = max(close, key=lambda flag: (abbreviates(name, flag), _alike(*_joined(name, flag))))
    return f" (did you mean {best}?)"


def flag_advice(name: str, dataclass_types: Sequence[type]) -> str | None:
    """What a script does instead of a flag it lacks on purpose: the ``flag_advice`` (a ClassVar: flag
    name -> advice) of the dataclasses, for a flag that ``name`` plausibly misspells."""
    for cls in dataclass_types:
        for flag, advice in getattr(cls, "flag_advice", {}).items():
            if misspells(name, flag):
                return advice
    return None


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
        advice = flag_advice(unknown[0], dataclass_types)
        raise ValueError(
            f"configuration file {path!r}: unknown key {unknown[0]!r}"
            + (f": {advice}" if advice else f"{did_you_mean(unknown[0], names)}; its keys are the script's flag names")
        )
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"configuration file {path!r} lacks the required key {missing[0]!r}")
    return values
