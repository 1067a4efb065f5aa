"""A variant exported to ONNX for serving (``scripts/export_onnx.py``), and checked with ONNX Runtime.

The model is exported by ``torch.onnx.export(..., dynamo=True)`` (through ``torch.export``) with
dynamic batch and sequence dimensions, in eval mode: every method runs as plain tensor operations
there (sampling methods with their fixed, seeded eval-mode draws). Beside ``model.onnx`` the folder
holds the tokenizer and config.json, as Optimum's exporters write them. The export is then
validated: ONNX Runtime must reproduce eager PyTorch on a padded batch at the export length and at
another length (real tokens only: padded positions carry no meaning).
"""

from __future__ import annotations

import importlib
import json
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel

from ..hub.remote_code import auto_class_for
from ..integration.positions import max_tokens

ONNX_FILE = "model.onnx"
INSTALL_HINT = 'pip install "hf_efficient_attn[serving]"'
#: Largest difference allowed between ONNX Runtime and eager PyTorch (fp32).
TOLERANCE = 1e-4


@dataclass
class Validation:
    """ONNX Runtime against eager PyTorch on one padded batch."""

    seq_len: int
    max_abs_diff: dict[str, float]  # per output, over real tokens

    @property
    def passed(self) -> bool:
        return all(diff <= TOLERANCE for diff in self.max_abs_diff.values())


def require(*packages: str) -> None:
    """``ModuleNotFoundError`` naming the ``serving`` extra when one of ``packages`` cannot be imported."""
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ModuleNotFoundError(
                f"{name} cannot be imported ({err}); ONNX export and serving need the serving extra: {INSTALL_HINT}"
            ) from err


def load_for_export(model_dir: str) -> PreTrainedModel:
    """The model of ``model_dir`` (a saved variant or a plain checkpoint) through the Transformers auto
    class of its head, which builds a saved variant as its method (``import hf_efficient_attn``), in eval mode."""
    import transformers

    if not Path(model_dir).is_dir():
        raise ValueError(f"--model_dir {model_dir}: no such folder")
    config = AutoConfig.from_pretrained(model_dir)
    auto_class = auto_class_for(config.model_type, config.architectures or [])
    return getattr(transformers, auto_class).from_pretrained(model_dir).eval()


def padded_batch(model: PreTrainedModel, seq_len: int, batch: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special tokens, the last row (of two or more) ending in a quarter of padding."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, model.config.vocab_size, (batch, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, seq_len - seq_len // 4:] = 0
        input_ids[-1, seq_len - seq_len // 4:] = model.config.pad_token_id or 0
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
            model, (), str(path), kwargs=inputs, input_names=list(inputs), output_names=names,
            dynamic_shapes=dynamic, dynamo=True, opset_version=opset, verbose=False,
        )
    return names


def validate(model: PreTrainedModel, path: str | Path, seq_len: int, seed: int = 1) -> Validation:
    """Compare ONNX Runtime with eager PyTorch on :func:`padded_batch` of ``seq_len`` tokens: per
    output, the largest absolute difference over the real tokens."""
    import onnxruntime

    inputs = padded_batch(model, seq_len, seed=seed)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
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
    return Validation(seq_len, diffs)


def export_folder(
    model_dir: str, output_dir: str | Path, seq_len: int = 128, check_lengths: list[int] | None = None,
    opset: int | None = None,
) -> list[Validation]:
    """Write ``model.onnx``, the tokenizer and config.json of ``model_dir`` into ``output_dir`` (new or
    empty), then validate with ONNX Runtime at ``seq_len`` and at each of ``check_lengths`` (default:
    one other length); ``ValueError`` when a check fails. Returns the checks; a failed export leaves
    ``output_dir`` as it was (removed if this call made it)."""
    require("onnx", "onnxscript", "onnxruntime")
    model = load_for_export(model_dir)
    limit = max_tokens(model.config)
    longer = seq_len + seq_len // 2 + 1
    check_lengths = check_lengths or [longer if longer <= limit else seq_len // 2 + 1]
    for name, length in [("--export_length", seq_len)] + [("--check_lengths", n) for n in check_lengths]:
        if not 2 <= length <= limit:
            raise ValueError(f"{name} {length}: must lie in [2, {limit}] (the model's position table)")
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(f"--output_dir {output_dir} is not empty; give a new or empty folder")
    made = next((folder for folder in [*reversed(output_dir.parents), output_dir] if not folder.exists()), None)
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _export_and_check(model, model_dir, output_dir, seq_len, check_lengths, opset)
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        else:  # the folder was empty
            for path in output_dir.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        raise


def _export_and_check(
    model: PreTrainedModel, model_dir: str, output_dir: Path, seq_len: int, check_lengths: list[int], opset: int | None
) -> list[Validation]:
    export_onnx(model, output_dir / ONNX_FILE, seq_len, opset)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(output_dir)
    model.config.save_pretrained(output_dir)
    checks = [validate(model, output_dir / ONNX_FILE, n, seed=i) for i, n in enumerate([seq_len, *check_lengths])]
    (output_dir / "onnx_validation.json").write_text(json.dumps([asdict(c) for c in checks], indent=1))
    failed = [c for c in checks if not c.passed]
    if failed:
        raise ValueError(
            f"ONNX Runtime differs from PyTorch beyond {TOLERANCE}: "
            + "; ".join(f"{c.seq_len} tokens: {c.max_abs_diff}" for c in failed)
        )
    return checks


def describe(checks: list[Validation], output_dir: Path) -> str:
    lines = [f"wrote {output_dir / ONNX_FILE} (+ tokenizer, config.json)"]
    for check in checks:
        worst = max(check.max_abs_diff.values())
        lines.append(f"ONNX Runtime vs PyTorch, padded batch of {check.seq_len} tokens: max |diff| {worst:.1e} (ok)")
    return "\n".join(lines)

