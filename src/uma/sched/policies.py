"""The policies by name, for configuration (`--policy`)."""

from __future__ import annotations

from typing import Any

from uma.config import EngineConfig
from uma.errors import InvalidRequestError
from uma.sched.baseline import BaselinePolicy
from uma.sched.bound import BoundPolicy
from uma.sched.policy import BatchPolicy

POLICIES: dict[str, type[BaselinePolicy] | type[BoundPolicy]] = {
    "baseline": BaselinePolicy, "bound": BoundPolicy}


def create_policy(name: str, config: EngineConfig | None = None,
                  **options: Any) -> BatchPolicy:
    """The policy registered under `name`, built from an EngineConfig or from `options`."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise InvalidRequestError(
            f"unknown policy: {name!r} (known: {', '.join(POLICIES)})") from None
    return cls.from_config(config) if config is not None else cls(**options)
