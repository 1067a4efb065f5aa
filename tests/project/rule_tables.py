"""What the tables of the enumerating rules share (tests/project/advice_table.py, tests/project/recorded_settings_table.py,
tests/project/label_free_table.py): the package's source read as syntax trees, and whether a test a table names
exists.

A table maps each case its rule finds in the code to a test, named by its pytest node id
(``tests/<file>.py::<name>``, or ``...::<name>[<parameter id>]`` for one case of a parametrized test).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import os
from collections.abc import Iterable, Iterator

import paths
import pytest

REPO = str(paths.REPO)
#: The type of ``pytest.param(...)``.
PARAMETER_SET = type(pytest.param(None))


def source_path(target: str) -> str:
    """The file of ``target``: a path under the repository (``scripts/x.py``) or a module's dotted name."""
    if target.endswith(".py"):
        return os.path.join(REPO, target)
    return importlib.util.find_spec(target).origin


def syntax_tree(target: str) -> ast.Module:
    """The syntax tree of ``target`` (see :func:`source_path`)."""
    with open(source_path(target), encoding="utf-8") as f:
        return ast.parse(f.read())


def called_name(call: ast.Call) -> str | None:
    """The name a call calls: ``f`` of ``f(...)`` and of ``module.f(...)``."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def calls(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    """The calls of the function ``name`` in ``tree``."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call) and called_name(node) == name)


def function(tree: ast.AST, name: str) -> ast.FunctionDef:
    """The definition of the function ``name`` in ``tree``."""
    (found,) = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == name]
    return found


def parameter_ids(test) -> set[str]:
    """The ids pytest gives the cases of a parametrized test function: an explicit id (``ids=`` or
    ``pytest.param(..., id=)``), else a plain value (str, int, float, bool) as itself, else the
    argument name and the position; stacked decorators join their ids with ``-``, the nearest first."""
    per_mark = []
    for mark in getattr(test, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0] if not isinstance(mark.args[0], str) else [n.strip() for n in mark.args[0].split(",")]
        explicit = mark.kwargs.get("ids")
        ids = []
        for position, value in enumerate(mark.args[1]):
            param = isinstance(value, PARAMETER_SET)
            given = (value.id if param else None) or (explicit[position] if isinstance(explicit, (list, tuple)) else None)
            values = value.values if param else (value,) if len(names) == 1 else value
            parts = [str(v) if isinstance(v, (str, int, float, bool)) else f"{name}{position}" for name, v in zip(names, values)]
            ids.append(given or "-".join(parts))
        per_mark.append(ids)
    return {"-".join(combination) for combination in itertools.product(*per_mark)}


def missing_tests(node_ids: Iterable[str]) -> list[str]:
    """The node ids among ``node_ids`` that name no test: no such file, no such test function in it, or
    no such parameter id of it."""
    missing = []
    for node_id in sorted(set(node_ids)):
        path, _, name = node_id.partition("::")
        name, _, parameter = name.partition("[")
        if not os.path.isfile(os.path.join(REPO, path)) or not name.startswith("test"):
            missing.append(node_id)
            continue
        test = getattr(importlib.import_module(os.path.basename(path)[: -len(".py")]), name, None)
        if not callable(test) or (parameter and parameter[:-1] not in parameter_ids(test)):
            missing.append(node_id)
    return missing
