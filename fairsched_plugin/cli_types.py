"""Argument types for the ``fairsched`` tools' sizes, rates and limits.

A count of zero or a negative rate is refused by argparse itself, as ``argument --repeat:
must be >= 1, not 0``, before a verb imports vLLM or builds anything: without these, such
a value reached the work and failed there (an empty run matrix, a division by zero) with a
traceback, or ran on silently. Only the standard library here, so ``fairsched --help``
stays fast.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer type refusing values below ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer >= {minimum}, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, not {value}")
        return value

    return parse


positive_int = at_least(1)
"""A count or a size: an integer >= 1."""


def positive_float(text: str) -> float:
    """A rate, a ratio, a time: a finite number > 0 (NaN and infinity are refused, as
    every comparison with NaN is false and a check downstream would pass it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text}")
    return value

