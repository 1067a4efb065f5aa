"""The package layout's import rules (docs/layout.md): the library never imports the task pipelines
or the tools; a task module imports only ``tasks/common`` and the library, never another task;
``hub/`` and ``serving/`` use the library and ``tasks/common`` only."""

import ast
import importlib.util
from pathlib import Path

import paths
import pytest

PACKAGE = paths.REPO / "hf_efficient_attn"
LIBRARY = ("registry", "presets", "methods", "integration", "utils")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def submodule_or_package(package: str, name: str) -> str:
    """``from package import name``: the module ``package.name`` if there is one, else ``package``."""
    path = PACKAGE.parent.joinpath(*package.split("."), name)
    return f"{package}.{name}" if path.is_dir() or path.with_suffix(".py").is_file() else package


def imported_modules(path: Path) -> set[str]:
    """Every hf_efficient_attn module ``path`` imports (relative imports resolved, also inside functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = importlib.util.resolve_name("." * node.level + target, package)
            if target.split(".")[0] == "hf_efficient_attn":
                found |= {submodule_or_package(target, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hf_efficient_attn")}
    return found


def area(module: str) -> str:
    """``hf_efficient_attn.tasks.wikihop.data`` -> ``tasks.wikihop``; library modules -> ``library``."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in LIBRARY:
        return "library"
    if parts[0] == "tasks" and len(parts) > 1:
        return "tasks." + parts[1]
    return parts[0]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_known_area():
    areas = {area(module_name(path)) for path in MODULES}
    assert areas <= {
        "library",
        "hub",
        "serving",
        "tools",
        "tasks.common",
        "tasks.convert",
        "tasks.convert_released",
        "tasks.mlm",
        "tasks.glue",
        "tasks.wikihop",
    } | {"tasks"}, areas


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_follow_the_layers(path):
    mine = area(module_name(path))
    allowed = {
        "library": {"library"},
        "hub": {"library", "hub", "tasks.common"},
        "serving": {"library", "hub", "serving", "tasks.common"},
        "tasks.common": {"library", "tasks.common"},
        "tasks": {"library"},
    }.get(mine, {"library", "tasks.common", mine})  # a task: the library, tasks/common and itself
    if mine == "tools":
        allowed = None  # tools may use everything
    wrong = sorted(m for m in imported_modules(path) if allowed is not None and area(m) not in allowed)
    assert not wrong, f"{module_name(path)} ({mine}) imports {wrong}"
