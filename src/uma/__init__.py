"""UMA Serve: one llama.cpp model, many local apps, latency-guarded continuous batching."""

from uma import errors
from uma.config import SamplingParams
from uma.errors import UmaError

__all__ = ["SamplingParams", "UmaError", "errors", "__version__"]
__version__ = "0.1.0"
