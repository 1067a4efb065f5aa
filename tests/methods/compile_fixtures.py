"""Helpers for the torch.compile / torch.export / ONNX tests of the attention methods (importable:
tests/ has no __init__.py): a tiny patched model, a padded batch, a compiled model in one graph
(a graph break raises), gradients of a training step, and an ONNX Runtime round trip. Written for
any registered method."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch._dynamo
import transformers as T
from torch import nn

import hf_efficient_attn as hea

VOCAB = 100
#: Options per method that keep the sampled / approximate path in use at the test lengths (64, 96)
#: and the traced graphs small (fewer unrolled hashes and inverse iterations); methods not named
#: use their defaults.
SMALL_OPTIONS = {
    "skeinformer": {"num_samples": 16},
    "nystromformer": {"num_landmarks": 16, "pinv_iterations": 2},
    "skyformer": {"num_landmarks": 16, "pinv_iterations": 2},
    "linformer": {"k": 16},
    "performer": {"num_features": 32},
    "yoso": {"num_hash": 2},
}


def tiny_model(method: str, arch: str = "bert", train: bool = False, max_len: int = 128, **options) -> nn.Module:
    """A 1-layer encoder (hidden 64, 2 heads, no dropout, so that training steps are deterministic)
    patched with ``method`` and ``SMALL_OPTIONS`` updated by ``options``; weights from the global RNG.
    One layer: a second runs the same modules, adding tracing time and nothing new to trace."""
    config = T.AutoConfig.for_model(
        arch,
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=max_len + 2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    options = {**SMALL_OPTIONS.get(method, {}), **options}
    return hea.AutoModel.from_config(config, attn_impl=method, attn_config=options).train(train)


def padded_batch(seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows, right-padded: full, two thirds real, and 10 real tokens. Padded positions hold
    ordinary token ids, so a model that ignores the mask sees them."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, seq_len), generator=generator)
    lengths = torch.tensor([seq_len, 2 * seq_len // 3, 10])
    mask = (torch.arange(seq_len) < lengths[:, None]).long()
    return ids, mask


def last_hidden(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


def compiled(model: nn.Module, backend: str = "aot_eager") -> nn.Module:
    """``torch.compile`` in one graph (``fullgraph``: a graph break raises). ``aot_eager`` traces
    forward and backward as Inductor does (AOTAutograd), without code generation."""
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, fullgraph=True)


def gradients(model: nn.Module, call: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients (zero where unused) of a loss on the real tokens' outputs through ``call`` (the
    model or its compiled form) with respect to every parameter of ``model``."""
    params = dict(model.named_parameters())
    loss = (last_hidden(call, ids, mask) * mask[..., None]).square().mean()
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True, materialize_grads=True)
    return dict(zip(params, grads))


class LastHidden(nn.Module):
    """``model`` returning its last hidden state only (one named output for export)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def dynamic_shapes() -> dict:
    """Batch and sequence dims of both inputs dynamic (``Dim.AUTO`` lets export narrow a range,
    e.g. to lengths past a method's exactness limit, instead of failing)."""
    dims = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    return {"input_ids": dims, "attention_mask": dims}


def onnx_round_trip(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], path: Path) -> list[float]:
    """Export ``model`` (eval) to ONNX (through ``torch.export``) with dynamic batch and length at
    ``batches[0]``, run every batch in ONNX Runtime, and return the largest difference to eager on
    the real tokens of each. Batches of other sizes and lengths show that neither dim was fixed."""
    import onnxruntime

    ids, mask = batches[0]
    program = torch.onnx.export(
        LastHidden(model),
        (),
        kwargs={"input_ids": ids, "attention_mask": mask},
        dynamic_shapes=dynamic_shapes(),
        dynamo=True,
        verbose=False,
    )
    program.save(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    differences = []
    for ids, mask in batches:
        (got,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            want = last_hidden(model, ids, mask).numpy()
        real = mask.numpy().astype(bool)
        differences.append(float(np.abs(got[real] - want[real]).max()))
    return differences
