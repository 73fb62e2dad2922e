"""The words of messages: what a caller sent, named and quoted in the project's words."""

from __future__ import annotations

import pytest

from uma.errors import SHOWN_CHARS, kind_of, shown


@pytest.mark.parametrize(("value", "kind"), [
    (None, "null"), (True, "a boolean"), (3, "an integer"), (1.5, "a number"),
    ("x", "a string"), (b"x", "binary data"), ([1], "a list"), ((1,), "a list"),
    ({"a": 1}, "a map"), ({1}, "a set"),  # the last only from Python callers
])
def test_kinds_are_named_as_json_and_msgpack_name_them(value, kind):
    assert kind_of(value) == kind


@pytest.mark.parametrize(("value", "text"), [
    (None, "null"), (False, "false"), (7, "7"), (-(2**63), str(-(2**63))),
    (2**64 - 1, str(2**64 - 1)), (2**64, "an integer of 65 bits"),
    (10**4000, "an integer of 13288 bits"),  # str() of it would raise past 4300 digits
    (1e308, "1e+308"), ("\ud800", "'\\ud800'"), ("x" * 1000, repr("x" * 61) + "..."),
    ([1] * 10**6, "a list"), ({"k": "v" * 10**6}, "a map"),
])
def test_shown_values_are_short_and_printable(value, text):
    assert shown(value) == text
    assert len(shown(value)) <= SHOWN_CHARS + 5
    shown(value).encode("utf-8")  # a lone surrogate is shown escaped, so it can go out
