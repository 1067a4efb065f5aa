"""How every script fails on bad input: one line ``error: <what is wrong; what to do>`` on stderr
and exit status 2, without a traceback. ``HEA_DEBUG=1`` shows the traceback (for bug reports).

A script's ``__main__`` block is ``run_cli(main)``. User errors are what bad input and a missing
file, folder, model or optional package raise: ``ValueError`` (the project's own checks, JSON
syntax, Hub ids), ``OSError`` (missing files and models; Transformers and ``datasets`` raise it for
a checkpoint or dataset they cannot find) and ``ModuleNotFoundError``; argparse's (and so
``HfArgumentParser``'s) errors become the same one line instead of a usage block. Anything else is
a programming error and keeps its traceback.
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
    """Run a script's ``main(argv)``; a user error prints ``error: ...`` on stderr and exits 2."""
    try:
        with argparse_errors_raise():
            return main(argv)
    except USER_ERRORS as err:
        if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        sys.stdout.flush()
        print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_STATUS) from None
