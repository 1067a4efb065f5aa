"""Name -> method registry, option resolution and the functional entry point."""

from __future__ import annotations

import collections
import dataclasses
import functools
import operator
from typing import Any, Callable

import torch

from .methods.base import AttentionMethod, AttentionShape, MethodOptions

_METHODS: dict[str, type[AttentionMethod]] = {}
#: Called with the name of every method registered, including those registered before the
#: listener (the bridge registers each name with Transformers this way).
_LISTENERS: list[Callable[[str], None]] = []
#: What a method module draws when it is built (Linformer's projections, convolutions) comes from
#: torch's generator seeded with ``METHOD_INIT_SEED + layer index`` (:func:`build_method`), so a
#: variant built twice, or reloaded from a checkpoint or a PEFT adapter that lacks those parameters,
#: gets the same values; the global random state is left untouched.
METHOD_INIT_SEED = 0
#: Prefix of the ``attn_implementation`` a saved variant's config.json carries ("hf_efficient_attn:mra2").
#: After ``import hf_efficient_attn`` Transformers runs it like the bare method name; in a process
#: without the plugin Transformers refuses it with an error that names the package, instead of
#: silently running exact attention.
SAVED_NAME_PREFIX = "hf_efficient_attn:"


def register_method(cls: type[AttentionMethod] | None = None, *, replace: bool = False):
    """Class decorator: make ``cls`` available under ``cls.name`` (also to Transformers'
    ``attn_implementation=``, even when registered after ``import hf_efficient_attn``). A name already
    taken by another class is refused (``ValueError``) unless ``@register_method(replace=True)``."""
    if cls is None:
        return functools.partial(register_method, replace=replace)
    taken = _METHODS.get(cls.name)
    if taken is not None and taken is not cls and not replace:
        raise ValueError(
            f"attention method {cls.name!r} is already registered ({taken.__module__}.{taken.__qualname__}); "
            "choose another name, or use @register_method(replace=True) to replace it"
        )
    _METHODS[cls.name] = cls
    if taken is not None and taken is not cls:  # efficient_attention's modules of the replaced class
        _FUNCTIONAL_MODULES.clear()
    for listener in _LISTENERS:
        listener(cls.name)
    return cls


def on_register(listener: Callable[[str], None]) -> None:
    """Call ``listener(name)`` for every registered method, now and in the future."""
    _LISTENERS.append(listener)
    for name in list_methods():
        listener(name)


def list_methods() -> list[str]:
    """Sorted names of every registered method."""
    return sorted(_METHODS)


def get_method_class(name: str) -> type[AttentionMethod]:
    if not isinstance(name, str) or name not in _METHODS:
        raise ValueError(f"unknown attention method {name!r}; known methods: {', '.join(list_methods())}")
    return _METHODS[name]


@dataclasses.dataclass(frozen=True)
class MethodOption:
    """One option of a method: its default and what it means (the field's ``metadata["help"]``)."""

    default: Any
    help: str


def method_options(name: str) -> dict[str, MethodOption]:
    """The options of method ``name``, in declaration order, each with its default and help."""
    fields = dataclasses.fields(get_method_class(name).options_cls)
    return {f.name: MethodOption(f.default, f.metadata.get("help", "")) for f in fields}


def resolve_options(name: str, overrides: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> MethodOptions:
    """Defaults of ``name`` updated by ``base`` (e.g. saved options), then by ``overrides``;
    validated; unknown keys or a non-dict raise ``ValueError``."""
    options_cls = get_method_class(name).options_cls
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(
            f"attn_config must be a dict of option names to values (or None), got {type(overrides).__name__} "
            f"{overrides!r}; the options of {name!r} are: {options_cls().to_dict()}"
        )
    overrides = {**(base or {}), **(overrides or {})}
    known = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; its options are: {known}")
    return options_cls(**overrides)  # validates on construction


@dataclasses.dataclass(frozen=True)
class MethodChoice:
    """A method and its validated options: what :func:`resolve_method` returns, and what
    :func:`build_method`, ``patch_model`` and the efficient model classes take, so that a choice is
    resolved once."""

    name: str
    options: MethodOptions

    def __post_init__(self) -> None:
        options_cls = get_method_class(self.name).options_cls
        if not isinstance(self.options, options_cls):
            raise TypeError(
                f"the options of method {self.name!r} must be a {options_cls.__name__}, got {type(self.options).__name__}"
            )

    @classmethod
    def of(cls, name: str, attn_config: dict[str, Any] | None = None) -> MethodChoice:
        """Method ``name`` with its defaults updated by ``attn_config`` (:func:`resolve_options`)."""
        return cls(name, resolve_options(name, attn_config))

    @property
    def attn_config(self) -> dict[str, Any]:
        """The options as the dict that ``config.attn_config`` saves."""
        return self.options.to_dict()


def saved_attn_implementation(name: str) -> str:
    """The ``attn_implementation`` that config.json records for method ``name``."""
    return SAVED_NAME_PREFIX + name


def method_named_by(attn_implementation: str | dict | None) -> str | None:
    """The method an ``attn_implementation`` names (``"mra2"`` or ``"hf_efficient_attn:mra2"``), or
    None for Transformers' own implementations (``"sdpa"``, ``"eager"``, ...) and for None. A dict (per
    sub-config) is read at its top-level key ``""``, as Transformers does."""
    if isinstance(attn_implementation, dict):
        attn_implementation = attn_implementation.get("")
    if not isinstance(attn_implementation, str):
        return None
    name = attn_implementation.removeprefix(SAVED_NAME_PREFIX)
    if name != attn_implementation:
        get_method_class(name)  # "hf_efficient_attn:<unknown>" -> ValueError listing the known methods
    return name if name in _METHODS else None


def resolve_method(config: Any, attn_impl: str | None = None, attn_config: dict[str, Any] | None = None) -> MethodChoice | None:
    """The one rule for which method a model runs, and with which options; called once per model
    built or patched (by ``hea.AutoModel*``, which hands the choice to the model it builds, by
    ``patch_model``, and by the model's ``__init__`` when plain Transformers builds it):

    - the method is ``attn_impl``, else the one saved in ``config.attn_impl``; None (no method named
      or saved) means Transformers' own attention;
    - its options are the method's defaults, updated by the options saved in ``config.attn_config``
      when the config saves that same method, then by ``attn_config``.

    ``ValueError`` for an unknown method or option, and for ``attn_config`` without a method.

    The config carries a choice in three fields, the fewest Transformers allows (objects cannot be
    stored on it: config.json must stay JSON):

    - ``attn_impl`` and ``attn_config``: the package's saved choice, the method and its full options
      (what this function reads back);
    - ``attn_implementation = "hf_efficient_attn:<method>"``: what plain Transformers reads from
      config.json to dispatch attention (``transformers.AutoModel*`` and pipelines build the method),
      and what makes a process without the plugin refuse the folder instead of running exact
      attention (:data:`SAVED_NAME_PREFIX`);
    - ``config._attn_implementation`` (not saved): Transformers' own runtime field, the name its
      attention dispatch looks up (``integration/transformers_private.py``).
    """
    saved = getattr(config, "attn_impl", None)
    name = attn_impl or saved
    if name is None:
        if attn_config:  # an empty attn_config (a flag left at its default) names no option
            raise ValueError(
                "attn_config was given without attn_impl, and the config saves no method; "
                f"name one with attn_impl= (known methods: {', '.join(list_methods())})"
            )
        return None
    base = getattr(config, "attn_config", None) if name == saved else None
    return MethodChoice(name, resolve_options(name, attn_config, base=base))


def build_method(choice: MethodChoice, shape: AttentionShape) -> AttentionMethod:
    """A method module for one attention layer, its parameters drawn reproducibly (:data:`METHOD_INIT_SEED`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(METHOD_INIT_SEED + shape.layer_idx)
        return get_method_class(choice.name)(choice.options, shape)


def efficient_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    /,
    method: str = "mra2",
    attention_mask: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """Attention of unscaled q, k, v (B, H, N, D) by ``method``; returns (B, H, N, D).

    ``attention_mask``: (B, N), True (or 1) for real tokens, False (0) for padding: the convention of
    Transformers' ``attention_mask`` and of PyTorch's boolean ``attn_mask`` in
    ``scaled_dot_product_attention`` (True = takes part in attention); the opposite of
    ``nn.MultiheadAttention``'s ``key_padding_mask``. Bool or integer tensors; anything else is a
    ``ValueError``.

    q, k, v are positional, so every option name is free (Linformer's ``k=``). The method module
    runs in eval mode, so sampling methods are reproducible for a given ``seed``, and learnable
    methods (Linformer) use their reproducible initialisation, frozen (:func:`build_method`:
    identical calls give identical outputs; the global RNG is left untouched). It is built on the
    first call with its method, options, head count, head size, length and device, and reused by
    the next such calls (:data:`FUNCTIONAL_CACHE_SIZE` of them are kept).

    Under ``torch.compile`` the call traces in one graph (``fullgraph=True`` works): the module is
    built and looked up while tracing, and the compiled code only runs its forward. The graph is
    specialised to the head count, head size and length the module was built for; another length
    recompiles.
    """
    if "key_padding_mask" in options:
        raise ValueError(
            "efficient_attention takes attention_mask (True = real token, as Transformers' attention_mask), "
            "not key_padding_mask (whose PyTorch convention, True = padding, is the opposite)"
        )
    if q.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim), got q of shape {tuple(q.shape)}")
    real = _real_tokens(attention_mask, (q.shape[0], k.shape[2]))
    # operator.index makes each size a plain int: under torch.compile with dynamic shapes it
    # specialises the graph to it (a guard), as the module it builds is specific to it.
    num_heads, seq_len, head_dim = (operator.index(size) for size in q.shape[1:])
    key = _functional_module_key(method, options, num_heads, head_dim, seq_len, q.device)
    return _FUNCTIONAL_MODULES[key](q, k, v, real, head_dim**-0.5)


#: How many of :func:`efficient_attention`'s method modules are kept. Bounded, since each may hold
#: tensors on its device (Linformer's projections grow with the length: per head at 4096 tokens,
#: about 100 MiB), and a caller looping over lengths or options would otherwise keep every module.
FUNCTIONAL_CACHE_SIZE = 16
#: efficient_attention's method modules by :func:`_functional_module_key`, least recently used first.
_FUNCTIONAL_MODULES: collections.OrderedDict[tuple, AttentionMethod] = collections.OrderedDict()


@torch.compiler.assume_constant_result
def _functional_module_key(
    method: str, options: dict[str, Any], num_heads: int, head_dim: int, seq_len: int, device: torch.device
) -> tuple:
    """Build the method module of an :func:`efficient_attention` call into ``_FUNCTIONAL_MODULES``
    unless it is there, and return its key there.

    ``torch.compile`` runs this while tracing, instead of tracing it (resolving options and building
    a module, with its seeded draws, cannot be traced): the key it returns is a constant of the graph,
    and the traced lookup ``_FUNCTIONAL_MODULES[key]`` is guarded, so a module evicted or replaced
    since makes the caller recompile, which builds it again. A module is not returned directly:
    Dynamo cannot run one that comes out of a function marked constant."""
    choice = MethodChoice.of(method, options)
    # repr: the option values with their types (True and 1, or 1 and 1.0, are different options)
    key = (method, repr(choice.options), num_heads, head_dim, seq_len, str(device))
    if key in _FUNCTIONAL_MODULES:
        _FUNCTIONAL_MODULES.move_to_end(key)
        return key
    shape = AttentionShape(num_heads=num_heads, head_dim=head_dim, max_seq_len=seq_len)
    # Frozen: its parameters serve every call, and no caller can train them (a gradient would only
    # accumulate on the shared module).
    module = build_method(choice, shape).to(device).eval().requires_grad_(False)
    _FUNCTIONAL_MODULES[key] = module
    while len(_FUNCTIONAL_MODULES) > FUNCTIONAL_CACHE_SIZE:
        _FUNCTIONAL_MODULES.popitem(last=False)
    return key


def _real_tokens(attention_mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """``attention_mask`` as the bool (B, N) mask of real tokens the methods take; ``ValueError`` for a
    mask of another shape or of a floating dtype (an additive float mask would be misread)."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != shape:
        raise ValueError(
            f"attention_mask must be a (batch, seq) = {shape} tensor with True (or 1) for real tokens, got "
            f"{tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__}"
        )
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        advice = _float_mask_advice(attention_mask)
        raise ValueError(f"attention_mask must be bool or integer (True / 1 = real token), got {attention_mask.dtype}: {advice}")
    return attention_mask.bool()


def _float_mask_advice(mask: torch.Tensor) -> str:
    """How to pass a float mask: its two forms read opposite ways (a 0/1 mask's 0 is padding, an
    additive mask's 0 is a real token), so the advice follows the values (read only on this error path)."""
    zero_one = "a 0/1 mask (1 = real token, e.g. a tokenizer's mask cast to float): pass mask.bool()"
    additive = "an additive mask (0 = real token, -inf or a large negative = padding): pass mask == 0"
    if mask.is_complex():
        return f"for {zero_one}; for {additive}"
    if bool(((mask == 0) | (mask == 1)).all()):
        return f"this is {zero_one}"
    if bool((mask <= 0).all()):
        return f"this is {additive}"
    return f"for {zero_one}; for {additive}"
