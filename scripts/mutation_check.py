"""Check that the tests catch plausible bugs: apply one-line mutations, one at a time, each to a
temporary copy of the repository, run the tests named for it there, and report which mutations
the tests caught and which survived. Exits 1 if any survived (or the unmutated tree fails).

    python scripts/mutation_check.py                   # every default-tier mutation
    python scripts/mutation_check.py --only glue.py    # the mutations of files matching a substring
    python scripts/mutation_check.py --list            # what would be mutated, and by which tests
    python scripts/mutation_check.py --slow            # also those only the slow tier can catch

A developer tool (a run takes tens of minutes on 2 cores), not part of CI: run it on a module
after changing it or its tests, and add a line to MUTATIONS (tests/project/mutations/, a module per area) for every promise
a new test guards.

Reads: the mutations in tests/project/mutations/ and the repository it runs in (copied, without .git).
Writes: nothing in the repository (each copy is temporary); prints a line per mutation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "project"))  # the list lives beside the rule tables
from mutations import MUTATIONS, Mutation  # noqa: E402

#: What a copy needs to run the tests (no .git, no virtual environment, no outputs; the docs, which
#: tests read and some mutations change).
COPIED = ("hf_efficient_attn", "model_cards", "tests", "scripts", "configs", "docs", "README.md", "setup.cfg", "pyproject.toml")


def copy_repository(destination: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, name), ignore=ignore)
        elif os.path.exists(source):
            shutil.copy2(source, os.path.join(destination, name))


def apply(root: str, mutation: Mutation) -> None:
    path = os.path.join(root, mutation.path)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    count = source.count(mutation.original)
    if count != 1:
        raise SystemExit(f"{mutation.path}: {mutation.original!r} occurs {count} times (needs exactly one)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source.replace(mutation.original, mutation.replacement))


def pytest_arguments(tests: tuple[str, ...]) -> list[str]:
    """``file::-k expr`` -> ``file -k expr``; node ids stay as they are."""
    arguments = []
    for test in tests:
        path, _, selector = test.partition("::-k ")
        arguments += [path, "-k", selector] if selector else [test]
    return arguments


def run_tests(root: str, tests: tuple[str, ...], timeout: int) -> tuple[str, float]:
    """``passed``, ``failed``, ``timeout`` or ``error`` (nothing collected, bad usage) and the seconds."""
    env = {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_arguments(tests)]
    start = time.monotonic()
    try:
        result = subprocess.run(command, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start
    status = {0: "passed", 1: "failed"}.get(result.returncode, "error")
    if status == "error":
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
    return status, time.monotonic() - start


@dataclass
class MutationCheckArguments:
    only: str | None = field(default=None, metadata={"help": "Only the mutations of files whose path contains this."})
    slow: bool = field(default=False, metadata={"help": "Include mutations that only the slow tier catches."})
    list: bool = field(default=False, metadata={"help": "List the mutations and exit."})
    no_baseline: bool = field(default=False, metadata={"help": "Skip running the tests on the unmutated tree."})
    timeout: int = field(default=1200, metadata={"help": "Seconds per test run."})


def main(argv: list[str] | None = None) -> int:
    from hf_efficient_attn.tasks.common.args import check_positive_flags, parse_arguments

    (args,) = parse_arguments([MutationCheckArguments], argv, description=__doc__)
    check_positive_flags(args, "timeout")
    chosen = [m for m in MUTATIONS if (args.slow or not m.slow) and (args.only is None or args.only in m.path)]
    if args.list:
        for m in chosen:
            print(f"{m.path}: {m.bug}  [{' '.join(m.tests)}]{'  (slow)' if m.slow else ''}")
        return 0
    survived = []
    with tempfile.TemporaryDirectory(prefix="mutation-") as scratch:
        if not args.no_baseline:  # the tests must pass before a failure can mean anything
            baseline = os.path.join(scratch, "baseline")
            copy_repository(baseline)
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, seconds = run_tests(baseline, tests, args.timeout * 2)
            print(f"baseline (unmutated): {status} ({seconds:.0f} s)", flush=True)
            if status != "passed":
                return 1
        for number, mutation in enumerate(chosen):
            root = os.path.join(scratch, f"m{number}")
            copy_repository(root)
            apply(root, mutation)
            status, seconds = run_tests(root, mutation.tests, args.timeout)
            caught = status in ("failed", "timeout")
            print(f"{'caught  ' if caught else 'SURVIVED'} {mutation.path}: {mutation.bug} ({status}, {seconds:.0f} s)",
                  flush=True)  # fmt: skip
            if not caught:
                survived.append(mutation)
            shutil.rmtree(root)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    from hf_efficient_attn.utils.cli_errors import run_cli

    sys.exit(run_cli(main))
