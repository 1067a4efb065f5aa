"""Speed and peak memory against SDPA (``scripts/benchmark.py``): what is measured (``steps``),
how a step is timed (``timing``), each measurement in a fresh process (``processes``), the tables
and plots (``report``) and the command line (``cli``)."""

from .cli import main, parse_args, run

__all__ = ["main", "parse_args", "run"]
