"""The C heap of a long-lived process that loads and unloads models (glibc's malloc; elsewhere
nothing to do).

glibc gives each thread that allocates while another holds the heap's lock an arena of its own
(up to eight per core), and keeps what is freed in each for reuse. A model's load and its
threads allocate hundreds of megabytes: after 20 load and unload cycles of Gemma 3 270M beside
SmolLM2 the daemon's resident memory had grown 6.6 % past the first cycle's, in steps as new
threads took new arenas; with two arenas and the freed heap handed back after each unload,
0.4 % (docs/results/several-models.md).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
ARENAS = 2

_libc: Any = None  # the process's C library where it has glibc's calls, False otherwise


def _glibc() -> Any:
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform == "linux":
            try:
                lib = ctypes.CDLL(None)
                lib.malloc_trim, lib.mallopt  # noqa: B018 - both, or neither is used
                _libc = lib
            except (AttributeError, OSError):  # musl: neither
                pass
    return _libc


def limit_arenas(n: int = ARENAS) -> None:
    """At most n arenas from now on (call before the threads start)."""
    lib = _glibc()
    if lib:
        lib.mallopt(_M_ARENA_MAX, n)


def trim() -> None:
    """Hands the freed heap of every arena back to the system (after a model is unloaded)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)
