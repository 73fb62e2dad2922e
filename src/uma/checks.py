"""Checks of numbers a user gives, by name: the one wording of "must be a number" and "must be
an integer" that every setting and request field shares (uma.config's fields, the scheduling
knobs of uma.knobs).

bool is an int to Python, never to a user: both refuse it, so `min_prefill = true` is an error
rather than 1. Each raises InvalidRequestError naming the field and what it got instead.
"""

from __future__ import annotations

import math

from uma.errors import InvalidRequestError, kind_of, shown


def number(name: str, value: object) -> float:
    """value as a finite float, if it is an int or a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{name} must be a number, not {kind_of(value)}")
    try:
        as_float = float(value)
    except OverflowError:  # an integer beyond any float: 10**400
        bits = value.bit_length() if isinstance(value, int) else 0
        raise InvalidRequestError(f"{name} must be a finite number, not an integer of "
                                  f"{bits} bits") from None
    if not math.isfinite(as_float):
        raise InvalidRequestError(f"{name} must be finite, not {shown(value)}")
    return as_float


def integer(name: str, value: object) -> int:
    """value, if it is an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, not {kind_of(value)}")
    return value
