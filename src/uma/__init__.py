"""UMA Serve: one llama.cpp model, many local apps, latency-guarded continuous batching."""

from uma import errors
from uma.client import AsyncClient, Client
from uma.config import EngineConfig, SamplingParams
from uma.engine import Engine
from uma.errors import UmaError
from uma.handle import RequestHandle, Result, TokenEvent

__all__ = [
    "AsyncClient", "Client", "Engine", "EngineConfig", "RequestHandle", "Result",
    "SamplingParams", "TokenEvent", "UmaError", "errors", "__version__",
]
__version__ = "0.1.0"
