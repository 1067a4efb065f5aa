"""Every default a script's --help states has a test that runs the script without the flag and checks
it (tests/project/defaults_table.py): the table misses no default the help texts state (each mode a case),
lists none they do not, and names only tests that exist."""

import pytest
from defaults_table import DEFAULT_TESTS, script_defaults
from flag_table import SCRIPT_MAINS
from test_flag_table import missing_named_tests


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_every_stated_default_of_every_script_has_a_test(script):
    assert sorted(DEFAULT_TESTS.get(script, {})) == sorted(script_defaults(script))


def test_the_named_tests_exist():
    assert not missing_named_tests(DEFAULT_TESTS)


def test_the_table_lists_only_scripts():
    assert set(DEFAULT_TESTS) == set(SCRIPT_MAINS)
