"""The method contract shared by every attention approximation.

A method is a small ``nn.Module`` with an options dataclass. Subclasses implement
:meth:`AttentionMethod.attend`; :meth:`AttentionMethod.forward` validates the inputs,
normalises the padding mask and makes padded query rows finite (zero).

Sampling methods draw their randomness as integers in [0, 2**RANDOM_BITS) (:func:`random_bits`):
in eval mode from fixed buffers drawn once per layer (:meth:`AttentionMethod.seeded_draws`), in
training mode fresh from the global RNG. Integers are exact in every dtype and device, so a
model's eval output does not depend on where it runs or on ``model.half()``, and its traced
forward holds no ``torch.Generator``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

import torch
from torch import nn

#: Attribute of a self-attention module that holds its method (set by ``patch_model``).
METHOD_ATTRIBUTE = "efficient_attn"
#: Random draws are integers in [0, 2**RANDOM_BITS): uniforms (bits + 1/2) / 2**RANDOM_BITS are exact
#: in float32, and 24 bits is the resolution of ``torch.rand`` in float32.
RANDOM_BITS = 24


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
    """Base options dataclass, used as is by methods without options; subclasses add fields, each
    ``field(default=<the paper's>, metadata={"help": ...})`` (what ``hea.method_options`` and the docs'
    option tables show), and ``validate``, which runs on construction."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` for an option value the method cannot use."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def seed_field() -> Any:
    """The ``seed`` option of a sampling method: one meaning in every method."""
    return field(
        default=0,
        metadata={"help": ("Seeds the fixed draws of eval mode (layer i uses `seed + 1000 i`); training draws fresh ones.")},
    )


@dataclass(frozen=True)
class Paper:
    """The paper a method implements (the model card's "Method" section, the docs' methods table)."""

    title: str
    venue: str
    arxiv: str


class AttentionMethod(nn.Module):
    """Base class: ``forward(q, k, v, key_padding_mask, scaling) -> out``, all (B, H, N, D).

    ``key_padding_mask`` is a bool (B, N) tensor with True for real tokens, or None.
    """

    name: ClassVar[str]
    options_cls: ClassVar[type[MethodOptions]] = MethodOptions
    #: The paper the method comes from (every built-in method has one).
    paper: ClassVar[Paper | None] = None
    #: Time and memory in the sequence length n, as a formula of its options (e.g. "O(n k)").
    cost: ClassVar[str | None] = None
    #: The option that trades accuracy for cost (None: nothing to tune, e.g. exact attention).
    budget_option: ClassVar[str | None] = None
    #: The exact attention the method approximates: "softmax", or the method's own exact kernel
    #: (YOSO's expected collision weights, Skyformer's Gaussian kernel).
    exact_reference: ClassVar[str] = "softmax"
    #: True when the method approximates softmax attention (False for e.g. YOSO, Skyformer).
    approximates_softmax: ClassVar[bool] = True
    #: True when the method samples at random: fixed draws (:meth:`seeded_draws`) in eval mode,
    #: fresh ones from the global RNG in training mode.
    samples: ClassVar[bool] = False
    #: False when appending padded tokens may change real outputs (e.g. sampled or length-dependent).
    padding_invariant: ClassVar[bool] = True
    #: True when the method's parameters are sized by ``shape.max_seq_len`` (Linformer's E/F).
    length_bound: ClassVar[bool] = False

    def __init__(self, options: MethodOptions, shape: AttentionShape):
        super().__init__()
        self.options = options
        self.shape = shape
        self._draw_seeded_buffers()

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
        by ``from_pretrained`` for those missing from the checkpoint (Transformers leaves every
        non-persistent buffer uninitialised there). The base class redraws the seeded draws;
        ``nn.Conv2d`` submodules are initialised by Transformers itself."""
        self._draw_seeded_buffers()

    def share_from(self, first_layer: nn.Module) -> None:
        """Called by ``patch_model`` on every layer after the first with the first layer's
        self-attention module (its method is ``first_layer.efficient_attn``); methods that share
        state across layers (Linformer's layerwise sharing) override it. Shared state must not be
        registered as a submodule here, so that it is saved once, in the first layer."""

    def seeded_draws(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The fixed random draws of eval mode, by buffer name: drawn on the CPU from ``generator``
        (seeded with ``seed + 1000 * layer_idx``), from the options and ``self.shape`` only.
        Sampling methods override this (default: none). The draws are non-persistent buffers, so
        checkpoints and adapters carry none and a rebuilt model draws the same values."""
        return {}

    def _draw_seeded_buffers(self) -> None:
        """Register (or redraw, keeping device and dtype) the buffers of :meth:`seeded_draws`."""
        seed = int(getattr(self.options, "seed", 0)) + 1000 * self.shape.layer_idx
        # Drawn on the CPU (the same values on every device), then placed on the device the module is
        # built on (`with torch.device("cuda")`); never on "meta", where from_pretrained builds models
        # and where non-persistent buffers would never receive values.
        target = torch.get_default_device()
        target = torch.device("cpu") if target.type == "meta" else target
        with torch.device("cpu"):
            draws = self.seeded_draws(torch.Generator().manual_seed(seed))
        for name, draw in draws.items():
            current = getattr(self, name, None)
            if not isinstance(current, torch.Tensor):
                self.register_buffer(name, draw.to(target), persistent=False)
            elif current.shape == draw.shape:
                with torch.no_grad():
                    current.copy_(draw)
            else:  # a new max_seq_len
                self.register_buffer(name, draw.to(device=current.device, dtype=current.dtype), persistent=False)

    def set_max_seq_len(self, max_seq_len: int) -> None:
        """Follow a longer position table (``extend_position_embeddings``): draws indexed by
        position are redrawn for ``max_seq_len`` positions, as a model built with it draws them."""
        self.shape = dataclasses.replace(self.shape, max_seq_len=max_seq_len)
        self._draw_seeded_buffers()

    def draw_bits(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Random bits (:func:`random_bits`) for one forward of shape ``shape`` (default: that of the
        seeded buffer ``name``): in eval mode the leading block of that buffer, so a draw tied to a
        position does not depend on the padded length; in training mode fresh ones."""
        fixed = getattr(self, name)
        shape = tuple(fixed.shape) if shape is None else shape
        if self.training:
            return random_bits(shape, device=fixed.device)
        if any(size > available for size, available in zip(shape, fixed.shape)):
            raise ValueError(
                f"{self.name}: inputs of this length need eval-mode draws {name} of shape {tuple(shape)}, beyond the "
                f"{tuple(fixed.shape)} drawn for max_seq_len {self.shape.max_seq_len} (the model's position table); "
                "use shorter inputs, or stretch the model with hf_efficient_attn.extend_position_embeddings, which "
                "redraws them"
            )
        return fixed[tuple(slice(0, size) for size in shape)]

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.to_dict().items())


def pad_to_length(x: torch.Tensor, length: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """``x`` padded with ``value`` at the end of ``dim`` to ``length``."""
    if x.shape[dim] == length:  # eager only for a sequence length: MRA's traced lengths always differ (padded_blocks)
        return x
    if is_tracing():  # one Pad node in exported graphs
        pad = [0, 0] * (x.dim() - dim % x.dim() - 1) + [0, length - x.shape[dim]]
        return nn.functional.pad(x, pad, value=value)
    # Eager: ``pad`` fills the whole output before copying x in; fill the tail only.
    dim %= x.dim()
    padded = x.new_empty(*x.shape[:dim], length, *x.shape[dim:][1:])
    padded.narrow(dim, 0, x.shape[dim]).copy_(x)
    padded.narrow(dim, x.shape[dim], length - x.shape[dim]).fill_(value)
    return padded


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


def random_bits(
    shape: tuple[int, ...], generator: torch.Generator | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Integers uniform in [0, 2**RANDOM_BITS) (int32), from ``generator`` or the global RNG."""
    return torch.randint(2**RANDOM_BITS, shape, generator=generator, device=device, dtype=torch.int32)


def uniform_from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(bits + 1/2) / 2**RANDOM_BITS: uniforms in (0, 1), never 0 or 1, exact in float32 and float64."""
    return (bits.to(dtype) + 0.5) * 2.0**-RANDOM_BITS


def real_first_positions(real: torch.Tensor) -> torch.Tensor:
    """(B, N) positions of the real tokens in order, then of the padded ones (any padding side):
    each token's rank in that order, scattered (no sort, which ONNX lacks in its stable form)."""
    real_rank = real.long().cumsum(-1) - 1
    padded_rank = (~real).long().cumsum(-1) - 1 + real.sum(-1, keepdim=True)
    rank = torch.where(real, real_rank, padded_rank)
    positions = torch.arange(real.shape[-1], device=real.device).expand_as(rank)
    return torch.empty_like(rank).scatter(-1, rank, positions)


def uniform_real_positions(bits: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Map random bits (any shape S) to positions of real tokens, uniformly: for every sequence of
    ``real`` (B, N), the floor(u m)-th of its m real tokens with u = bits / 2**RANDOM_BITS, in exact
    integer arithmetic. Returns (B, *S); a sequence without real tokens gets its position 0."""
    batch = real.shape[0]
    lengths = real.sum(-1).view(batch, *([1] * bits.dim()))
    rank = torch.div(bits * lengths, 2**RANDOM_BITS, rounding_mode="floor")  # in [0, m)
    return real_first_positions(real).gather(1, rank.reshape(batch, -1)).view(rank.shape)
