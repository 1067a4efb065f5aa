"""How every script fails on bad input: one line ``error: <what is wrong; what to do>`` on stderr
and exit status 2, without a traceback. ``HEA_DEBUG=1`` shows the traceback (for bug reports).

A script's ``__main__`` block is ``run_cli(main)``. User errors are what bad input and a missing
file, folder, model or optional package raise: ``ValueError`` (the project's own checks, JSON
syntax, Hub ids), ``OSError`` (missing files and models; Transformers and ``datasets`` raise it for
a checkpoint or dataset they cannot find) and ``ModuleNotFoundError``; argparse's (and so
``HfArgumentParser``'s) errors become the same one line instead of a usage block. Anything else is
a programming error and keeps its traceback.

Ctrl-C (``KeyboardInterrupt``) prints one line too, ``interrupted`` and what the interrupted step
said to do next (a training run: rerun the same command to resume), and exits with status 130, as a
shell reports a command stopped by SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

#: Set to 1 to see the traceback of a user error.
DEBUG_VARIABLE = "HEA_DEBUG"
#: Exit status of a user error (argparse's).
USAGE_STATUS = 2
#: Exit status after Ctrl-C: 128 + SIGINT, what a shell reports for a command it interrupted.
INTERRUPTED_STATUS = 130
USER_ERRORS = (ValueError, OSError, ModuleNotFoundError)


class UsageError(ValueError):
    """A command-line error found by argparse, raised instead of printing the usage and exiting."""


def one_line(error: BaseException) -> str:
    """The error's message on one line (multi-line library messages joined)."""
    return " ".join(str(error).split()) or type(error).__name__


@contextlib.contextmanager
def argparse_errors_raise() -> Iterator[None]:
    """Within the block, ``ArgumentParser.error`` raises :class:`UsageError` (every parser: the
    scripts' own, ``HfArgumentParser``) instead of printing the usage and exiting."""

    def error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {parser.prog} --help)")

    # The class is patched because the parsers are built in many places (Transformers' included) and
    # argparse's own switch, exit_on_error=False, still prints and exits for missing required flags.
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def run_cli(main: Callable[[Sequence[str] | None], Any], argv: Sequence[str] | None = None) -> Any:
    """Run a script's ``main(argv)``; a user error prints ``error: ...`` on stderr and exits 2, Ctrl-C
    prints ``interrupted`` (with the advice the ``KeyboardInterrupt`` carries, if any) and exits 130."""
    try:
        with argparse_errors_raise():
            return main(argv)
    except USER_ERRORS as err:
        _exit_with_one_line(f"error: {one_line(err)}", USAGE_STATUS)
    except KeyboardInterrupt as interrupt:
        advice = " ".join(str(interrupt).split())
        # On a line of its own: Ctrl-C leaves the progress bar it interrupted without its newline.
        _exit_with_one_line(f"\ninterrupted: {advice}" if advice else "\ninterrupted", INTERRUPTED_STATUS)


def _exit_with_one_line(line: str, status: int) -> NoReturn:
    """Print ``line`` on stderr and exit with ``status``; with :data:`DEBUG_VARIABLE` set, re-raise the
    exception being handled instead (its traceback, for bug reports)."""
    if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
        raise
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(status) from None
