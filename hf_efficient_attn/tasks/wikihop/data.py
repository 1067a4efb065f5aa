"""WikiHop data for the candidate-scoring model (:mod:`hf_efficient_attn.tasks.wikihop.heads`):
qangaroo files or a Hub dataset in, chunked token ids out, and the collator that batches them.

An example becomes the Longformer input (Beltagy et al. 2020, section 6 and its appendix): the
question and the candidates, each wrapped in new special tokens (``[question] query [/question]
[ent] candidate [/ent] ...``), as the first segment, then the supporting documents, separated by
the separator token, as the second segment of the tokenizer's own pair format (``[CLS] A [SEP] B
[SEP]`` for BERT, ``<s> A </s></s> B </s>`` for RoBERTa). When the documents do not fit in ``max_length``
tokens they are cut into consecutive slices, and each slice gets its own chunk with the whole
first segment, so every chunk scores every candidate.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..common.packing import SequenceLabelFlattening

if TYPE_CHECKING:  # datasets is imported where it is used: scripts answer --help and flag errors without it
    from datasets import DatasetDict

#: The question and candidate markers (the names of the Longformer WikiHop code).
QUESTION_START, QUESTION_END, CANDIDATE_START, CANDIDATE_END = "[question]", "[/question]", "[ent]", "[/ent]"
MARKERS = (QUESTION_START, QUESTION_END, CANDIDATE_START, CANDIDATE_END)
#: The fields of the original qangaroo JSON that are used.
QANGAROO_COLUMNS = ("id", "query", "answer", "candidates", "supports")


def load_qangaroo(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    cache_dir: str | None = None,
    token: str | None = None,
) -> DatasetDict:
    """``train`` / ``validation`` splits of qangaroo-format data: a Hub dataset (e.g.
    ``community-datasets/qangaroo``, config ``wikihop``) or the original JSON files (``train.json``,
    ``dev.json``: one JSON array each; JSON lines work too). Each file is read on its own, since the
    original development file has an ``annotations`` field that the training file lacks; only
    :data:`QANGAROO_COLUMNS` are kept. ``ValueError`` naming the missing fields."""
    import pyarrow.compute
    from datasets import DatasetDict, load_dataset

    if dataset_name is not None:
        raw = load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir, token=token)
    else:
        files = {"train": train_file, "validation": validation_file}
        raw = DatasetDict(
            {
                split: load_dataset("json", data_files=path, split="train", cache_dir=cache_dir)
                for split, path in files.items()
                if path is not None
            }
        )
    for split, rows in raw.items():
        missing = [c for c in QANGAROO_COLUMNS if c not in rows.column_names]
        if missing:
            raise ValueError(
                f"the {split} data is not in the qangaroo (WikiHop) format: it lacks {missing}; "
                f"each example needs {list(QANGAROO_COLUMNS)}, it has {rows.column_names}"
            )
        if len(rows) == 0:
            raise ValueError(f"the {split} split is empty")
        supports = rows.data.column("supports")  # Arrow: the document counts without reading the texts
        empty = pyarrow.compute.equal(pyarrow.compute.list_value_length(supports), 0)
        if pyarrow.compute.any(empty).as_py():
            example_id = rows[pyarrow.compute.index(empty, True).as_py()]["id"]
            raise ValueError(
                f"the {split} data's example {example_id!r} has no supporting documents ('supports' is empty); "
                "every WikiHop example needs at least one"
            )
    return DatasetDict({split: rows.select_columns(list(QANGAROO_COLUMNS)) for split, rows in raw.items()})


def add_markers(tokenizer: PreTrainedTokenizerBase) -> int:
    """Add :data:`MARKERS` to ``tokenizer`` as special tokens (never split, kept by
    ``save_pretrained``); returns how many were new."""
    return tokenizer.add_special_tokens({"extra_special_tokens": list(MARKERS)}, replace_extra_special_tokens=False)


def fit_embeddings_to(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """Grow the input embeddings to the tokenizer's vocabulary; the new rows (the markers) start at
    the mean of the existing embeddings (Transformers' ``mean_resizing``: drawn around the mean with
    1e-9 times their covariance). Returns the number of rows added. (A table that already has room
    for the markers, e.g. a vocabulary padded to a multiple of 8, keeps its spare rows for them.)"""
    old = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > old:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return max(len(tokenizer) - old, 0)


@dataclass
class PairTemplate:
    """The tokenizer's special tokens around the two segments of a pair: ``head + A + middle + B + tail``
    (with token type ids), read from the tokenizer's own output for a two-marker pair."""

    head: list[int]
    middle: list[int]
    tail: list[int]
    types: tuple[list[int], int, list[int], int, list[int]] | None  # head, A, middle, B, tail; None: no types

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> PairTemplate:
        encoded = tokenizer(CANDIDATE_START, CANDIDATE_END)
        ids = encoded["input_ids"]
        a, b = (ids.index(tokenizer.convert_tokens_to_ids(marker)) for marker in (CANDIDATE_START, CANDIDATE_END))
        types = encoded.get("token_type_ids")
        return cls(
            head=ids[:a],
            middle=ids[a + 1 : b],
            tail=ids[b + 1 :],
            types=None if types is None else (types[:a], types[a], types[a + 1 : b], types[b], types[b + 1 :]),
        )

    @property
    def size(self) -> int:
        return len(self.head) + len(self.middle) + len(self.tail)

    def join(self, first: list[int], second: list[int]) -> tuple[list[int], list[int] | None]:
        ids = self.head + first + self.middle + second + self.tail
        if self.types is None:
            return ids, None
        head, a, middle, b, tail = self.types
        return ids, head + [a] * len(first) + middle + [b] * len(second) + tail


@dataclass
class ChunkEncoder:
    """``datasets.map(batched=True)`` function: qangaroo examples in, per example ``input_ids``
    (and ``token_type_ids`` when the tokenizer has them) as a list of chunks of at most
    ``max_length`` tokens, ``candidate_positions`` (the index of each candidate's ``[ent]``, the
    same in every chunk) and ``labels`` (the answer's index among the candidates).

    ``max_chunks`` keeps only the first chunks of long examples (default: all). The tokenizer must
    hold :data:`MARKERS` (:func:`add_markers`); marker strings inside the texts are tokenised as
    plain text, so the markers come only from here.
    """

    tokenizer: PreTrainedTokenizerBase
    max_length: int
    max_chunks: int | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in MARKERS if m not in self.tokenizer.get_vocab()]
        if unknown:
            raise ValueError(f"the tokenizer lacks the markers {unknown}: call add_markers(tokenizer) first")
        self.template = PairTemplate.of(self.tokenizer)
        self.marker_ids = dict(zip(MARKERS, self.tokenizer.convert_tokens_to_ids(list(MARKERS))))
        self.separator = [self.tokenizer.sep_token_id] if self.tokenizer.sep_token_id is not None else []

    def _tokens(self, texts: list[str]) -> list[list[int]]:
        # A leading space gives byte-level BPE (RoBERTa) the word-initial tokens that the texts have
        # mid-sentence (Longformer's add_prefix_space); WordPiece and SentencePiece ignore it.
        return self.tokenizer([" " + text for text in texts], add_special_tokens=False, split_special_tokens=True, verbose=False)[
            "input_ids"
        ]

    def first_segment(self, query: list[int], candidates: list[list[int]]) -> list[int]:
        """``[question] query [/question] [ent] candidate 1 [/ent] [ent] candidate 2 [/ent] ...``"""
        m = self.marker_ids
        segment = [m[QUESTION_START], *query, m[QUESTION_END]]
        for candidate in candidates:
            segment += [m[CANDIDATE_START], *candidate, m[CANDIDATE_END]]
        return segment

    def documents(self, supports: list[list[int]]) -> list[int]:
        """The supporting documents in order, separated by the separator token."""
        stream: list[int] = []
        for i, document in enumerate(supports):
            stream += (self.separator if i else []) + document
        return stream

    def encode(self, example_id: str, query: str, candidates: list[str], supports: list[str]) -> dict[str, Any]:
        tokens = self._tokens([query, *candidates, *supports])
        first = self.first_segment(tokens[0], tokens[1 : 1 + len(candidates)])
        stream = self.documents(tokens[1 + len(candidates) :])
        room = self.max_length - self.template.size - len(first)
        if room < 1:
            raise ValueError(
                f"example {example_id!r}: its question and {len(candidates)} candidates take {len(first)} tokens, "
                f"which with {self.template.size} special tokens leave no room for the documents in "
                f"--max_seq_length {self.max_length}; raise --max_seq_length"
            )
        slices = [stream[start : start + room] for start in range(0, max(len(stream), 1), room)]
        chunks = [self.template.join(first, part) for part in slices[: self.max_chunks]]
        start = self.marker_ids[CANDIDATE_START]
        encoded = {
            "input_ids": [ids for ids, _ in chunks],
            "candidate_positions": [len(self.template.head) + i for i, t in enumerate(first) if t == start],
        }
        if self.template.types is not None:
            encoded["token_type_ids"] = [types for _, types in chunks]
        return encoded

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {}
        rows = zip(batch["id"], batch["query"], batch["candidates"], batch["supports"], batch["answer"])
        for example_id, query, candidates, supports, answer in rows:
            if answer not in candidates:
                raise ValueError(f"example {example_id!r}: the answer {answer!r} is not among its candidates")
            encoded = self.encode(example_id, query, candidates, supports)
            encoded["labels"] = candidates.index(answer)
            for key, value in encoded.items():
                out.setdefault(key, []).append(value)
        return out


def encode_splits(
    raw: DatasetDict,
    encoder: ChunkEncoder,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    main_process_first: contextlib.AbstractContextManager | None = None,
) -> DatasetDict:
    """Every split through ``encoder`` (the raw columns are dropped)."""
    with main_process_first or contextlib.nullcontext():
        return type(raw)(  # a DatasetDict
            {
                split: rows.map(
                    encoder,
                    batched=True,
                    num_proc=num_proc,
                    remove_columns=rows.column_names,
                    load_from_cache_file=load_from_cache_file,
                    desc=f"Tokenising and chunking the {split} examples",
                )
                for split, rows in raw.items()
            }
        )


def candidate_fields(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """``candidate_positions`` and ``candidate_mask`` (batch, candidates), padded to the most
    candidates of the batch, and ``labels`` (batch,) when the features have them."""
    candidates = max(len(f["candidate_positions"]) for f in features)
    out = {
        "candidate_positions": torch.zeros(len(features), candidates, dtype=torch.long),
        "candidate_mask": torch.zeros(len(features), candidates, dtype=torch.bool),
    }
    for i, feature in enumerate(features):
        positions = feature["candidate_positions"]
        out["candidate_positions"][i, : len(positions)] = torch.as_tensor(positions)
        out["candidate_mask"][i, : len(positions)] = True
    if "labels" in features[0]:
        out["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    return out


@dataclass
class ChunkCollator:
    """Batches :class:`ChunkEncoder` examples into the model's inputs: ``input_ids``,
    ``attention_mask`` (and ``token_type_ids``) of shape (batch, chunks, length), padded on the
    right with ``pad_token_id`` to the longest chunk (or to ``pad_to_length``); ``chunk_mask``
    (batch, chunks); ``candidate_positions`` and ``candidate_mask`` (batch, candidates); ``labels``."""

    pad_token_id: int
    pad_to_length: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = len(features)
        chunks = max(len(f["input_ids"]) for f in features)
        length = self.pad_to_length or max(len(c) for f in features for c in f["input_ids"])
        with_types = "token_type_ids" in features[0]
        out = {
            "input_ids": torch.full((batch, chunks, length), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros(batch, chunks, length, dtype=torch.long),
            "chunk_mask": torch.zeros(batch, chunks, dtype=torch.bool),
        }
        if with_types:
            out["token_type_ids"] = torch.zeros(batch, chunks, length, dtype=torch.long)
        for i, feature in enumerate(features):
            for j, ids in enumerate(feature["input_ids"]):
                out["input_ids"][i, j, : len(ids)] = torch.as_tensor(ids)
                out["attention_mask"][i, j, : len(ids)] = 1
                if with_types:
                    out["token_type_ids"][i, j, : len(ids)] = torch.as_tensor(feature["token_type_ids"][j])
            out["chunk_mask"][i, : len(feature["input_ids"])] = True
        return {**out, **candidate_fields(features)}


class PackedChunkCollator:
    """``--padding_free``: the chunks of every example of the batch one after another in one row,
    without padding (:class:`~hf_efficient_attn.tasks.common.packing.SequenceLabelFlattening`: ``input_ids``
    and ``token_type_ids`` of shape (1, tokens), ``position_ids`` restarting at every chunk,
    ``cu_seq_lens_q`` / ``max_length_q`` and their ``_k`` twins), ``example_of_chunk`` (chunks,), the
    example each chunk belongs to, and the candidate fields of :class:`ChunkCollator`."""

    def __init__(self) -> None:
        self.flatten = SequenceLabelFlattening()

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        with_types = "token_type_ids" in features[0]
        chunks = [
            {"input_ids": ids, **({"token_type_ids": feature["token_type_ids"][j]} if with_types else {})}
            for feature in features
            for j, ids in enumerate(feature["input_ids"])
        ]
        out = self.flatten(chunks)
        out["example_of_chunk"] = torch.tensor([i for i, f in enumerate(features) for _ in f["input_ids"]])
        return {**out, **candidate_fields(features)}
