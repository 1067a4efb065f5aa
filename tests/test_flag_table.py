"""Every flag of every script, and every keyword of the public Python API, has a test of its effect
(tests/flag_table.py): the table lists no flag that does not exist, misses none that does, and names
only tests that exist."""

import ast
from pathlib import Path

import pytest
from flag_table import FLAG_TESTS, SCRIPT_MAINS, api_keywords, script_flags

TESTS = Path(__file__).parent


def defined_tests(path: str) -> set[str]:
    tree = ast.parse((TESTS.parent / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_every_flag_of_every_script_has_an_effect_test(script):
    assert sorted(FLAG_TESTS.get(script, {})) == sorted(script_flags(script))


def test_every_public_keyword_has_an_effect_test():
    assert sorted(FLAG_TESTS["python_api"]) == sorted(api_keywords())


def test_the_named_tests_exist():
    missing = []
    for tests in FLAG_TESTS.values():
        for test in set(tests.values()):
            path, _, name = test.partition("::")
            if name not in defined_tests(path):
                missing.append(test)
    assert not missing


def test_the_table_lists_only_scripts_and_the_api():
    assert set(FLAG_TESTS) == {*SCRIPT_MAINS, "python_api"}
