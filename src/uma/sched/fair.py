"""Fair share between apps: which queued request gets a free KV sequence, and which running
one to park so that an app that just arrived does not wait behind another's flood.

Every request carries its app (the socket's `app` field, HTTP's `X-App` or `user`,
`Engine.submit(app=...)`, else the process that sent it: uma.server.peers) and the app's
weight. What each app has received is kept in the scheduler's own unit, tick time: each tick's
measured time is shared out among the apps as the cost model prices their rows (prompt tokens
and decode rows), divided by the app's weight (the `Ledger`; the virtual token counter of Sheng
et al., OSDI 2024, in milliseconds rather than tokens). An app that had no request running or
queued starts no lower than the least served of the apps that have: an idle app banks no
credit, and a newcomer starts level with the apps it now shares the ticks with.

* Admission: within a class (interactive before background, as before), each free sequence
  goes to the least served app per unit of weight, counting the prompts it is given this tick
  at their predicted cost; ties to the app holding the fewest sequences per unit of weight,
  then to the earlier request; first come, first served within an app. With one app this is
  first come, first served; a flood takes every sequence nobody else asks for
  (work-conserving).
* Parking: admission alone cannot help an app that finds every sequence taken. `park` picks,
  at a tick boundary, a running request to go back to the queue for each app waiting below
  its share with none free: from an app above its share that has been served at least as
  much, else (time-slicing, where apps outnumber sequences) from an app served more than
  `quantum_ms` beyond it; of the same or a lower class, its newest request first. A parked
  request keeps its KV in the prefix cache where it can, resumes in its app's turn, and
  produces the tokens it would have (greedy output is identical; tests/test_fair_share.py).

A share is the sequences divided among the apps that want them, in proportion to their
weights: n_slots × w / Σw over apps running or waiting, rounded down but at least one. Two
backlogged apps' service differs by at most about one quantum plus what one admission adds
(a prompt's prefill): docs/design/scheduling.md.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence

from uma.sched.state import Priority, SessionView, Waiting

NO_SERVICE: Mapping[str, float] = {}
FIRST_QUANTUM_MS = 250.0  # the time-slice before any request has ended
MIN_QUANTUM_MS = 5.0  # no shorter: a slice must outlast a few ticks
DECAY = 0.98


class Ledger:
    """Each app's service so far: tick ms shared out by the cost model's price of its rows,
    per unit of weight. Kept by the scheduler; the policy steps below read `served`."""

    def __init__(self) -> None:
        self.served: dict[str, float] = {}
        self.weights: dict[str, float] = {}  # each app's, as its latest request gave it
        # The service of the largest recent request, decaying by DECAY a request; half of it
        # is the time-slice, so that two apps' service stays within about one and a half
        # such requests whatever a request costs on this device (the same request costs ten
        # times more on a CPU than on a data-centre GPU).
        self.largest_request_ms = 2 * FIRST_QUANTUM_MS

    def ended(self, service_ms: float) -> None:
        """A request ended after `service_ms` of tick time."""
        self.largest_request_ms = max(2 * MIN_QUANTUM_MS, service_ms,
                                      self.largest_request_ms * DECAY)

    @property
    def quantum_ms(self) -> float:
        """The time-slice: half the largest recent request's service."""
        return self.largest_request_ms / 2

    def charge(self, parts: Mapping[str, float], tick_ms: float) -> None:
        """Shares tick_ms among the apps in proportion to `parts` (the cost model's ms for
        each app's rows; evenly where it prices every row at nothing)."""
        total = sum(parts.values())
        for app, part in parts.items():
            share = part / total if total > 0 else 1 / len(parts)
            self.served[app] = self.served.get(app, 0.0) \
                + tick_ms * share / self.weights.get(app, 1.0)

    def arrive(self, app: str, weight: float, active: Collection[str]) -> None:
        """A request of `app` is queued; `active`: the apps with a request running or queued
        before it. An app not among them starts no lower than the least served of them (with
        none, everyone starts afresh). Apps gone idle that would start there anyway are
        forgotten, so the ledger holds only apps it tells apart."""
        self.weights[app] = weight
        if app in active:
            return
        if not active:
            self.served.clear()
            self.weights = {app: weight}
            return
        floor = min(self.served.get(a, 0.0) for a in active)
        keep = {a for a, v in self.served.items() if a in active or v > floor} | {app}
        self.served = {a: v for a, v in self.served.items() if a in keep}
        self.weights = {a: w for a, w in self.weights.items() if a in keep or a in active}
        self.served[app] = max(self.served.get(app, 0.0), floor)


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


def admit_fairly(waiting: Sequence[Waiting], free: int, sessions: Sequence[SessionView] = (),
                 served: Mapping[str, float] = NO_SERVICE,
                 prompt_ms: float = 0.0) -> tuple[int, ...]:
    """Which queued requests get the `free` sequences (request ids, in order): interactive
    before background; within a class, each next one from the least served app, counting
    the prompts given this tick at prompt_ms a token per unit of weight; ties to the app
    holding the fewest sequences per unit of weight, then to the earlier request; within an
    app the one due first first (Waiting.due_ns; all 0: first come, first served)."""
    held = Counter(s.app for s in sessions)
    given: dict[str, float] = defaultdict(float)
    queues: dict[tuple[int, str], list[Waiting]] = defaultdict(list)
    for w in sorted(waiting, key=lambda w: (w.due_ns, w.rid)):
        queues[(_class(w.priority), w.app)].append(w)
    chosen: list[int] = []
    def turn(queue: list[Waiting]) -> tuple[float, float, int]:
        head = queue[0]
        return served.get(head.app, 0.0) + given[head.app], held[head.app] / head.weight, head.rid

    for klass in (0, 1):
        apps = [app for (k, app) in queues if k == klass]
        while apps and len(chosen) < free:
            app = min(apps, key=lambda a: turn(queues[(klass, a)]))  # noqa: B023 - used here
            w = queues[(klass, app)].pop(0)
            chosen.append(w.rid)
            held[app] += 1
            given[app] += prompt_ms * w.n_prompt / w.weight
            if not queues[(klass, app)]:
                apps.remove(app)
    return tuple(chosen)


def park(sessions: Sequence[SessionView], waiting: Sequence[Waiting], free: int,
         n_slots: int, served: Mapping[str, float] = NO_SERVICE,
         quantum_ms: float = math.inf) -> tuple[int, ...]:
    """Running requests to send back to the queue (sequence ids), where no free sequence is
    left for a waiting app: for an app below its share, from the app furthest above its share
    among those served at least as much; for any waiting app, from the most served app ahead
    of it by more than quantum_ms (time-slicing: between apps that outnumber the sequences,
    and against an app whose requests cost more each). In the same or a lower class than the
    waiting request (never an interactive one for background work), the newest request first
    (the least progress to set aside)."""
    share = shares(sessions, waiting, n_slots)
    held = Counter(s.app for s in sessions)
    first: dict[str, Waiting] = {}  # each waiting app's first request
    for w in sorted(waiting, key=lambda w: (_class(w.priority), w.rid)):
        first.setdefault(w.app, w)

    def level(app: str) -> float:
        return served.get(app, 0.0)

    parked: list[int] = []
    spare = free
    for app, w in sorted(first.items(),
                         key=lambda kv: (_class(kv[1].priority), level(kv[0]), kv[1].rid)):
        if spare > 0:  # admission gives one out without parking anyone
            spare -= 1
            held[app] += 1
            continue
        mine, below = level(app), held[app] < share[app]
        victims = [s for s in sessions if s.seq_id not in parked and s.app != app
                   and _class(s.priority) >= _class(w.priority)
                   and ((below and held[s.app] > share[s.app] and level(s.app) >= mine)
                        or level(s.app) - mine > quantum_ms)]
        if not victims:
            continue
        victim = max(victims, key=lambda s: (held[s.app] > share[s.app],
                                             held[s.app] - share[s.app], level(s.app),
                                             _class(s.priority), s.rid))
        parked.append(victim.seq_id)
        held[victim.app] -= 1
        held[app] += 1
    return tuple(parked)
