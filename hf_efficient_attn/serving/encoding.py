"""Texts encoded by an ONNX export (:func:`encode`, ``scripts/encode_onnx.py``).

An export folder (``scripts/export_onnx.py``) holds ``model.onnx`` (and ``model_quantized.onnx``, its
int8 form, with ``--int8``), the tokenizer, config.json and, for a sentence-transformers model, its
``modules.json`` and pooling configuration. :func:`encode` tokenizes the texts with the folder's
tokenizer, runs them through ONNX Runtime in batches of similar lengths (longest first, so that a
batch pads little) and returns one row per text, in the order given:

- an encoder (output ``last_hidden_state``): the sentence embedding, pooled as the folder's
  sentence-transformers modules say (``Pooling``, then ``Normalize`` if listed), or by the mean of
  the real tokens when the folder has no ``modules.json`` (sentence-transformers' default for a
  plain Transformers model);
- a sequence classifier (output ``logits`` per sequence): the logits.

Padding changes no real output of the exported methods (fixed draws, padded keys masked), so the
batching does not change the rows.
"""

from __future__ import annotations

import csv
import importlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
#: The int8 model (dynamically quantized) beside the fp32 one; Optimum's quantizer names it so.
INT8_FILE = "model_quantized.onnx"
INSTALL_HINT = 'pip install "hf_efficient_attn[serving]"'
#: The sentence-transformers files an export carries beside the model (its pooling is recorded there).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
#: sentence-transformers' pooling modes, and the legacy keys of its Pooling config that name them.
POOLING_MODES = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
#: The field of a .jsonl / .csv texts file that holds the text, by preference.
TEXT_FIELDS = ("text", "sentence")
Forward = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def require(*packages: str) -> None:
    """``ModuleNotFoundError`` naming the ``serving`` extra when one of ``packages`` cannot be imported."""
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ModuleNotFoundError(
                f"{name} cannot be imported ({err}); ONNX export and serving need the serving extra: {INSTALL_HINT}"
            ) from err


@dataclass(frozen=True)
class Pooling:
    """How an encoder's token states become one embedding: sentence-transformers' ``Pooling`` modes
    (several are concatenated, in order) and ``Normalize``."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False

    def __call__(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, dim) embeddings of right-padded ``hidden`` (batch, seq, dim); ``mask`` 1 = real token."""
        pooled = np.concatenate([_pool(mode, hidden, mask) for mode in self.modes], axis=-1)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return pooled


def _pool(mode: str, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    real = mask[..., None].astype(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return np.where(real > 0, hidden, -np.inf).max(axis=1)
    if mode == "lasttoken":
        return hidden[np.arange(len(hidden)), mask.sum(axis=1) - 1]
    weights = real * np.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)[:, None] if mode == "weightedmean" else real
    count = np.maximum(weights.sum(axis=1), 1e-9)
    return (hidden * weights).sum(axis=1) / (np.sqrt(count) if mode == "mean_sqrt_len_tokens" else count)


def pooling_modes(config: dict) -> tuple[str, ...]:
    """The modes of a sentence-transformers Pooling config (``pooling_mode``, or the legacy
    ``pooling_mode_*`` flags; mean when none is set, as sentence-transformers reads it)."""
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
    else:
        modes = tuple(mode for mode, key in POOLING_MODES.items() if config.get(key)) or ("mean",)
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown:
        raise ValueError(f"pooling mode {unknown[0]!r} is not supported; supported: {', '.join(POOLING_MODES)}")
    return modes


def read_pooling(folder: str | Path) -> Pooling:
    """The pooling recorded in ``folder``'s ``modules.json`` (sentence-transformers), or mean pooling
    when there is none."""
    path = Path(folder) / "modules.json"
    if not path.is_file():
        return Pooling()
    modes, normalize = None, False
    for module in json.loads(path.read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            modes = pooling_modes(json.loads((Path(folder) / module["path"] / "config.json").read_text()))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(
                f"{path} lists a {module['type']} module; the ONNX encoder runs Transformer, Pooling and Normalize only"
            )
    if modes is None:
        raise ValueError(f"{path} lists no Pooling module: the folder's model gives token states, not embeddings")
    return Pooling(modes, normalize)


def output_kind(outputs: dict[str, int]) -> str:
    """``"embeddings"`` for an encoder (``last_hidden_state``), ``"logits"`` for a sequence classifier
    (``logits`` of rank 2); ``outputs``: each output's name and rank. ``ValueError`` otherwise."""
    if "last_hidden_state" in outputs:
        return "embeddings"
    if outputs.get("logits") == 2:
        return "logits"
    shown = ", ".join(f"{name} (rank {rank})" for name, rank in outputs.items())
    raise ValueError(
        f"the model's outputs are {shown}: texts are encoded by an encoder (last_hidden_state) or a sequence "
        "classifier (logits per text); export the base model or the classifier, not a token-level head"
    )


def sequence_rows(outputs: dict[str, np.ndarray], mask: np.ndarray, pooling: Pooling) -> np.ndarray:
    """One row per sequence of a batch's outputs: the pooled embedding, or the logits."""
    if output_kind({name: value.ndim for name, value in outputs.items()}) == "embeddings":
        return pooling(outputs["last_hidden_state"], mask)
    return outputs["logits"]


def length_sorted_batches(
    ids: Sequence[Sequence[int]], batch_size: int, pad_id: int
) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """Batches of ``ids``, longest first, each right-padded with ``pad_id`` to its longest row: the
    indices of its rows in ``ids``, and its ``input_ids`` / ``attention_mask``."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        input_ids = np.full((len(rows), len(ids[rows[0]])), pad_id, dtype=np.int64)
        attention_mask = np.zeros_like(input_ids)
        for row, index in enumerate(rows):
            input_ids[row, : len(ids[index])] = ids[index]
            attention_mask[row, : len(ids[index])] = 1
        yield rows, {"input_ids": input_ids, "attention_mask": attention_mask}


def run_in_batches(forward: Forward, ids: Sequence[Sequence[int]], batch_size: int, pad_id: int,
                   pooling: Pooling) -> np.ndarray:  # fmt: skip
    """``forward`` (a batch's inputs -> its named outputs) over :func:`length_sorted_batches` of
    ``ids``: one row per sequence (:func:`sequence_rows`), in the order of ``ids``."""
    rows_out: list[np.ndarray] = [np.empty(0)] * len(ids)
    for rows, feed in length_sorted_batches(ids, batch_size, pad_id):
        for index, value in zip(rows, sequence_rows(forward(feed), feed["attention_mask"], pooling)):
            rows_out[index] = value
    return np.stack(rows_out)


def available_cores() -> int:
    """The physical cores this process may use: its CPU affinity, capped by a container's CPU quota
    (cgroup v1 or v2), as joblib counts them. ONNX Runtime's own default is the host's physical
    cores, blind to the quota (microsoft/onnxruntime#29510): in a container limited to 2 CPUs on a
    large host its threads would queue for the quota and wait on each other."""
    import joblib

    return joblib.cpu_count(only_physical_cores=True)


def open_session(path: str | Path, threads: int | None = None):
    """An ONNX Runtime session (CPU provider) of ``path`` with ``threads`` intra-op threads
    (default: :func:`available_cores`)."""
    require("onnxruntime")
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = available_cores() if threads is None else threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def session_forward(session) -> Forward:
    """A batch's inputs -> the session's named outputs."""
    names = [output.name for output in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(None, feed)))


def recorded_max_length(folder: str | Path) -> int | None:
    """sentence-transformers' ``max_seq_length`` (tokens kept per text) if the folder records one."""
    path = Path(folder) / "sentence_bert_config.json"
    return json.loads(path.read_text()).get("max_seq_length") if path.is_file() else None


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Each text's token ids (special tokens added), truncated to ``max_length``."""
    return tokenize_counting_truncated(tokenizer, texts, max_length)[0]


def tokenize_counting_truncated(tokenizer, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], int]:
    """:func:`tokenize`, and how many texts it truncated (read from the fast tokenizer's overflow)."""
    if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
        raise ValueError("texts must be a list of strings")
    if not texts:
        raise ValueError("no texts to encode")
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    return encoded["input_ids"], sum(bool(encoding.overflowing) for encoding in encoded.encodings)


def read_texts(path: str | Path) -> list[str]:
    """The texts of a file: ``.txt``, one per line (empty lines skipped); ``.jsonl`` or ``.csv``, the
    ``text`` (else ``sentence``) field of each row."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"texts file {path}: no such file")
    if path.suffix == ".txt":
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    elif path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    else:
        raise ValueError(f"texts file {path}: give a .txt (one text per line), .jsonl or .csv file")
    found = next((name for name in TEXT_FIELDS if rows and name in rows[0]), None)
    if found is None:
        fields = sorted(rows[0]) if rows else []
        raise ValueError(f"texts file {path} has no {' or '.join(TEXT_FIELDS)} field (its fields: {fields})")
    return [row[found] for row in rows]


def encode(
    export_dir: str | Path,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
    int8: bool = False,
    threads: int | None = None,
) -> np.ndarray:
    """Encode ``texts`` with the ONNX export in ``export_dir`` (``scripts/export_onnx.py``): one row per
    text, in order, a float32 array of (len(texts), dim): the embedding of an encoder, pooled as the
    folder records (mean pooling without a sentence-transformers ``modules.json``), or the logits of
    a sequence classifier.

    ``batch_size`` texts run per ONNX Runtime call, in batches of similar lengths; each text is
    truncated to ``max_length`` tokens (default: sentence-transformers' ``max_seq_length`` if the
    folder records one, else the model's position table), and a warning counts the texts that
    were; ``int8`` runs ``model_quantized.onnx``
    (``export_onnx.py --int8``) instead of ``model.onnx``; ``threads`` sets ONNX Runtime's intra-op
    threads."""
    from transformers import AutoConfig, AutoTokenizer

    from ..integration.positions import max_tokens

    folder = Path(export_dir)
    path = folder / (INT8_FILE if int8 else ONNX_FILE)
    if not path.is_file():
        hint = "export with --int8 to write it" if int8 else "write it with scripts/export_onnx.py"
        raise ValueError(f"{folder} holds no {path.name} ({hint})")
    for name, value in (("batch_size", batch_size), ("max_length", max_length), ("threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    limit = max_tokens(AutoConfig.from_pretrained(folder))
    max_length = max_length or recorded_max_length(folder) or limit
    if max_length > limit:
        raise ValueError(f"max_length {max_length} exceeds the model's position table ({limit} tokens)")
    session = open_session(path, threads)
    output_kind({output.name: len(output.shape) for output in session.get_outputs()})
    pooling = read_pooling(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids, truncated = tokenize_counting_truncated(tokenizer, texts, max_length)
    if truncated:
        room = f"the model reads up to {limit}: a larger max_length keeps more" if max_length < limit else "the model's limit"
        logger.warning(f"{truncated} of {len(texts)} texts were longer than max_length={max_length} tokens, truncated ({room})")
    return run_in_batches(session_forward(session), ids, batch_size, tokenizer.pad_token_id or 0, pooling)
