"""UMA Serve: one llama.cpp model, many local apps, latency-guarded continuous batching.

The names below load on first use (PEP 562), so `import uma.sched.bound` or `import uma.synth`
needs neither the compiled core nor the client's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "AsyncClient": "uma.client", "Client": "uma.client",
    "EngineConfig": "uma.config", "SamplingParams": "uma.config",
    "Engine": "uma.engine",
    "UmaError": "uma.errors",
    "Priority": "uma.priority",
    "RequestHandle": "uma.handle", "Result": "uma.handle", "TokenEvent": "uma.handle",
}

__all__ = [
    "AsyncClient", "Client", "Engine", "EngineConfig", "Priority", "RequestHandle", "Result",
    "SamplingParams", "TokenEvent", "UmaError", "__version__", "errors",
]

if TYPE_CHECKING:
    from uma import errors
    from uma.client import AsyncClient, Client
    from uma.config import EngineConfig, SamplingParams
    from uma.engine import Engine
    from uma.errors import UmaError
    from uma.handle import RequestHandle, Result, TokenEvent
    from uma.priority import Priority


def __getattr__(name: str):
    if name == "errors":
        return importlib.import_module("uma.errors")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'uma' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
