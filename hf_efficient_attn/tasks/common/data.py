"""Raw text in, tokenised training examples out (``datasets``): Hub datasets or local
txt/json/csv/tsv files, a validation split carved from the training data when there is none,
and text grouped into full blocks of ``max_seq_length`` tokens (or one example per line)."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
from itertools import chain
from typing import TYPE_CHECKING, Any, ContextManager, Mapping

from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:  # datasets is imported where it is used: scripts answer --help and flag errors without it
    from datasets import Dataset, DatasetDict

logger = logging.getLogger("hf_efficient_attn.tasks")

#: ``load_dataset`` builder for each local file extension.
BUILDERS = {"txt": "text", "json": "json", "jsonl": "json", "csv": "csv", "tsv": "csv"}
#: Reading options for extensions that need them: tab-separated files read quotes as text (GLUE's
#: tsv files have unbalanced quotes inside sentences).
READ_OPTIONS = {"tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE}}
#: Texts concatenated at a time into blocks (datasets' ``map`` batch): each group's tail that does
#: not fill a block is left out.
GROUPED_TEXTS = 1000


def load_raw_datasets(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    validation_split_percentage: int | None = None,
    cache_dir: str | None = None,
    token: str | None = None,
    extra_files: Mapping[str, str | None] | None = None,
    validation_needed: bool = True,
    default_split_percentage: int | None = None,
) -> DatasetDict:
    """``train`` / ``validation`` splits (and those of ``extra_files``, split name -> local file,
    e.g. ``{"test": path}``) from a Hub dataset or local files; each local file is read on its
    own, so a test file may lack the label column. Without a validation split, the first
    ``validation_split_percentage`` % of the training rows become it (as in ``run_mlm.py``), or
    ``default_split_percentage`` % when that is None; both None carve none, and so does a training
    set too small to give one row unless ``validation_needed`` (then it is a ``ValueError`` saying how
    to give one). A ``validation_split_percentage`` for data that have a validation split is a
    ``ValueError``: it would do nothing."""
    from datasets import DatasetDict, load_dataset

    hub = {"cache_dir": cache_dir, "token": token}
    if dataset_name is not None:
        raw = load_dataset(dataset_name, name=dataset_config_name, **hub)
    else:
        named = {"train": train_file, "validation": validation_file, **(extra_files or {})}
        files = {split: path for split, path in named.items() if path}
        extensions = {path.rsplit(".", 1)[-1].lower() for path in files.values()}
        if len({e if e in READ_OPTIONS else BUILDERS[e] for e in extensions}) > 1:
            flags = ", ".join(f"--{split}_file" for split in files)
            raise ValueError(f"{flags} must have the same format, got {sorted(extensions)}")
        extension = extensions.pop()
        raw = DatasetDict(
            {split: read_local_file(split, path, BUILDERS[extension], READ_OPTIONS.get(extension, {}), hub)
             for split, path in files.items()}
        )  # fmt: skip
    if "validation" in raw and validation_split_percentage is not None:
        raise unused_split_percentage(validation_file or f"the validation split of {dataset_name}")
    percentage = default_split_percentage if validation_split_percentage is None else validation_split_percentage
    if "validation" not in raw and "train" in raw and percentage is not None:
        carved = carve_validation(raw["train"], percentage, validation_needed)
        if carved is not None:
            raw["train"], raw["validation"] = carved
    for split, rows in raw.items():
        if len(rows) == 0:
            raise ValueError(f"the {split} split is empty")
    return raw


def read_local_file(split: str, path: str, builder: str, options: dict[str, Any], hub: dict[str, Any]) -> Dataset:
    """One local file as a split; ``ValueError`` naming the file when ``datasets`` cannot parse it."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    try:
        return load_dataset(builder, data_files={split: path}, split=split, **options, **hub)
    except DatasetGenerationError as err:
        cause = err.__cause__ or err
        raise ValueError(f"--{split}_file {path!r} cannot be read as {builder}: {cause}") from None


def unused_split_percentage(validation_split: str) -> ValueError:
    """The error for ``--validation_split_percentage`` given for data that have a ``validation_split``."""
    return ValueError(
        "--validation_split_percentage has no effect here: it carves a validation split out of the training rows of "
        f"data that have none, and these have one ({validation_split}); leave it out"
    )


def carve_validation(train: Dataset, percentage: int, needed: bool = True) -> tuple[Dataset, Dataset] | None:
    """(the rest of ``train``, its first ``percentage`` %, rounded to whole rows); None when that
    is no row and the split is not ``needed``."""
    if not 0 < percentage < 100:
        raise ValueError(f"--validation_split_percentage must be in 1..99 to carve a validation split, got {percentage}")
    count = round(len(train) * percentage / 100)
    if count == 0:
        if not needed:
            return None
        raise ValueError(
            f"the training data has {len(train)} rows, too few to carve {percentage}% of them for validation: "
            "give --validation_file FILE (or raise --validation_split_percentage)"
        )
    return train.select(range(count, len(train))), train.select(range(count))


def text_column(dataset: Dataset, name: str | None = None) -> str:
    """The column holding the text: ``name``, else ``text``; ``ValueError`` naming the columns
    there are when it is missing or not a string column."""
    name = name or "text"
    columns = dataset.column_names
    if name not in columns:
        raise ValueError(f"the dataset has no text column {name!r}; its columns are {columns}: pass --text_column_name COLUMN")
    dtype = getattr(dataset.features[name], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ValueError(f"column {name!r} must hold text (strings), but its type is {dataset.features[name]}")
    return name


def tokenize_in_blocks(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    block_size: int,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    main_process_first: ContextManager | None = None,
) -> DatasetDict:
    """Tokenise every text whole (no truncation), concatenate, and cut into blocks of exactly
    ``block_size`` tokens: long documents stay long, and no position is padding. The tail of
    each ``map`` batch of :data:`GROUPED_TEXTS` texts that does not fill a block is dropped (as
    ``run_mlm.py``), and the log says how many tokens that left out."""

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return tokenizer(batch[column], return_special_tokens_mask=True, verbose=False)

    def group(batch: dict[str, list]) -> dict[str, list]:
        joined = {key: list(chain.from_iterable(values)) for key, values in batch.items()}
        usable = len(joined["input_ids"]) // block_size * block_size
        return {key: [ids[i : i + block_size] for i in range(0, usable, block_size)] for key, ids in joined.items()}

    with main_process_first or contextlib.nullcontext():
        tokens = raw.map(
            tokenize,
            batched=True,
            num_proc=num_proc,
            remove_columns=raw["train" if "train" in raw else "validation"].column_names,
            load_from_cache_file=load_from_cache_file,
            desc="Tokenising texts",
        )
        blocks = tokens.map(
            group,
            batched=True,
            batch_size=GROUPED_TEXTS,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            desc=f"Grouping texts in blocks of {block_size} tokens",
        )
    for split, rows in blocks.items():
        total = token_count(tokens[split])
        if len(rows) == 0:
            raise ValueError(
                f"the {split} text has {total} tokens, fewer than one block of --max_seq_length {block_size}: "
                "give more text or a smaller --max_seq_length"
            )
        dropped = total - len(rows) * block_size
        if dropped:
            logger.info(
                f"{split}: {len(rows)} blocks of {block_size} tokens; {dropped} of the {total} tokens ({dropped / total:.0%}) "
                f"do not fill a block and are left out (at most {block_size - 1} per {GROUPED_TEXTS} texts; "
                f"--line_by_line makes each line an example instead, padded or truncated to {block_size} tokens)"
            )
    return blocks


def tokenize_lines(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    max_length: int,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    main_process_first: ContextManager | None = None,
) -> DatasetDict:
    """One example per non-empty line (``--line_by_line``), truncated to ``max_length`` tokens."""

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        lines = [line for line in batch[column] if line and not line.isspace()]
        return tokenizer(lines, truncation=True, max_length=max_length, return_special_tokens_mask=True)

    with main_process_first or contextlib.nullcontext():
        return raw.map(
            tokenize,
            batched=True,
            num_proc=num_proc,
            remove_columns=raw["train" if "train" in raw else "validation"].column_names,
            load_from_cache_file=load_from_cache_file,
            desc="Tokenising lines",
        )


def first_rows(dataset: Dataset, limit: int | None) -> Dataset:
    """The first ``limit`` rows (``--max_train_samples`` / ``--max_eval_samples``)."""
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def mean_length(examples: Dataset | None) -> float | None:
    """Mean number of tokens per example (:func:`token_count`)."""
    if examples is None or len(examples) == 0:
        return None
    return token_count(examples) / len(examples)


def token_count(examples: Dataset) -> int:
    """Number of tokens of all examples, read from Arrow's list offsets (no Python lists); an
    example whose ``input_ids`` are a list of chunks counts the tokens of all its chunks."""
    import pyarrow

    total = 0
    for chunk in examples.with_format("arrow")["input_ids"].chunks:  # a pyarrow ChunkedArray of lists
        while pyarrow.types.is_list(chunk.type.value_type) or pyarrow.types.is_large_list(chunk.type.value_type):
            chunk = chunk.flatten()  # lists of chunks -> chunks
        total += chunk.value_lengths().sum().as_py() or 0
    return total


def write_wikipedia_jsonl(output_dir: str, validation_articles: int = 8, min_words: int = 0) -> dict[str, Any]:
    """Write gensim's real English Wikipedia articles (:mod:`hf_efficient_attn.tasks.common.corpus`)
    as ``train.jsonl`` / ``validation.jsonl`` (``{"title", "text"}`` per line, one whole
    article each), the last ``validation_articles`` held out. Returns the counts."""
    from .corpus import wikipedia_articles

    articles = wikipedia_articles(min_words=min_words, with_titles=True)
    if not 0 < validation_articles < len(articles):
        raise ValueError(f"validation_articles must be in 1..{len(articles) - 1}, got {validation_articles}")
    os.makedirs(output_dir, exist_ok=True)
    splits = {"train": articles[:-validation_articles], "validation": articles[-validation_articles:]}
    for split, rows in splits.items():
        with open(os.path.join(output_dir, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for title, text in rows:
                f.write(json.dumps({"title": title, "text": text}) + "\n")
    return {split: len(rows) for split, rows in splits.items()}
