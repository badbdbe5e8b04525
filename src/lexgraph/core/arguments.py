"""argparse types for the numeric options of the benchmarks (``benchmarks/*.py``): a value
out of range is refused by argparse, before any work, with one line naming the option and
what was expected, instead of a traceback or numbers measured on nothing (issue 28).

``parser.add_argument("--repeat", type=positive_int, default=5)``;
``at_least(100)`` for a bound other than 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer ``≥ low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {low}, got {value}")
        return value

    parse.__name__ = f"integer ≥ {low}"
    return parse


#: an integer ≥ 1 (a count of rounds, steps, copies, queries, resamples)
positive_int = at_least(1)
#: an integer ≥ 0 (warm-up steps; 0 meaning "none" or "the default" where the option says so)
non_negative_int = at_least(0)


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``PROG: error: MESSAGE`` (exit status 2),
    without the usage lines of argparse's own (``--help`` shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
