"""Which connection to admit, and which idle one to close to make room for it: the connection
policy both doors share, the socket daemon per peer process and the HTTP gateway per peer
address. A pure function over a snapshot of the open connections; the doors do the closing.

One client could lock everyone out at the caps (64 idle socket connections refused `uma status`
for the idle timeout; 64 HTTP connections sending a byte a second got even `/health` a 503).
So the cap is shared fairly, and never shuts out an operator:

* One peer holds at most `per_peer` of the connections. A peer at its share gets room by
  closing its own longest-idle connection, if it has one.
* At the cap, a newcomer gets room by closing an idle connection: one of the peer that holds
  the most, its longest idle first. A connection with a request in flight is never closed
  for room; slow senders are the timeouts' to cut.
* With no idle connection to close, the newcomer goes to a small reserve beyond the cap, where
  it may only ask for health, metrics and `stop` (`/health`, `/metrics`): an operator and a
  load balancer always get an answer. The reserve is shared the same way, one connection a
  peer: its connections are answered at once, so a newcomer there finds one idle to close.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)

RESERVE = 4  # connections beyond the cap, for health, metrics and stop only


@dataclass(frozen=True)
class Held:
    """An open connection, as the policy sees it."""

    peer: Hashable | None  # who holds it: a process id, an address; None: unknown (on its own)
    idle_since: float | None  # since when it has had no request in flight; None: one is
    reserved: bool = False  # admitted to the reserve: health, metrics and stop only


@dataclass(frozen=True)
class Caps:
    total: int  # regular connections at once (max_connections, http_max_connections)
    per_peer: int  # of those, what one peer may hold
    reserve: int = RESERVE  # beyond total, for health, metrics and stop only
    reserve_per_peer: int = 1  # of those, what one peer may hold

    @classmethod
    def of(cls, total: int) -> Caps:
        """The caps for a connection limit: one peer may hold three quarters of it (at least
        one), so that others always find a quarter; on loopback HTTP all of this machine's
        clients are one address, which must still be able to use most of the limit."""
        return cls(total, max(1, total * 3 // 4))


@dataclass(frozen=True)
class Admission:
    verdict: Literal["admit", "reserve", "refuse"]  # reserve: health, metrics and stop only
    close: object = None  # the key of an idle connection to close first, to make room
    full: Literal["", "peer", "total"] = ""  # which cap kept it from a regular connection


def admit(held: Mapping[K, Held], peer: Hashable | None, caps: Caps) -> Admission:
    """Where a new connection of `peer` goes, given the connections `held` (by key, closing
    ones left out), and which one to close first to make room for it."""
    # (each result is named before it is unpacked: mypy infers K | None for K otherwise)
    regular = _room({k: h for k, h in held.items() if not h.reserved}, peer, caps.total,
                    caps.per_peer)
    room, close, full = regular
    if room:
        return Admission("admit", close)
    spare = _room({k: h for k, h in held.items() if h.reserved}, peer, caps.reserve,
                  caps.reserve_per_peer)
    room, close, _ = spare
    if room:
        return Admission("reserve", close, full)
    return Admission("refuse", None, full)


def _room(pool: dict[K, Held], peer: Hashable | None, total: int,
          per_peer: int) -> tuple[bool, K | None, Literal["", "peer", "total"]]:
    """(whether the pool takes one more of peer's, the connection to close for it, which cap
    is full)."""
    idle = {k: h.idle_since for k, h in pool.items() if h.idle_since is not None}
    mine = [k for k, h in pool.items() if peer is not None and h.peer == peer]
    if len(mine) >= per_peer:
        own = [k for k in mine if k in idle]
        close = min(own, key=idle.__getitem__) if own else None
        return close is not None, close, "peer"
    if len(pool) < total:
        return True, None, ""
    if not idle:
        return False, None, "total"
    # The peer holding the most gives up its longest idle; peers unknown count one each.
    holding = collections.Counter(_who(k, h) for k, h in pool.items())
    return True, min(idle, key=lambda k: (-holding[_who(k, pool[k])], idle[k])), "total"


def _who(key: object, held: Held) -> object:
    return held.peer if held.peer is not None else ("unknown", key)
