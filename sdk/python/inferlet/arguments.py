"""An inferlet's command line, parsed by argparse as a Python program's is.

A usage error prints the usage and ``PROG: error: MESSAGE`` on stderr and ends the instance with status
2; ``--help`` prints the help on stdout and ends it with status 0. argparse's ``sys.exit`` reaches the
event loop as ``SystemExit``, which ends an instance as Python ends a program (``tasks._end_with``), so
a user's mistake reads as a one-line error, not a traceback.

What this adds to argparse: options are recognized wherever they stand among the positionals
(``parse_intermixed_args``) and never by an abbreviation, and value types that say their bounds in the
error (``whole``, ``number``, ``text``, ``regex``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys


class ArgumentParser(argparse.ArgumentParser):
    """``ArgumentParser("name", __doc__)``: the help's description is the first paragraph of the
    inferlet's docstring, without a leading ``name:``."""

    def __init__(self, prog: str, doc: str | None = None, **kwargs):
        if sys.version_info >= (3, 14):  # the guest's CPython; its argparse colours by default
            kwargs.setdefault("color", False)
        description = " ".join(doc.strip().split("\n\n")[0].split()).removeprefix(f"{prog}: ") if doc else None
        super().__init__(prog=prog, description=description, allow_abbrev=False, **kwargs)

    def parse(self, args: list[str]) -> argparse.Namespace:
        return self.parse_intermixed_args(args)


def whole(low: int = 1, high: int | None = None):
    """The type of a whole-number argument in [low, high] (no upper bound when ``high`` is None)."""
    bounds = f">= {low}" if high is None else f"from {low} to {high}"

    def convert(value: str) -> int:
        try:
            number_ = int(value)
        except ValueError:
            number_ = None
        if number_ is None or number_ < low or (high is not None and number_ > high):
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, not {value!r}")
        return number_

    return convert


def number(low: float | None = None, high: float | None = None, *, above: float | None = None,
           below: float | None = None):
    """The type of a real-number argument: finite, >= ``low`` or > ``above``, and <= ``high`` or < ``below``."""
    bounds = " and ".join(f"{op} {bound:g}" for op, bound in ((">=", low), (">", above), ("<=", high), ("<", below))
                          if bound is not None)

    def convert(value: str) -> float:
        try:
            real = float(value)
        except ValueError:
            real = math.nan
        if not (math.isfinite(real) and (low is None or real >= low) and (above is None or real > above)
                and (high is None or real <= high) and (below is None or real < below)):
            raise argparse.ArgumentTypeError(f"expected a number{' ' + bounds if bounds else ''}, not {value!r}")
        return real

    return convert


def text(value: str) -> str:
    """The type of a text argument that must not be empty (nor only spaces)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def regex(max_chars: int | None = None):
    """The type of a regular-expression argument, compiled; at most ``max_chars`` long if given. A bad
    pattern is a usage error (``re.error`` is not a ValueError: argparse would let it out as a traceback)."""

    def convert(value: str) -> re.Pattern:
        if max_chars is not None and len(value) > max_chars:
            raise argparse.ArgumentTypeError(f"longer than {max_chars} characters")
        try:
            return re.compile(value)
        except re.error as err:
            raise argparse.ArgumentTypeError(f"not a regular expression: {err}") from None

    return convert
