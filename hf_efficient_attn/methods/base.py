"""The method contract shared by every attention approximation.

A method is a small ``nn.Module`` with an options dataclass. Subclasses implement
:meth:`AttentionMethod.attend`; :meth:`AttentionMethod.forward` validates the inputs,
normalises the padding mask and makes padded query rows finite (zero).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

import torch
from torch import nn


#: Attribute of a self-attention module that holds its method (set by ``patch_model``).
METHOD_ATTRIBUTE = "efficient_attn"


@dataclass(frozen=True)
class AttentionShape:
    """What a method needs to know about the layer it is attached to."""

    num_heads: int
    head_dim: int
    max_seq_len: int
    layer_idx: int = 0


def is_tracing() -> bool:
    """True under ``torch.compile``, ``torch.export`` or ``torch.jit.trace``. Shortcuts that read a
    tensor's values on the host (``bool(mask.all())``) are skipped then, since a traced graph cannot
    branch on data; they change speed only, never results (Transformers' SDPA mask does the same)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive (or non-negative) number."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not (value >= 0 if allow_zero else value > 0):
        allowed = "a non-negative number" if allow_zero else "a positive number"
        raise ValueError(f"option {name!r} must be {allowed}, got {value!r}")


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer in [low, high] (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"option {name!r} must be {allowed}, got {value!r}")


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"option {name!r} must be one of {allowed}, got {value!r}")


@dataclass
class MethodOptions:
    """Base options dataclass, used as is by methods without options; subclasses add fields
    (paper defaults) and ``validate``, which runs on construction."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` for an option value the method cannot use."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AttentionMethod(nn.Module):
    """Base class: ``forward(q, k, v, key_padding_mask, scaling) -> out``, all (B, H, N, D).

    ``key_padding_mask`` is a bool (B, N) tensor with True for real tokens, or None.
    """

    name: ClassVar[str]
    options_cls: ClassVar[type[MethodOptions]] = MethodOptions
    #: True when the method approximates softmax attention (False for e.g. YOSO, Skyformer).
    approximates_softmax: ClassVar[bool] = True
    #: True when the method samples at random (uses :meth:`generator`).
    samples: ClassVar[bool] = False
    #: False when appending padded tokens may change real outputs (e.g. sampled or length-dependent).
    padding_invariant: ClassVar[bool] = True
    #: True when the method's parameters are sized by ``shape.max_seq_len`` (Linformer's E/F).
    length_bound: ClassVar[bool] = False

    def __init__(self, options: MethodOptions, shape: AttentionShape):
        super().__init__()
        self.options = options
        self.shape = shape

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        scaling: float | None = None,
    ) -> torch.Tensor:
        if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
            raise ValueError(
                f"{self.name}: expected self-attention q, k, v of shape (batch, heads, seq, head_dim) "
                f"with equal lengths; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}. "
                "Cross-attention is not supported."
            )
        batch, _, seq_len, head_dim = q.shape
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, seq_len):
                raise ValueError(
                    f"{self.name}: key_padding_mask must have shape (batch, seq) = {(batch, seq_len)}, "
                    f"got {tuple(key_padding_mask.shape)}"
                )
            key_padding_mask = key_padding_mask.to(device=q.device, dtype=torch.bool)
            if not is_tracing() and bool(key_padding_mask.all()):
                key_padding_mask = None
            else:  # padded tokens carry nothing into the method, not even inf or nan
                padded = ~key_padding_mask[:, None, :, None]
                q, k, v = (t.masked_fill(padded, 0.0) for t in (q, k, v))
        scaling = head_dim**-0.5 if scaling is None else scaling
        # Autocast off: methods choose their own precision (compute_dtype upcasts half inputs for
        # exponentials, sums and inverses); autocast would cast those fp32 matmuls back to half.
        with torch.autocast(q.device.type, enabled=False):
            out = self.attend(q, k, v, key_padding_mask, scaling).to(q.dtype)
        if key_padding_mask is not None:
            out = out.masked_fill(~key_padding_mask[:, None, :, None], 0.0)
        return out

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        scaling: float,
    ) -> torch.Tensor:
        """Compute attention; ``key_padding_mask`` is None when there is no padding."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """(Re)initialise the method's own parameters and buffers; called when a model is built
        by ``from_pretrained`` for those missing from the checkpoint. Methods without any keep
        this no-op; ``nn.Conv2d`` submodules are initialised by Transformers itself."""

    def share_from(self, first_layer: nn.Module) -> None:
        """Called by ``patch_model`` on every layer after the first with the first layer's
        self-attention module (its method is ``first_layer.efficient_attn``); methods that share
        state across layers (Linformer's layerwise sharing) override it. Shared state must not be
        registered as a submodule here, so that it is saved once, in the first layer."""

    def generator(self, device: torch.device) -> torch.Generator | None:
        """A generator seeded by the ``seed`` option in eval mode (reproducible inference);
        None (the global RNG, fresh samples every step) in training mode."""
        if self.training:
            return None
        gen = torch.Generator(device=device)
        gen.manual_seed(int(getattr(self.options, "seed", 0)) + 1000 * self.shape.layer_idx)
        return gen

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.to_dict().items())


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """Pad ``x`` at the end of ``dim`` so that its size is a multiple of ``multiple``."""
    remainder = (-x.shape[dim]) % multiple
    if remainder == 0:
        return x
    pad = [0, 0] * (x.dim() - dim % x.dim() - 1) + [0, remainder]
    return nn.functional.pad(x, pad, value=value)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision inputs (sums, inverses and exponentials need it), else x.dtype."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def depthwise_value_conv(num_heads: int, window: int | None) -> nn.Conv2d | None:
    """One learnable (window x 1) filter per head over the sequence of V (YOSO-C and
    Nystromformer's optional convolution, as their official code), or None for ``window``
    None / 0. Apply it with :func:`apply_value_conv`."""
    if not window:
        return None
    return nn.Conv2d(num_heads, num_heads, (window, 1), padding=(window // 2, 0), bias=False, groups=num_heads)


def apply_value_conv(conv: nn.Conv2d, v: torch.Tensor) -> torch.Tensor:
    """The convolution of ``v`` (B, H, N, D) in v's dtype; padded values are zero (the contract
    zeroes them), so they do not leak into real rows."""
    return nn.functional.conv2d(v, conv.weight.to(v.dtype), padding=conv.padding, groups=conv.groups)
