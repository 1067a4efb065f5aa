"""Remote code: a variant's method shipped beside its weights, so that plain Transformers loads it
as itself (``trust_remote_code=True``) in a Python where hf_efficient_attn is not installed.

config.json's ``auto_map`` points every auto class at ``modeling_efficient_attn.py``, rendered from
:data:`MODELING_TEMPLATE`: its classes are the package's efficient subclasses of the Transformers
ones (``EfficientModelMixin`` of ``patching.py``, which builds the method from ``config.attn_impl``
with the model, so the method's parameters load as weights). ``patching.py`` and the chosen method
are the package's own modules, read at export time and flattened beside it
(``hf_efficient_attn/methods/base.py`` -> ``hea_methods_base.py``) with their package imports
rewritten to sibling imports, the form Transformers follows when it copies a remote module and the
files it imports into its module cache. Only the modules reachable from ``patching.py`` and the
chosen method's module ship.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from collections.abc import Iterable
from pathlib import Path

from torch import nn
from transformers.models.auto import modeling_auto

from .. import __version__
from ..integration.auto import AUTO_CLASSES
from ..integration.bridge import method_modules
from ..integration.patching import EfficientModelMixin
from ..methods.base import AttentionMethod

PACKAGE = __name__.split(".")[0]
MODELING_MODULE = "modeling_efficient_attn"
SHIPPED_PREFIX = "hea_"

MODELING_TEMPLATE = '''\
"""{model_type} models with {attn_impl} self-attention: remote code written by hf_efficient_attn {version}.

``transformers.AutoModel*.from_pretrained(<this repo>, trust_remote_code=True)`` builds the classes
below: the Transformers model whose self-attention is replaced by ``config.attn_impl`` with
``config.attn_config`` while it is built, exactly as ``hf_efficient_attn.AutoModel*`` does. The
``hea_*.py`` files beside this one are hf_efficient_attn's own modules ({example_file} is
``{example_source}``), copied at export with their package imports made relative.
"""

import transformers

{method_imports}
from .{patching_module} import EfficientModelMixin
{classes}'''


def shipped_module_name(module: str) -> str:
    """``hf_efficient_attn.methods.base`` -> ``hea_methods_base`` (a file name beside the weights)."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        raise ValueError(f"{module!r} is not a module of {PACKAGE}")
    return SHIPPED_PREFIX + "_".join(module.split(".")[1:])


def _source_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of {module!r}")
    return Path(spec.origin)


def _is_package(module: str) -> bool:
    return _source_file(module).name == "__init__.py"


def _package_imports(module: str, tree: ast.Module) -> list[tuple[ast.ImportFrom, str]]:
    """Every import of another module of the package in ``tree``, with the module it names.

    Raises ``ValueError`` for forms that cannot ship on their own: ``import hf_efficient_attn...``,
    and imports from a package ``__init__``: ``from . import <module>`` (Transformers follows only
    ``from .x import y``) or ``from .methods import x`` (it would ship every method).
    """
    anchor = module if _is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise ValueError(f"{module} line {node.lineno}: write `from {PACKAGE}.x import y` (or relative) to ship it")
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), anchor)
        elif node.module and node.module.split(".")[0] == PACKAGE:
            target = node.module
        else:
            continue
        if _is_package(target):
            raise ValueError(
                f"{module} line {node.lineno} imports from the package {target}; only `from .module import name` "
                "imports of single modules can ship as remote code (Transformers follows only that form)"
            )
        found.append((node, target))
    return found


def module_closure(entry_modules: list[str]) -> list[str]:
    """The package modules ``entry_modules`` need, following package imports (also inside functions)."""
    seen, queue = set(entry_modules), deque(entry_modules)
    while queue:
        module = queue.popleft()
        tree = ast.parse(_source_file(module).read_text())
        for _, target in _package_imports(module, tree):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return sorted(seen)


def flatten_imports(module: str, source: str) -> str:
    """``source`` (of package module ``module``) with its package imports rewritten to sibling
    imports, ``from ..registry import x`` -> ``from .hea_registry import x``; nothing else changes."""
    lines = source.splitlines(keepends=True)
    edits = sorted(_package_imports(module, ast.parse(source)), key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True)
    for node, target in edits:
        rewritten = ast.unparse(ast.ImportFrom(module=shipped_module_name(target), names=node.names, level=1))
        first, last = node.lineno - 1, node.end_lineno - 1
        head, tail = lines[first][: node.col_offset], lines[last][node.end_col_offset :]
        lines[first : last + 1] = [head + rewritten + tail]
    return "".join(lines)


def model_classes(model_type: str) -> dict[str, str]:
    """Auto class name -> Transformers model class name, for the auto classes ``model_type`` has."""
    classes = {}
    for auto_class, mapping in AUTO_CLASSES.items():  # a variant is mapped for each hea.AutoModel* class
        class_name = getattr(modeling_auto, mapping + "_NAMES").get(model_type)
        if class_name is not None:
            classes[auto_class] = class_name
    return classes


def auto_class_for(model_type: str, class_names: Iterable[str]) -> str:
    """The auto class of a head: the first whose Transformers class is among ``class_names``
    (a config's ``architectures``, or the names of a model's classes)."""
    classes, names = model_classes(model_type), set(class_names)
    for auto_class, class_name in classes.items():
        if class_name in names:
            return auto_class
    raise ValueError(
        f"none of {sorted(names)} is a {model_type!r} head that can be shared; these are: "
        + ", ".join(dict.fromkeys(classes.values()))
    )


def auto_class_of(model: nn.Module) -> str:
    """The auto class of ``model``'s head (``model`` may subclass it, as the remote classes do)."""
    return auto_class_for(model.config.model_type, (cls.__name__ for cls in type(model).__mro__))


def _method_classes(model: nn.Module) -> list[type[AttentionMethod]]:
    classes = sorted({type(m) for m in method_modules(model)}, key=lambda c: c.__qualname__)
    if not classes:
        raise ValueError(
            f"{type(model).__name__} has no efficient-attention method; patch it first "
            "(hf_efficient_attn.patch_model or hf_efficient_attn.AutoModel*.from_pretrained(..., attn_impl=...))"
        )
    for cls in classes:
        if not cls.__module__.startswith(PACKAGE + "."):
            raise ValueError(f"method {cls.name!r} is defined in {cls.__module__}: only {PACKAGE}'s own methods can ship")
    return classes


def render_modeling_file(model: nn.Module) -> tuple[str, dict[str, str]]:
    """The source of ``modeling_efficient_attn.py`` for ``model`` and the config's ``auto_map``."""
    config = model.config
    methods = _method_classes(model)
    base_classes = model_classes(config.model_type)
    # Named as Transformers' classes, as the package's own efficient classes are: Transformers looks up an
    # architecture's checkpoint conversions by class name (UltraBERT's masked-LM head is saved as `cls.`).
    names = list(dict.fromkeys(base_classes.values()))
    docstring = '    """``{}`` with ``config.attn_impl`` self-attention."""\n'
    classes = "".join(f"\n\nclass {cls}(EfficientModelMixin, transformers.{cls}):\n" + docstring.format(cls) for cls in names)
    method_imports = "\n".join(
        f'from .{shipped_module_name(m.__module__)} import {m.__name__}  # noqa: F401  (registers "{m.name}")' for m in methods
    )
    example = methods[0].__module__
    source = MODELING_TEMPLATE.format(
        model_type=config.model_type,
        attn_impl=config.attn_impl,
        version=__version__,
        example_file=f"``{shipped_module_name(example)}.py``",
        example_source=_source_file(example).relative_to(_source_file(PACKAGE).parents[1]).as_posix(),
        method_imports=method_imports,
        patching_module=shipped_module_name(EfficientModelMixin.__module__),
        classes=classes,
    )
    auto_map = {auto: f"{MODELING_MODULE}.{cls}" for auto, cls in base_classes.items()}
    return source, auto_map


def write_remote_code(model: nn.Module, folder: str | Path) -> dict[str, str]:
    """Write ``modeling_efficient_attn.py`` and the package modules it needs into ``folder``;
    returns the ``auto_map`` for config.json."""
    folder = Path(folder)
    source, auto_map = render_modeling_file(model)
    (folder / f"{MODELING_MODULE}.py").write_text(source)
    entries = [EfficientModelMixin.__module__] + [m.__module__ for m in _method_classes(model)]
    for module in module_closure(entries):
        source = flatten_imports(module, _source_file(module).read_text())
        (folder / f"{shipped_module_name(module)}.py").write_text(source)
    return auto_map
