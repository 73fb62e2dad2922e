"""A request's class, the vocabulary every layer shares: the scheduler's lanes, the wire
protocol's `priority` field, the HTTP gateway's X-UMA-Priority header, per-class metrics."""

from __future__ import annotations

import enum

from uma.errors import InvalidRequestError, shown


class Priority(enum.Enum):
    INTERACTIVE = "interactive"  # a person is watching the stream
    BACKGROUND = "background"  # batch jobs, agents: throughput matters, latency less

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        if isinstance(value, Priority):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidRequestError(
                f"priority must be 'interactive' or 'background', not {shown(value)}") from None
