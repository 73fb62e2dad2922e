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

from collections.abc import Callable, Sequence

from uma.priority import Priority
from uma.sched.state import Phase, SessionView, Waiting

__all__ = ["demote", "give_way"]


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


def give_way(sessions: Sequence[SessionView], waiting: Sequence[Waiting], free: int,
             due: Callable[[SessionView], float]) -> tuple[int, ...]:
    """The sequences of interactive prompts still waiting for their first token that give way
    to interactive requests of their own app waiting with none free and due before them
    (Waiting.due_ns; due(s): a running one's), the one due last first, one per newcomer
    beyond the `free` sequences (which go to the newcomers due first). Set aside at the tick
    boundary as a demoted request is, it is admitted again, before any request due after it,
    prefilling only what the prefix cache lost. Never a request with a token out (a stream,
    or one set aside mid-answer), nor another app's (fair share decides between apps): a
    short question behind long prompts that hold every sequence waited for one of them to
    end."""
    newcomers = sorted((w for w in waiting if w.priority is Priority.INTERACTIVE),
                       key=lambda w: (w.due_ns, w.rid))[max(free, 0):]
    prompts = sorted((s for s in sessions if s.priority is Priority.INTERACTIVE
                      and s.phase is Phase.PREFILL and s.first_token_ns == 0),
                     key=due, reverse=True)
    given: list[int] = []
    for w in newcomers:
        victim = next((s for s in prompts if s.app == w.app and s.seq_id not in given
                       and due(s) > w.due_ns), None)
        if victim is not None:
            given.append(victim.seq_id)
    return tuple(given)
