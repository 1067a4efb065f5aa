"""What a dry-run upload folder holds (issue 9): config, weights, tokenizer, card, and the code of
the package that ships with it (only the chosen method family, imports flattened)."""

from __future__ import annotations

import ast
import json
import sys
import textwrap

import pytest
import transformers as T
from hub_fixtures import CASES, REPO, TEXT, tokenizer_for

import hf_efficient_attn as hea
from hf_efficient_attn.hub import remote_code
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.registry import get_method_class

PACKAGE_DIR = REPO / "hf_efficient_attn"


@pytest.mark.parametrize("case", CASES)
def test_folder_has_config_weights_tokenizer_card_and_code(hub_variants, case):
    shared_case = hub_variants[case]
    folder, author = shared_case.folder, shared_case.author
    config = json.loads((folder / "config.json").read_text())
    assert config["attn_impl"] == author.config.attn_impl and config["attn_config"] == author.config.attn_config
    assert config["auto_map"][shared_case.auto_class] == f"modeling_efficient_attn.{type(shared_case.author).__name__}"
    assert config["auto_map"]["AutoModel"] == f"modeling_efficient_attn.{type(author.base_model).__name__}"
    assert (folder / "model.safetensors").is_file() and (folder / "README.md").is_file()
    original = tokenizer_for(config["model_type"])
    assert T.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == original(TEXT)["input_ids"]


def _without_imports(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if hasattr(node, "body") and isinstance(node.body, list):
            node.body = [n for n in node.body if not isinstance(n, (ast.Import, ast.ImportFrom))] or [ast.Pass()]
    return ast.dump(tree)


def _imported_names(source: str) -> list[str]:
    return sorted(
        a.asname or a.name for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
    )


@pytest.mark.parametrize("case", CASES)
def test_shipped_code_is_the_package_source_with_torch_and_transformers_only(hub_variants, case):
    """Each hea_*.py is a package module with only its import lines changed; shipped files import
    only the standard library, torch, transformers, triton (MRA-2's triton backend, imported when it
    runs; CUDA builds of torch ship it) and each other; only the chosen method family ships (with the
    helpers it imports)."""
    folder = hub_variants[case].folder
    sources = {
        remote_code.shipped_module_name(".".join(p.relative_to(REPO).with_suffix("").parts)): p
        for p in PACKAGE_DIR.rglob("*.py")
        if p.name != "__init__.py"
    }
    shipped = {p.stem: p.read_text() for p in folder.glob("*.py")}
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers", "triton"}
    for name, text in shipped.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, (name, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in allowed, (name, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1 and node.module in shipped, (name, ast.unparse(node))
        if name != remote_code.MODELING_MODULE:
            source = sources[name].read_text()
            assert _without_imports(text) == _without_imports(source), name
            assert _imported_names(text) == _imported_names(source), name
    method_module = type(method_modules(hub_variants[case].author)[0]).__module__
    families = {remote_code.shipped_module_name(get_method_class(n).__module__) for n in hea.list_methods()}
    shipped_methods = {n for n in shipped if n.startswith("hea_methods_")}
    assert shipped_methods & families == {remote_code.shipped_module_name(method_module)}
    assert "hea_methods_base" in shipped_methods


def test_methods_ship_with_the_method_modules_they_import(hub_variants):
    """Skeinformer uses exact_attention from softmax.py, Informer Skeinformer's helpers: those ship too."""
    assert (hub_variants["method-skeinformer"].folder / "hea_methods_softmax.py").is_file()
    assert {p.stem for p in hub_variants["method-informer"].folder.glob("hea_methods_*.py")} == {
        "hea_methods_base",
        "hea_methods_informer",
        "hea_methods_skeinformer",
        "hea_methods_softmax",
    }
    assert not (hub_variants["method-skeinformer"].folder / "hea_methods_mra_method.py").exists()


def test_flatten_imports_rewrites_every_package_import_and_nothing_else():
    source = textwrap.dedent(
        """\
        import math  # stays

        from ..registry import register_method
        from .base import (
            AttentionMethod,
            MethodOptions as Options,
        )
        from hf_efficient_attn.integration.positions import max_tokens  # absolute form


        def lazy():
            from .softmax import exact_attention  # inside a function
            return exact_attention
        """
    )
    flat = remote_code.flatten_imports("hf_efficient_attn.methods.linformer", source)
    assert flat.splitlines() == [
        "import math  # stays",
        "",
        "from .hea_registry import register_method",
        "from .hea_methods_base import AttentionMethod, MethodOptions as Options",
        "from .hea_integration_positions import max_tokens  # absolute form",
        "",
        "",
        "def lazy():",
        "    from .hea_methods_softmax import exact_attention  # inside a function",
        "    return exact_attention",
    ]


@pytest.mark.parametrize(
    "line",
    [
        "from .. import registry",
        "from . import softmax",
        "import hf_efficient_attn.registry",
        "from hf_efficient_attn.methods import mra",
    ],
)
def test_imports_that_cannot_ship_are_refused(line):
    """Transformers copies only `from .x import y` siblings; a package __init__ would ship every method."""
    with pytest.raises(ValueError, match="line 1"):
        remote_code.flatten_imports("hf_efficient_attn.methods.linformer", line + "\n")
