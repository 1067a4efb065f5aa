"""The enumerating rules, each checked the way the flag table is: the cases are found in the code, and
each table names, for every case and nothing else, a test that exists.

- label-free paths (tests/label_free_table.py): every script path that runs on examples without labels
  runs in a test, in each padding mode;
- recorded settings (tests/recorded_settings_table.py): every setting a resumable tool records is changed
  on a rerun by a test that expects the refusal (the quickstart: the redo);
"""

from label_free_table import LABEL_FREE_TESTS, label_free_cases
from recorded_settings_table import RERUN_TESTS, recorded_settings
from rule_tables import missing_tests


def test_every_label_free_path_runs_in_a_test():
    assert sorted(LABEL_FREE_TESTS) == sorted(label_free_cases())


def test_the_label_free_tests_exist():
    assert missing_tests(LABEL_FREE_TESTS.values()) == []


def test_every_recorded_setting_is_changed_on_a_rerun_by_a_test():
    assert sorted(RERUN_TESTS) == sorted(recorded_settings())


def test_the_rerun_tests_exist():
    assert missing_tests(RERUN_TESTS.values()) == []
