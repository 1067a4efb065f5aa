"""Every flag of every script, and every keyword of the public Python API, has a test of its effect
(tests/project/flag_table.py): the table lists no flag that does not exist, misses none that does, names
only tests that exist, and a flag that several scripts read is tested in each of them."""

import ast

import paths
import pytest
from flag_table import FLAG_TESTS, SCRIPT_MAINS, api_keywords, covered_scripts, script_flags, shared_flags


def defined_tests(path: str) -> set[str]:
    tree = ast.parse((paths.REPO / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_every_flag_of_every_script_has_an_effect_test(script):
    assert sorted(FLAG_TESTS.get(script, {})) == sorted(script_flags(script))


def test_every_public_keyword_has_an_effect_test():
    assert sorted(FLAG_TESTS["python_api"]) == sorted(api_keywords())


def missing_named_tests(table: dict[str, dict[str, str]]) -> list[str]:
    """The tests that a table of ``{script: {case: "tests/<file>.py::<name>"}}`` names but that do not
    exist."""
    missing = []
    for test in sorted({test for tests in table.values() for test in tests.values()}):
        path, _, name = test.partition("::")
        if name not in defined_tests(path):
            missing.append(test)
    return missing


def test_the_named_tests_exist():
    assert not missing_named_tests(FLAG_TESTS)


def test_a_flag_several_scripts_read_is_tested_in_each():
    """For each script that parses a shared flag, the flag's test runs that script (its ``script``
    parametrization lists it): a shared flag tested in one script could be miswired in another."""
    untested = []
    for (owner, flag), scripts in shared_flags().items():
        for script in scripts:
            test = FLAG_TESTS.get(script, {}).get(flag)
            if test is not None and script not in covered_scripts(test):
                untested.append(f"{script} --{flag} ({owner}): {test}")
    assert not untested, "\n".join(untested)


def test_the_table_lists_only_scripts_and_the_api():
    assert set(FLAG_TESTS) == {*SCRIPT_MAINS, "python_api"}
