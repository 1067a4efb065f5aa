"""A variant exported to ONNX for serving (``scripts/export_onnx.py``), and checked with ONNX Runtime.

The model is exported by ``torch.onnx.export(..., dynamo=True)`` (through ``torch.export``) with
dynamic batch and sequence dimensions, in eval mode: every method runs as plain tensor operations
there (sampling methods with their fixed, seeded eval-mode draws). Beside ``model.onnx`` the folder
holds the tokenizer, config.json and a sentence-transformers model's pooling record (``modules.json``),
as Optimum's exporters lay them out. The export is then validated: ONNX Runtime must reproduce eager
PyTorch on a padded batch at the export length and at another length (real tokens only: padded
positions carry no meaning), and on given texts (each text's embedding or logits, as
:func:`.encoding.encode` computes them). With ``int8``, ``model_quantized.onnx`` (ONNX Runtime's dynamic
int8 quantization of the matrix products' weights) is written beside it and measured the same
way; int8 rounding is lossy, so its numbers are reported, not required.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel

from ..hub.remote_code import auto_class_for
from ..integration.positions import max_tokens
from .encoding import (
    INT8_FILE,
    ONNX_FILE,
    SENTENCE_TRANSFORMERS_FILES,
    Forward,
    encode,
    open_session,
    output_kind,
    read_pooling,
    require,
    run_in_batches,
    tokenize,
)

#: What may be exported of a folder besides its own head (None): its encoder alone, as Optimum names it.
TASKS = (None, "feature-extraction")
#: Largest difference allowed between ONNX Runtime and eager PyTorch (fp32).
TOLERANCE = 1e-4


@dataclass
class Validation:
    """ONNX Runtime against eager PyTorch on one padded batch."""

    seq_len: int
    max_abs_diff: dict[str, float]  # per output, over real tokens
    file: str = ONNX_FILE

    @property
    def passed(self) -> bool:
        return all(diff <= TOLERANCE for diff in self.max_abs_diff.values())


@dataclass
class TextValidation:
    """ONNX Runtime against eager PyTorch on texts: each text's row as :func:`.encoding.encode` gives it
    (an encoder's pooled embedding: its cosine similarity; a classifier's logits: the same label?)."""

    file: str
    texts: int
    max_length: int
    max_abs_diff: float
    min_cosine: float | None = None  # an encoder, over the texts
    mean_cosine: float | None = None
    agreement: float | None = None  # a classifier: the share of texts given the same label

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= TOLERANCE


def check_task(task: str | None) -> None:
    """``ValueError`` naming the allowed values unless ``task`` is one of :data:`TASKS`."""
    if task not in TASKS:
        raise ValueError(f"--task {task}: allowed: {', '.join(t for t in TASKS if t)} (default: the folder's own head)")


def load_for_export(model_dir: str, task: str | None = None) -> PreTrainedModel:
    """The model of ``model_dir`` (a saved variant or a plain checkpoint) through the Transformers auto
    class of its head, which builds a saved variant as its method (``import hf_efficient_attn``), in eval
    mode; ``task="feature-extraction"``: its encoder alone (``AutoModel``, whatever head it was saved with)."""
    import transformers

    check_task(task)
    if not Path(model_dir).is_dir():
        raise ValueError(f"--model_dir {model_dir}: no such folder")
    config = AutoConfig.from_pretrained(model_dir)
    auto_class = "AutoModel" if task else auto_class_for(config.model_type, config.architectures or [])
    return getattr(transformers, auto_class).from_pretrained(model_dir).eval()


def padded_batch(model: PreTrainedModel, seq_len: int, batch: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special tokens, the last row (of two or more) ending in a quarter of padding."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, model.config.vocab_size, (batch, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, seq_len - seq_len // 4 :] = 0
        input_ids[-1, seq_len - seq_len // 4 :] = model.config.pad_token_id or 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def output_names(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> list[str]:
    """The names of the tensors the model returns (``last_hidden_state``, ``logits``, ...), in order."""
    with torch.no_grad():
        return [name for name, value in model(**inputs).items() if isinstance(value, torch.Tensor)]


def export_onnx(model: PreTrainedModel, path: str | Path, seq_len: int, opset: int | None = None) -> list[str]:
    """Export ``model`` (eval mode) to ONNX at ``path`` with dynamic batch and sequence dimensions;
    returns its output names."""
    inputs = padded_batch(model, seq_len)
    names = output_names(model, inputs)
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("sequence", min=2, max=max_tokens(model.config))
    dynamic = {name: {0: batch, 1: seq} for name in inputs}
    with warnings.catch_warnings():
        # torch.onnx's own notes (axis renaming, pytree deprecations): nothing a user can act on
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        torch.onnx.export(
            model,
            (),
            str(path),
            kwargs=inputs,
            input_names=list(inputs),
            output_names=names,
            dynamic_shapes=dynamic,
            dynamo=True,
            opset_version=opset,
            verbose=False,
        )
    return names


def validate(model: PreTrainedModel, path: str | Path, seq_len: int, seed: int = 1) -> Validation:
    """Compare ONNX Runtime with eager PyTorch on :func:`padded_batch` of ``seq_len`` tokens: per
    output, the largest absolute difference over the real tokens."""
    inputs = padded_batch(model, seq_len, seed=seed)
    session = open_session(path)
    served = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
    with torch.no_grad():
        expected = [value for value in model(**inputs).values() if isinstance(value, torch.Tensor)]
    real = inputs["attention_mask"].bool()
    diffs = {}
    for meta, mine, reference in zip(session.get_outputs(), served, expected):
        diff = (torch.from_numpy(mine) - reference).abs()
        if diff.dim() >= 2 and diff.shape[:2] == real.shape:  # per-token output: real tokens only
            diff = diff[real]
        diffs[meta.name] = float(diff.max())
    return Validation(seq_len, diffs, Path(path).name)


def quantize_int8(path: str | Path, output: str | Path) -> None:
    """Write ``output``: ``path`` with its matrix-product weights quantized to int8, one scale per
    output column, and activations quantized at run time (``onnxruntime.quantization.quantize_dynamic``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic advises its shape-inference pre-pass, which fails on the symbolic sequence
    # dimension of these graphs; the quantization itself does not need it.
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        # per_channel: with one scale per matrix, the few large columns of these encoders' weights set
        # it and leave the other columns a handful of levels. reduce_range (7-bit weights): x86 CPUs
        # without VNNI multiply uint8 inputs by int8 weights in pairs summed into int16, which
        # saturates with full-range weights (quantize_static's "Choosing parameters for CPU inference"
        # in onnxruntime.quantization.quantize); an export may be served on any CPU.
        quantize_dynamic(str(path), str(output), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    finally:
        logger.setLevel(level)


def eager_forward(model: PreTrainedModel) -> Forward:
    """A batch's inputs (NumPy) -> the eager model's named outputs (NumPy), as a session gives them."""

    def forward(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            outputs = model(**{name: torch.from_numpy(value) for name, value in feed.items()})
        return {name: value.numpy() for name, value in outputs.items() if isinstance(value, torch.Tensor)}

    return forward


def eager_kind(model: PreTrainedModel) -> str:
    """What texts give through ``model`` (:func:`.encoding.output_kind`); ``ValueError`` for a token-level head."""
    outputs = eager_forward(model)({name: t.numpy() for name, t in padded_batch(model, 4, batch=1).items()})
    return output_kind({name: value.ndim for name, value in outputs.items()})


def validate_texts(
    model: PreTrainedModel, export_dir: str | Path, texts: Sequence[str], max_length: int, file: str = ONNX_FILE
) -> TextValidation:
    """Each text's row (:func:`.encoding.encode`, one text per run) from ``file`` in ``export_dir``
    against eager PyTorch's, computed from the same tokens with the same pooling."""
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    ids = tokenize(tokenizer, texts, max_length)
    expected = torch.from_numpy(
        run_in_batches(eager_forward(model), ids, 1, tokenizer.pad_token_id or 0, read_pooling(export_dir))
    ).double()
    served = torch.from_numpy(encode(export_dir, texts, batch_size=1, max_length=max_length,
                                     int8=file == INT8_FILE)).double()  # fmt: skip
    check = TextValidation(file, len(texts), max_length, float((served - expected).abs().max()))
    if eager_kind(model) == "logits":
        check.agreement = float((served.argmax(-1) == expected.argmax(-1)).double().mean())
    else:
        cosine = torch.cosine_similarity(served, expected, dim=-1)
        check.min_cosine, check.mean_cosine = float(cosine.min()), float(cosine.mean())
    return check


def copy_sentence_transformers_files(model_dir: str | Path, output_dir: Path) -> None:
    """Copy a sentence-transformers model's ``modules.json``, its settings and the folders of its
    modules after the Transformer (Pooling's config.json, ...) into ``output_dir``."""
    model_dir = Path(model_dir)
    for name in SENTENCE_TRANSFORMERS_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, output_dir / name)
    if (model_dir / "modules.json").is_file():
        for module in json.loads((model_dir / "modules.json").read_text()):
            if module["path"] and (model_dir / module["path"]).is_dir():
                shutil.copytree(model_dir / module["path"], output_dir / module["path"])


def export_folder(
    model_dir: str,
    output_dir: str | Path,
    seq_len: int = 128,
    check_lengths: list[int] | None = None,
    opset: int | None = None,
    int8: bool = False,
    texts: Sequence[str] | None = None,
    text_length: int | None = None,
    task: str | None = None,
) -> list[Validation | TextValidation]:
    """Write ``model.onnx``, the tokenizer and config.json of ``model_dir`` (and a sentence-transformers
    model's pooling files) into ``output_dir`` (new or empty), then validate with ONNX Runtime at
    ``seq_len`` and at each of ``check_lengths`` (default: one other length), and on ``texts`` (each
    truncated to ``text_length`` tokens, default the model's position table): ``ValueError`` when a
    check fails. ``int8``: also write ``model_quantized.onnx`` and measure it the same way. ``task``:
    see :func:`load_for_export`. Returns the checks; a failed export leaves ``output_dir`` as it was
    (removed if this call made it)."""
    require("onnx", "onnxscript", "onnxruntime")
    model = load_for_export(model_dir, task)
    limit = max_tokens(model.config)
    longer = seq_len + seq_len // 2 + 1
    check_lengths = check_lengths or [longer if longer <= limit else seq_len // 2 + 1]
    text_length = text_length or limit
    for name, length in [("--export_length", seq_len), ("--validation_length", text_length)] + [
        ("--check_lengths", n) for n in check_lengths
    ]:
        if not 2 <= length <= limit:
            raise ValueError(f"{name} {length}: must lie in [2, {limit}] (the model's position table)")
    if texts:  # before the export: texts need an encoder or a classifier, and a pooling this package runs
        eager_kind(model)
        read_pooling(model_dir)
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(f"--output_dir {output_dir} is not empty; give a new or empty folder")
    made = next((folder for folder in [*reversed(output_dir.parents), output_dir] if not folder.exists()), None)
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _export_and_check(model, model_dir, output_dir, seq_len, check_lengths, opset, int8, texts, text_length)
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        else:  # the folder was empty
            for path in output_dir.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        raise


def _export_and_check(
    model: PreTrainedModel,
    model_dir: str,
    output_dir: Path,
    seq_len: int,
    check_lengths: list[int],
    opset: int | None,
    int8: bool,
    texts: Sequence[str] | None,
    text_length: int,
) -> list[Validation | TextValidation]:
    export_onnx(model, output_dir / ONNX_FILE, seq_len, opset)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(output_dir)
    model.config.save_pretrained(output_dir)
    copy_sentence_transformers_files(model_dir, output_dir)
    files = [ONNX_FILE]
    if int8:
        quantize_int8(output_dir / ONNX_FILE, output_dir / INT8_FILE)
        files.append(INT8_FILE)
    checks: list[Validation | TextValidation] = [
        validate(model, output_dir / file, n, seed=i) for file in files for i, n in enumerate([seq_len, *check_lengths])
    ]
    if texts:
        checks += [validate_texts(model, output_dir, texts, text_length, file) for file in files]
    (output_dir / "onnx_validation.json").write_text(json.dumps([asdict(c) for c in checks], indent=1))
    failed = [c for c in checks if c.file == ONNX_FILE and not c.passed]
    if failed:
        raise ValueError(
            f"ONNX Runtime differs from PyTorch beyond {TOLERANCE}: " + "; ".join(f"{_what(c)}: {c.max_abs_diff}" for c in failed)
        )
    return checks


def _what(check: Validation | TextValidation) -> str:
    if isinstance(check, Validation):
        return f"padded batch of {check.seq_len} tokens"
    return f"{check.texts} texts of up to {check.max_length} tokens"


def describe(checks: list[Validation | TextValidation], output_dir: Path) -> str:
    files = sorted({check.file for check in checks}, key=[ONNX_FILE, INT8_FILE].index)
    lines = [f"wrote {', '.join(str(output_dir / file) for file in files)} (+ tokenizer, config.json)"]
    for check in checks:
        name = "int8" if check.file == INT8_FILE else "fp32"
        worst = max(check.max_abs_diff.values()) if isinstance(check, Validation) else check.max_abs_diff
        line = f"{name} ONNX Runtime vs PyTorch, {_what(check)}: max |diff| {worst:.1e}"
        if isinstance(check, TextValidation) and check.agreement is not None:
            line += f", same label for {check.agreement:.1%}"
        elif isinstance(check, TextValidation):
            line += f", embedding cosine min {check.min_cosine:.4f} mean {check.mean_cosine:.4f}"
        lines.append(line + (" (ok)" if check.file == ONNX_FILE else ""))
    return "\n".join(lines)
