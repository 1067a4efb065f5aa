"""The enumerating rules, each checked the way the flag table is: the cases are found in the code, and
each table names, for every case and nothing else, a test that exists.

- label-free paths (tests/project/label_free_table.py): every script path that runs on examples without labels
  runs in a test, in each padding mode;
- recorded settings (tests/project/recorded_settings_table.py): every setting a resumable tool records is changed
  on a rerun by a test that expects the refusal (the quickstart: the redo);
- advice taken (tests/project/advice_table.py): every error message that advises an alternative has a test that
  takes the advice.
"""

import pytest
from advice_table import ADVICE_TESTS, advice_clauses, advising_messages
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


def test_every_advice_is_taken_by_a_test():
    assert sorted(ADVICE_TESTS) == sorted(advising_messages())


def test_the_advice_tests_exist():
    assert missing_tests(ADVICE_TESTS.values()) == []


@pytest.mark.parametrize(
    "message, clauses",
    [
        ("--fp16 needs a GPU: on CPU Trainer silently trains in fp32; use --bf16 (CPU autocast) or no flag",
         ["use --bf16 (CPU autocast) or no flag"]),
        ("x: rerun with that method to resume, or give another --output_dir to start afresh",
         ["rerun with that method to resume", "give another --output_dir to start afresh"]),
        ("no token: log in with `hf auth login` or set HF_TOKEN (or use --dry_run DIR)",
         ["log in with `hf auth login`", "set HF_TOKEN", "use --dry_run DIR"]),
        ("{}'s parameters are sized by the table; extend the embeddings first, then patch (or load) the model",
         ["extend the embeddings first, then patch (or load) the model"]),
        ("a; to load plain attention use transformers.AutoModel*.from_pretrained", ["to load plain attention use "
                                                                                    "transformers.AutoModel*.from_pretrained"]),
        ("unknown flag --x (did you mean --y?)", ["did you mean --y?"]),
        ("the cache is read-only: pass a folder of your own instead", ["pass a folder of your own instead"]),
        ("a list, not a dict; write it as one instead", ["write it as one instead"]),
        ("--task_name 'x': unknown; allowed: cola, sst2", []),
        ("--repeats must be 0 or more, got -1", []),
        ("the model's outputs run through a loaded head", []),
    ],
)  # fmt: skip
def test_the_advice_pattern_finds_each_clause_and_nothing_else(message, clauses):
    assert advice_clauses(message) == clauses


def test_advice_built_before_the_raise_is_found():
    """Messages assembled in a variable, a helper or a dict of functions: the float mask's advice (a helper's
    return, through a name), the flex backend's (a dict of functions, appended to a list, joined)."""
    found = advising_messages()
    assert "hf_efficient_attn/registry.py::_float_mask_advice: pass mask.bool()" in found
    assert "hf_efficient_attn/methods/mra/flex.py::flex_unavailable: use backend='gather' or 'auto'" in found
    assert "hf_efficient_attn/methods/mra/triton.py::triton_unavailable: pip install triton" in found
