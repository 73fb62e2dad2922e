"""Demotion at a token boundary: background requests give their KV sequences to interactive
requests that would otherwise wait for one.

Every sequence may hold a background request (a batch job that came first) when an
interactive request arrives; admission alone would keep the newcomer queued until one of them
ended, which for a long job is minutes. At the next tick boundary the scheduler sends as many
background requests back to the queue as interactive ones wait beyond the free sequences. A
request set aside keeps what it has done: its cells go to the prefix cache, it keeps its
generated tokens, and once a sequence is free it is admitted again (before any newer
background request) and continues where it stopped, prefilling only what the cache lost.
"""

from __future__ import annotations

from collections.abc import Sequence

from uma.priority import Priority
from uma.sched.state import SessionView, Waiting

__all__ = ["demote"]


def demote(sessions: Sequence[SessionView], waiting: Sequence[Waiting], free: int
           ) -> tuple[int, ...]:
    """The sequences of running background requests to send back to the queue so that the
    interactive requests waiting get one each (with `free` sequences free now): the ones with
    the fewest KV positions first (the least to prefill again if the cache cannot keep their
    cells), the newest on a tie. Never an interactive request; none while the free sequences
    suffice."""
    short = sum(w.priority is Priority.INTERACTIVE for w in waiting) - free
    if short <= 0:
        return ()
    background = sorted((s for s in sessions if s.priority is Priority.BACKGROUND),
                        key=lambda s: (s.n_past, -s.rid))
    return tuple(s.seq_id for s in background[:short])
