"""App identity: who sent a request, for fair share between apps (uma.sched.fair) and the
per-app metrics. A name is what an app declares (the socket's `app` field, HTTP's `X-App` or
`user`, `Engine.submit(app=...)`), else its process's (uma.server.peers: 'python3:4242'), else
its connection's; a weight scales its share."""

from __future__ import annotations

import math
import re

from uma.errors import InvalidRequestError, kind_of, shown

DEFAULT_APP = "default"  # an Engine caller that names none
MAX_WEIGHT = 1000.0
# Shown in metrics labels and `uma ps`: printable, no quotes, spaces or braces.
_NAME = re.compile(r"[A-Za-z0-9._:@/+-]{1,64}")


def app_name(value: object, field: str = "app") -> str:
    """A checked app name; InvalidRequestError naming `field` otherwise."""
    if type(value) is not str:
        raise InvalidRequestError(f"{field} must be a string, not {kind_of(value)}")
    if not _NAME.fullmatch(value):
        raise InvalidRequestError(
            f"{field} must be 1-64 characters of letters, digits and ._:@/+-, not {shown(value)}")
    return value


def app_weight(value: object, field: str = "weight") -> float:
    """A checked weight: a finite number in (0, MAX_WEIGHT]."""
    if type(value) not in (int, float):
        raise InvalidRequestError(f"{field} must be a number, not {kind_of(value)}")
    weight = float(value)  # type: ignore[arg-type]
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise InvalidRequestError(f"{field} must be in (0, {MAX_WEIGHT:g}], not {shown(value)}")
    return weight
