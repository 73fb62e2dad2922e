"""Fair share between apps: which queued request gets a free KV sequence, and which running
one to park so that an app that just arrived does not wait behind another's flood.

Every request carries its app (the socket's `app` field or its connection, HTTP's `user` or
`X-App`, `Engine.submit(app=...)`) and the app's weight. Within a class (interactive before
background, as before), sequences go to the app holding the fewest per unit of weight, first
come first served within an app: with one app this is exactly first come, first served; with
several, a flood of one app's requests takes only the sequences nobody else asks for
(work-conserving). Each tick's batch serves every running sequence, so an app's share of the
tick follows the sequences it holds, and the service it receives is accounted in the cost
model's milliseconds (uma.tick_stats, per app).

Admission alone cannot help an app that finds every sequence taken: it would wait for one of
the flood's requests to end. `park` picks, at a tick boundary, running requests of apps above
their share (of the same or a lower class) to go back to the queue, so that each waiting app
below its share gets one at the next admission. A parked request keeps its KV in the prefix
cache where it can, resumes first in its app's turn, and produces the tokens it would have
(greedy output is identical; tests/test_fair.py).

A share is the sequences in use divided among the apps that want them, in proportion to their
weights: n_slots × w / Σw over apps running or waiting, rounded down but at least one, so that
with more apps than sequences, the apps over one park for those with none (the number of
sequences no longer caps the number of apps served, though with as many apps as sequences
each holds one at a time).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from uma.sched.state import Priority, SessionView, Waiting


def _class(priority: Priority) -> int:
    return 0 if priority is Priority.INTERACTIVE else 1


def shares(sessions: Sequence[SessionView], waiting: Sequence[Waiting],
           n_slots: int) -> dict[str, int]:
    """Each app's share of the n_slots sequences: in proportion to its weight among the apps
    running or waiting, rounded down, at least one."""
    weight: dict[str, float] = {}
    for app, w in [(s.app, s.weight) for s in sessions] + [(q.app, q.weight) for q in waiting]:
        weight[app] = max(weight.get(app, 0.0), w)
    total = sum(weight.values())
    return {app: max(1, math.floor(n_slots * w / total)) for app, w in weight.items()}


def admit_fairly(waiting: Sequence[Waiting], free: int,
                 sessions: Sequence[SessionView] = ()) -> tuple[int, ...]:
    """Which queued requests get the `free` sequences (request ids, in order): interactive
    before background; within a class, each next one from the app holding the fewest
    sequences per unit of weight (counting those just given), ties to the app whose request
    came first; first come, first served within an app."""
    held = Counter(s.app for s in sessions)
    queues: dict[tuple[int, str], list[Waiting]] = defaultdict(list)
    for w in sorted(waiting, key=lambda w: w.rid):
        queues[(_class(w.priority), w.app)].append(w)
    chosen: list[int] = []
    for klass in (0, 1):
        apps = [app for (k, app) in queues if k == klass]
        while apps and len(chosen) < free:
            app = min(apps, key=lambda a: (held[a] / queues[(klass, a)][0].weight,
                                           queues[(klass, a)][0].rid))
            w = queues[(klass, app)].pop(0)
            chosen.append(w.rid)
            held[app] += 1
            if not queues[(klass, app)]:
                apps.remove(app)
    return tuple(chosen)


def park(sessions: Sequence[SessionView], waiting: Sequence[Waiting], free: int,
         n_slots: int) -> tuple[int, ...]:
    """Running requests to send back to the queue (sequence ids) so that each app waiting
    below its share gets a sequence at the next admission: only where no free one is left
    for it, taken from the app furthest above its share, in the same or a lower class than
    the waiting request (never an interactive one for background work), its newest request
    first (the least progress to set aside)."""
    share = shares(sessions, waiting, n_slots)
    held = Counter(s.app for s in sessions)
    first: dict[str, Waiting] = {}  # each waiting app's first request
    for w in sorted(waiting, key=lambda w: (_class(w.priority), w.rid)):
        first.setdefault(w.app, w)
    parked: list[int] = []
    spare = free
    for app, w in sorted(first.items(), key=lambda kv: (_class(kv[1].priority), kv[1].rid)):
        if held[app] >= share[app]:
            continue
        if spare > 0:  # admission gives it one without parking anyone
            spare -= 1
            held[app] += 1
            continue
        victims = [s for s in sessions if s.seq_id not in parked
                   and held[s.app] > share[s.app] and _class(s.priority) >= _class(w.priority)]
        if not victims:
            continue
        victim = max(victims, key=lambda s: (held[s.app] - share[s.app], _class(s.priority),
                                             s.rid))
        parked.append(victim.seq_id)
        held[victim.app] -= 1
        held[app] += 1
    return tuple(parked)
