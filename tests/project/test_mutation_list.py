"""tests/project/mutations/'s list can run: each mutation's text occurs exactly once in its file (else
the check stops there), and each names test files that exist."""

import os

import mutations
import paths

REPO = str(paths.REPO)


def test_every_mutation_applies_once_and_names_existing_test_files():
    problems = []
    for mutation in mutations.MUTATIONS:
        with open(os.path.join(REPO, mutation.path), encoding="utf-8") as f:
            count = f.read().count(mutation.original)
        if count != 1:
            problems.append(f"{mutation.path}: {mutation.bug} ({count} occurrences)")
        problems += [test for test in mutation.tests if not os.path.isfile(os.path.join(REPO, test.split("::")[0]))]
    assert not problems
