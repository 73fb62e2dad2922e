"""Synthetic sessions for the policies' tests: a SessionView from a few numbers, and the same
session after a tick ran its batch item."""

from __future__ import annotations

import dataclasses

from uma.sched.state import Phase, Priority, SessionView

INT, BG = Priority.INTERACTIVE, Priority.BACKGROUND


def session(seq, priority, phase, *, prompt=20, prefilled=None, generated=1, n_past=None):
    prefilled = prompt if phase is Phase.DECODE else (prefilled or 0)
    return SessionView(seq_id=seq, rid=seq, phase=phase, priority=priority, n_prompt=prompt,
                       n_prefilled=prefilled, n_generated=generated,
                       n_past=n_past if n_past is not None else prefilled, arrival_ns=seq,
                       first_token_ns=0, last_token_ns=0)


def advanced(s: SessionView, item) -> SessionView:
    """The session after a tick ran its batch item: a prompt chunk, or a decoded token."""
    if item.phase is Phase.PREFILL:
        done = s.n_prefilled + item.n_tokens
        return dataclasses.replace(s, n_prefilled=done, n_past=done,
                                   phase=Phase.DECODE if done >= s.n_prompt else Phase.PREFILL)
    return dataclasses.replace(s, n_past=s.n_past + 1, n_generated=s.n_generated + 1)
