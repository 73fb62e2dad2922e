"""The engine: one model, one context, many requests, one tick at a time.

* engine.py: uma.Engine, the requests' way in, the compute and output threads;
* scheduler.py: owns the requests and decides each tick (`schedule`, `update`);
* runner.py: runs what the scheduler ordered (batch, decode, sample), decides nothing;
* background.py, prefix_cache.py, snapshots.py, calibration.py, tick_stats.py, output.py:
  the background context, the prefix cache's KV tier and its snapshots, the start-up timing,
  the tick's statistics, the output stage; prefix_index.py: the prefix cache's pure
  bookkeeping.

`Engine` loads on first use (PEP 562), so importing one of the modules here (the pure
uma.engine.prefix_index, say) loads no more than it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["Engine"]

if TYPE_CHECKING:
    from uma.engine.engine import Engine


def __getattr__(name: str) -> object:
    if name != "Engine":
        raise AttributeError(f"module 'uma.engine' has no attribute {name!r}")
    value = importlib.import_module("uma.engine.engine").Engine
    globals()[name] = value  # later lookups skip this function
    return value
