"""Speculative decoding inside the batched tick: the scheduler's side of it.

    plan = speculator.draft(plan, running, cost)   # verify items where guesses pay
    ...runner verifies them in the tick's one decode call...
    speculator.verified(plan, ran, running)        # each stream's acceptance, the metrics

A request speculates when its drafter is on (its own `speculation` option, else the engine's)
and its tokens can be checked one row at a time against its guesses: no grammar (its mask
follows each token), no repetition penalties (their history would count rejected guesses), no
top log-probabilities (one list per step). Its rows are then sampled on the host, which sees
every row of a verify item.

Which guesses a tick verifies is uma.sched.speculation's (the goodput rule); where they come from
is uma.engine.drafters'; keeping the agreed ones and removing the rejected ones' cache cells is
the runner's (uma.engine.runner).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from uma.engine.calibration import Timing
from uma.engine.draft_model import ModelDrafter
from uma.engine.drafters import NgramDrafter
from uma.engine.runner import Ran
from uma.metrics import Counter, Registry
from uma.request import Request
from uma.sched import speculation
from uma.sched.cost import CostEstimate, attended
from uma.sched.speculation import Acceptance, Candidate, RowPrice, ShapeCost
from uma.sched.state import BatchItem, Phase, Plan

# a stream's ticks since its last verify once every guess of a probe held, where held guesses
# cost less than the plain tick's tokens: its next probe is due at once (such a probe makes
# more tokens than its tick would have, and each moves its chances a step towards drafting on
# their own)
PROBE_AGAIN = 1 << 30


@dataclasses.dataclass(slots=True)
class Stream:
    """What the speculator keeps of one running request that speculates."""

    by_model: bool  # its drafter is a draft model
    # the tick (draft() calls) it last verified a guess at (None: none yet; it counts from its
    # drafter's last: _since)
    verified_at: int | None = None
    # the tick before which it has nothing to check (its chances say no and its probe is not
    # due): a tick where no one drafts then costs an attribute read a stream
    quiet_until: int = 0
    band: int = 0  # its last lookup's agreement band
    # (the tick it was asked at, whether its guesses could pay): _worth_looking
    worth: tuple[int, bool] | None = None
    # (the tick its steady length was chosen at, the length): _steady_length
    steady: tuple[int, int] | None = None
    # the longest steady length it verified (speculation.steady_reach; 0: none, the probe's
    # counts, which a stream at 0 verifies)
    steady_longest: int = 0
    misses: int = 0  # its lookups in a row that found nothing


class Speculator:
    """Drafts for the running requests that speculate. Used by the compute thread."""

    def __init__(self, default: str, metrics: Registry, n_ctx_seq: int,
                 model: ModelDrafter | None = None) -> None:
        """default: the engine's speculation ("off" or a drafter's name), for requests that
        do not choose; model: the draft model's drafter, where one is loaded."""
        self.default = default
        self.n_ctx_seq = n_ctx_seq
        self.drafters: dict[str, NgramDrafter | ModelDrafter] = {"ngram": NgramDrafter()}
        if model is not None:
            self.drafters[model.name] = model
        self._model_streams = 1  # streams the draft model last guessed for at once
        self._drafting_s = 0.0  # the draft model's time in this tick
        # rids probing this tick -> whether their guesses, if every one held, would make
        # tokens for less than a token of the plain tick costs (their next probe is then due
        # at once if they do)
        self._probing: dict[int, bool] = {}
        # drafter -> its probes in a row that kept nothing (the period doubles with each, up
        # to PROBE_BACKOFF times)
        self._probe_misses: dict[str, int] = {}
        self.acceptance = Acceptance()
        self._streams: dict[int, Stream] = {}  # rid -> a running request that speculates
        # drafter -> the tick any of its streams last verified a guess at, or it was first used
        self._drafter_verified: dict[str, int] = {}
        self.prices: RowPrice | None = None  # what guesses cost (calibrated, then measured)
        self.shape = ShapeCost()  # what a change of the tick's rows costs (measured)
        self._settled_only = False  # prices learn from settled ticks only (changes are dear)
        self._ticks = 0  # draft() calls
        # the tick before which every stream is quiet (0: one may be due): such a tick costs
        # two reads, not a pass over the streams (at 32 streams of random text on an H200 the
        # pass alone took a few percent of each tick)
        self._asleep_until = 0
        # this tick's answers from chances that streams share (Acceptance.survival gives every
        # stream without verifies of its own its drafter's tuple; 32 streams of a fresh
        # drafter ask the same): (id(survival), room) -> steady length, and (id(survival),
        # room, drafting ms, once ms) -> whether guesses could pay
        self._steady_lengths: dict[tuple[int, int], int] = {}
        self._worth: dict[tuple[int, int, float, float], bool] = {}
        self.drafted = metrics.family("spec_drafted_tokens_total",
                                      "guesses verified in a target pass", "drafter",
                                      Counter)
        self.accepted = metrics.family("spec_accepted_tokens_total",
                                       "verified guesses the model agreed with", "drafter",
                                       Counter)
        self.passes = metrics.family("spec_verify_passes_total",
                                     "streams' ticks that verified guesses", "drafter",
                                     Counter)
        self.model_seconds = metrics.counter("spec_draft_model_seconds_total",
                                             "time the draft model spent guessing")
        self.streams = metrics.gauge("spec_streams_drafting",
                                     "streams that verified guesses in the last tick")
        self.eligible = metrics.gauge("spec_streams_eligible",
                                      "decoding streams whose requests speculate")

    @property
    def speculating(self) -> bool:
        """Whether any running request speculates (else the tick skips the speculator)."""
        return bool(self._streams)

    def admit(self, req: Request) -> None:
        """Sets the drafter of a request that is given a sequence (None: it does not
        speculate)."""
        req.drafter = self.drafter_of(req)
        if req.drafter is not None:
            self._streams[req.rid] = Stream(isinstance(self.drafters[req.drafter],
                                                       ModelDrafter))
            self._asleep_until = 0

    def drafter_of(self, req: Request) -> str | None:
        """The drafter the request speculates with (None: it does not)."""
        chosen = req.params.speculation or self.default
        if chosen == "off" or chosen not in self.drafters:
            return None
        p = req.params
        if req.matcher is not None or p.top_logprobs or p.repeat_penalty != 1 \
                or p.frequency_penalty or p.presence_penalty:
            return None
        return chosen

    def draft(self, plan: Plan, running: Mapping[int, Request], cost: CostEstimate,
              capacity: int, device_rows: Callable[[int], int]) -> Plan:
        """The plan with verify items for the decoders whose guesses pay, and a probe (a
        short draft) for a stream that has verified none for its probe period (unchanged if
        none). Where some decoder of the plan does not speculate, or a prompt shares the tick,
        the tick stays within the policy's latency line: guesses must not lengthen others'
        gaps past it. A stream that speculates alone trades only its own. capacity: the
        batch's tokens; device_rows(seq): the rows a sequence's device sampler may have (0: it
        is sampled on the host)."""
        if self._ticks + 1 < self._asleep_until:  # every stream quiet: nothing to look at
            self._ticks += 1
            self.streams.set(0)
            return plan
        self._steady_lengths.clear()
        self._worth.clear()
        drafted = self._draft(plan, running, cost, capacity, device_rows)
        self._asleep_until = min((s.quiet_until for s in self._streams.values()), default=0)
        return drafted

    def _draft(self, plan: Plan, running: Mapping[int, Request], cost: CostEstimate,
               capacity: int, device_rows: Callable[[int], int]) -> Plan:
        wanted = [(k, running[i.seq_id]) for k, i in enumerate(plan.items)
                  if i.phase is Phase.DECODE and i.seq_id in running
                  and running[i.seq_id].rid in self._streams]
        self.eligible.set(len(wanted))
        if not wanted:
            self.streams.set(0)
            return plan
        self._ticks += 1
        prices = self._prices(cost)
        expected = sum(1 for i in plan.items if i.logits)
        shared = len(wanted) < len(plan.items)
        plain = None if shared else prices.plain_ms(len(wanted))
        steady = plain is not None and self.shape.dear(plain) \
            and not (len(self.drafters) > 1
                     and any(self._streams[r.rid].by_model for _, r in wanted))
        # a control tick: plain, to compare with (where shapes are dear, a plain run long
        # enough to settle, as rarely as PROBE_SHARE of the time allows)
        period = self._control_period(plain) if steady and plain \
            else speculation.CONTROL_TICKS
        if not shared and prices.stale(len(wanted), period):
            self.streams.set(0)
            return plan
        tick = plain or self._predicted(plan, running, cost)
        if steady:
            return self._draft_steady(plan, wanted, prices, tick, capacity, device_rows)
        notes = plan.notes
        bound = notes.line_ms if shared and notes is not None and notes.line_ms > 0 else 0.0
        candidates: list[Candidate] = []
        guesses: dict[int, np.ndarray] = {}
        probing: dict[int, int] = {}  # seq -> a probe's guesses
        for _, req in wanted:
            name = req.drafter
            assert name is not None
            drafter = self.drafters[name]
            stream = self._streams[req.rid]
            if stream.quiet_until > self._ticks:
                continue
            since = self._since(req, stream)
            room = self._room(req, device_rows)
            if room <= 0:
                continue
            drafting, once = self._drafting_ms(drafter)
            worth = self._worth_looking(req, stream, room, prices, expected, tick, bound,
                                        drafting, once)
            per_guess = prices.per_guess(speculation.PROBE_DRAFT) + drafting
            wait = 0 if worth or shared else self._probe_wait(
                req, drafter, since, len(wanted), per_guess, tick)
            probe = not worth and not shared and wait == 0
            if not worth and not probe:
                if not shared:  # nothing to check before its probe or its chances' next look
                    assert stream.worth is not None  # set by _worth_looking
                    self._quiet(stream, wait, stream.worth[0])
                continue
            if probe:
                self._probing[req.rid] = per_guess < tick / max(expected, 1)
            if isinstance(drafter, ModelDrafter):  # lengths chosen first, then drafted
                stream.band = 0
                if worth:
                    candidates.append(Candidate(req.seq_id, room, self.acceptance.survival(
                        req.rid, name, 0), drafting, once))
                else:
                    probing[req.seq_id] = min(room, speculation.PROBE_DRAFT)
                continue
            found, agreement = drafter.propose(
                req, room if worth else min(room, speculation.PROBE_DRAFT))
            if not len(found):
                self._missed(stream)
                continue
            stream.misses = 0
            guesses[req.seq_id] = found
            stream.band = band = speculation.band(agreement)
            if worth:
                survival = self.acceptance.survival(req.rid, name, band)
                candidates.append(Candidate(req.seq_id, len(found), survival))
            else:
                probing[req.seq_id] = len(found)
        lengths = speculation.draft_lengths(candidates, prices.per_guess, expected, tick, bound)
        for c in candidates:  # its lookup's band does not pay: not looked up again for a while
            if c.seq_id not in lengths:
                self._streams[running[c.seq_id].rid].worth = (self._ticks, False)
        lengths.update(probing)  # a probe: a short draft where the chances gave none
        self._drafted_by_model(lengths, guesses, running, tick)
        self.streams.set(len(lengths))
        if not lengths:
            return plan
        items = list(plan.items)
        free = capacity - plan.n_tokens
        for k, req in wanted:
            n = min(lengths.get(req.seq_id, 0), free)
            free -= n
            if n:
                self._verified(req, self._streams[req.rid])
                draft = tuple(int(t) for t in guesses[req.seq_id][:n])
                items[k] = dataclasses.replace(items[k], n_tokens=1 + n, draft=draft)
        return dataclasses.replace(plan, items=tuple(items))

    def _room(self, req: Request, device_rows: Callable[[int], int]) -> int:
        """The most guesses the request may verify this tick: within its max_tokens, its
        context and its device sampler's rows."""
        on_device = device_rows(req.seq_id)
        return min(speculation.MAX_DRAFT, req.params.max_tokens - req.n_sampled - 1,
                   self.n_ctx_seq - 1 - req.n_past,
                   on_device - 1 if on_device else speculation.MAX_DRAFT)

    def _draft_steady(self, plan: Plan, wanted: Sequence[tuple[int, Request]],
                      prices: RowPrice, tick: float, capacity: int,
                      device_rows: Callable[[int], int]) -> Plan:
        """Where a change of the tick's rows costs more than a plain tick (ShapeCost): each
        stream verifies its steady length every tick, the lookup's guesses filled out with the
        last of them (or the stream's last token), so that the ticks keep one shape. A filler
        is a guess like any other, kept only where the model agrees; its row is priced in the
        length's measured chances. A stream that did not verify last tick starts (or probes)
        only on a guess its lookup found: fillers alone are seldom kept, and a start costs two
        changes (on an H200 a fresh daemon's streams of random text, starting on their
        drafter's first chances, ran a tenth slower)."""
        items = list(plan.items)
        free = capacity - plan.n_tokens
        drafting = 0
        tokens = sum(1 for i in plan.items if i.logits)
        for k, req in wanted:
            stream = self._streams[req.rid]
            if stream.quiet_until > self._ticks:
                continue
            n = min(self._steady_length(req, stream, self._room(req, device_rows), prices,
                                        tick, tokens), free)
            if n <= 0:
                continue
            drafter = self.drafters[req.drafter or ""]
            assert not isinstance(drafter, ModelDrafter)  # a steady stream's is a lookup
            found, _ = drafter.propose(req, n)
            if not len(found) and stream.verified_at != self._ticks - 1:
                # looked up again when its length is next chosen: a lookup each tick for
                # each of 32 streams of random text cost an H200's ticks a seventh
                stream.quiet_until = self._ticks + speculation.QUIET_TICKS
                continue
            guesses = [int(t) for t in found[:n]]
            last = guesses[-1] if guesses else req.generated[-1] if req.generated \
                else int(req.prompt[-1])
            draft = tuple(guesses) + (last,) * (n - len(guesses))
            stream.band = speculation.STEADY_BAND
            self._verified(req, stream)
            stream.steady_longest = max(stream.steady_longest, n)
            items[k] = dataclasses.replace(items[k], n_tokens=1 + n, draft=draft)
            free -= n
            drafting += 1
        self.streams.set(drafting)
        return dataclasses.replace(plan, items=tuple(items)) if drafting else plan

    def _steady_length(self, req: Request, stream: Stream, room: int, prices: RowPrice,
                       tick: float, tokens: int) -> int:
        """The stream's steady length (speculation.steady_length) in a tick of `tokens` rows
        sampled, chosen again every QUIET_TICKS ticks (each change of it costs a change of
        shape); at 0, a probe of the shortest length now and then, its period counting the
        two changes it makes, and the stream is left quiet until its probe or its next choice
        (asking 32 streams every tick cost a GPU's millisecond ticks more than a tenth)."""
        probe = speculation.STEADY_LENGTHS[1]
        at, length = stream.steady or (-speculation.QUIET_TICKS, 0)
        if self._ticks - at >= speculation.QUIET_TICKS:
            reach = speculation.steady_reach(stream.steady_longest or probe)
            survival = self.acceptance.survival(req.rid, req.drafter or "",
                                                speculation.STEADY_BAND)
            key = (id(survival), min(room, reach))
            length = self._steady_lengths.get(key, -1)
            if length < 0:
                length = self._steady_lengths[key] = speculation.steady_length(
                    survival, min(room, reach), prices.per_guess, tick, tokens)
            at = self._ticks
            stream.steady = (at, length)
        if length:
            return min(length, room)
        since = self._since(req, stream)
        cost = probe * prices.per_guess(probe) + 2 * self.shape.change_ms
        wait = self._probe_period(req, tokens, cost, tick) - since
        if wait <= 0:
            self._probing[req.rid] = False
            return min(probe, room)
        self._quiet(stream, wait, at)
        return 0

    def _missed(self, stream: Stream) -> None:
        """Its lookup found nothing: it looks again after 1, 2, 4, then QUIET_TICKS ticks
        while it keeps finding nothing. Text that repeats its input is found again within a
        few tokens; random text (32 streams on an H200, each looked up every tick) cost a few
        percent of every tick in lookups that found nothing."""
        stream.misses += 1
        stream.quiet_until = self._ticks + min(1 << (stream.misses - 1),
                                               speculation.QUIET_TICKS)

    def _quiet(self, stream: Stream, wait: int, asked: int) -> None:
        """Leaves the stream until its probe is due (`wait` ticks) or its chances are next
        looked at (QUIET_TICKS after `asked`), whichever is first."""
        stream.quiet_until = self._ticks + max(1, min(
            wait, asked + speculation.QUIET_TICKS - self._ticks))

    def _since(self, req: Request, stream: Stream) -> int:
        """Ticks since the stream last verified a guess. A new stream counts from its
        drafter's last verify (any stream's): probes are the only way chances that said no
        can say yes again, and where the probe period is longer than a request (a GPU's dear
        changes make it hundreds of ticks), a drafter whose chances said no was never probed
        again, request after request."""
        at = stream.verified_at
        if at is None:
            at = stream.verified_at = self._drafter_verified.setdefault(req.drafter or "",
                                                                        self._ticks - 1)
        return self._ticks - at

    def _verified(self, req: Request, stream: Stream) -> None:
        stream.verified_at = self._drafter_verified[req.drafter or ""] = self._ticks

    def _control_period(self, plain: float) -> int:
        """Ticks between plain runs where shapes are dear: each leaves the steady shape and
        comes back (two changes), held to PROBE_SHARE of the ticks' time."""
        cost = 2 * self.shape.change_ms + speculation.SETTLE_TICKS * plain
        return max(speculation.CONTROL_TICKS,
                   math.ceil(cost / (speculation.PROBE_SHARE * plain)))

    def _drafting_ms(self, drafter: NgramDrafter | ModelDrafter) -> tuple[float, float]:
        """What making each guess costs, and what making any does: a draft model's step (shared
        by the streams that last drafted together) and its catching up on the token the
        stream kept after its guesses; a lookup's, nothing."""
        if isinstance(drafter, ModelDrafter):
            return drafter.price_per_guess(self._model_streams), drafter.token_ms
        return 0.0, 0.0

    def _probe_wait(self, req: Request, drafter: NgramDrafter | ModelDrafter, since: int,
                    streams: int, per_guess_ms: float, tick: float) -> int:
        """Ticks until the stream's probe is due (0: now): `since` ticks past its last verify,
        against a period that keeps probes to PROBE_SHARE of the ticks' time. A draft model's
        first probe also pays once for reading the stream's prompt, which its catching up
        costs (what the stream wrote meanwhile is not charged: starting at once would have
        read it too): where reading is dear, as on a CPU, a long prompt's stream is probed
        late."""
        cost = speculation.PROBE_DRAFT * per_guess_ms
        wait = self._probe_period(req, streams, cost, tick) - since
        if wait <= 0 and isinstance(drafter, ModelDrafter) and drafter.behind(req) > 2:
            cost += len(req.prompt) * drafter.token_ms
            wait = self._probe_period(req, streams, cost, tick) - since
        return max(wait, 0)

    def _probe_period(self, req: Request, streams: int, cost: float, tick: float) -> int:
        """speculation.probe_period, doubled for each of the drafter's probes in a row that
        kept nothing (up to PROBE_BACKOFF times)."""
        misses = self._probe_misses.get(req.drafter or "", 0)
        return speculation.probe_period(streams, cost, tick) << min(
            misses, speculation.PROBE_BACKOFF)

    def _drafted_by_model(self, lengths: dict[int, int], guesses: dict[int, np.ndarray],
                          running: Mapping[int, Request], tick: float) -> None:
        """The guesses of the streams whose drafter is a model, as many as chosen: drafted now,
        every stream's in the same decode calls. A stream whose draft is still catching up
        has none this tick (and stays chosen, to catch up the next)."""
        for name, drafter in self.drafters.items():
            if not isinstance(drafter, ModelDrafter):
                continue
            asks = [(running[seq], k) for seq, k in lengths.items()
                    if running[seq].drafter == name]
            if not asks:
                continue
            t0 = time.perf_counter()
            got = drafter.propose_many(asks, tick)
            spent = time.perf_counter() - t0
            self.model_seconds.inc(spent)
            self._drafting_s += spent
            self._model_streams = max(len(got), 1)
            for req, _ in asks:
                found = got.get(req.seq_id)
                if found is None or not len(found):
                    del lengths[req.seq_id]
                else:
                    guesses[req.seq_id] = found
                    lengths[req.seq_id] = min(lengths[req.seq_id], len(found))

    def _worth_looking(self, req: Request, stream: Stream, room: int, prices: RowPrice,
                       expected: float, tick: float, bound: float, drafting: float,
                       once: float) -> bool:
        """Whether the best a full draft of the stream's could make (in its surest band of
        agreement) pays: when even that does not, there is nothing to look up. Asked again
        every QUIET_TICKS ticks, and after each of its verifies: on a GPU's tick of a
        millisecond or two, asking every stream every tick cost more than the guesses won."""
        cached = stream.worth
        if cached is not None and self._ticks - cached[0] < speculation.QUIET_TICKS:
            return cached[1]
        drafter = req.drafter or ""
        best = max((self.acceptance.survival(req.rid, drafter, b)
                    for b in range(len(speculation.AGREEMENT_BANDS))), key=lambda s: s[0])
        key = (id(best), room, drafting, once)
        worth = self._worth.get(key)
        if worth is None:
            worth = self._worth[key] = speculation.best_length(
                best, room, prices.per_guess, expected, tick, bound or math.inf, drafting,
                once)[0] > 0
        stream.worth = (self._ticks, worth)
        return worth

    def _prices(self, cost: CostEstimate) -> RowPrice:
        if self.prices is None:  # no timing of the device: the cost model's row
            self.prices = RowPrice(cost.per_decode_ms)
        return self.prices

    def calibrated(self, timing: Timing) -> None:
        """Starts the guesses' price at one more decode row's and what a change of shape costs
        at the change's, as the device was timed (uma.engine.calibration); a timing without
        them prices a row from its scratch ticks ((prompt tokens, decode rows, ..., ms)): the
        most decode rows against one."""
        plain = {d: ms for p, d, _, _, ms in timing.ticks if p == 0 and d > 0}
        if timing.row_ms is not None and 1 in plain:
            self.prices = RowPrice(max(timing.row_ms, 0.01 * plain[1]))
        elif 1 in plain and len(plain) > 1:
            most = max(plain)
            self.prices = RowPrice(max((plain[most] - plain[1]) / (most - 1), 0.01 * plain[1]))
        if timing.change_ms is not None:
            self.shape.timed(timing.change_ms)
            # dear from the start: prices learn from settled ticks only
            self._settled_only = 1 in plain and self.shape.dear(plain[1])

    def measured(self, plan: Plan, tick_ms: float) -> None:
        """A tick's measured time, for the guesses' price: only ticks of decoders alone, less
        the draft model's time in it (priced apart: its catching up would count as a plain
        tick's, its guesses twice)."""
        drafting_ms, self._drafting_s = self._drafting_s * 1e3, 0.0
        if self.prices is None or not self._streams or not plan.items:
            return
        if any(i.phase is not Phase.DECODE for i in plan.items):
            self.shape.broken()
            return
        tick_ms -= drafting_ms
        self.shape.observe(plan.n_tokens, tick_ms)
        plain = self.prices.plain_ms(len(plan.items))
        if not self._settled_only and plain is not None and self.shape.dear(plain):
            # changes are dear: the prices so far counted them in, and are measured again
            self._settled_only = True
            self.prices = RowPrice(self.prices.initial_ms)
        if self._settled_only and not self.shape.settled:
            return  # a tick that pays for a change is no measure of its rows
        self.prices.observe(len(plan.items), plan.n_drafted, tick_ms)

    @staticmethod
    def _predicted(plan: Plan, running: Mapping[int, Request], cost: CostEstimate) -> float:
        """The plan's time as the policy priced it, or as the cost model prices its rows."""
        if plan.notes is not None and plan.notes.predicted_ms > 0:
            return plan.notes.predicted_ms
        prefill = decode = kv = 0
        for item in plan.items:
            req = running.get(item.seq_id)
            if req is None:
                continue
            if item.phase is Phase.DECODE:
                decode += 1
                kv += attended(req.n_past, 1)
            else:
                prefill += item.n_tokens
                kv += req.n_past
        return cost.predict(prefill, decode, kv)

    def verified(self, plan: Plan, ran: Ran, running: Mapping[int, Request]) -> None:
        """Records what the tick's verify items kept (before the tokens are applied)."""
        if not ran.accepted:
            self._probing.clear()
            return
        for item in plan.items:
            if not item.draft:
                continue
            req = running.get(item.seq_id)
            kept = ran.accepted.get(item.seq_id)
            if req is None or req.drafter is None or kept is None:
                continue
            stream = self._streams.get(req.rid)
            self.acceptance.record(req.rid, req.drafter, stream.band if stream else 0,
                                   len(item.draft), kept)
            if stream is not None:
                stream.worth = None  # its chances moved: asked again next tick
                stream.quiet_until = 0
                if kept == len(item.draft) and self._probing.get(req.rid, False):
                    stream.verified_at = -PROBE_AGAIN  # all held, and held guesses pay
            if kept:  # the drafter's text repeats somewhere: probes at their period again
                self._probe_misses[req.drafter] = 0
            elif req.rid in self._probing:
                self._probe_misses[req.drafter] = self._probe_misses.get(req.drafter, 0) + 1
            self.drafted.child(req.drafter).inc(len(item.draft))
            self.accepted.child(req.drafter).inc(kept)
            self.passes.child(req.drafter).inc()
        self._probing.clear()

    def forget(self, req: Request) -> None:
        """The request left its sequence (ended or preempted)."""
        self._streams.pop(req.rid, None)
        self._asleep_until = 0  # the next tick counts the streams left (the eligible gauge)
        if req.drafter is not None:
            self.drafters[req.drafter].forget(req.rid)
            self.acceptance.forget(req.rid)

    def warm_up(self) -> None:
        """Times a draft model's step before serving (on the compute thread): its first decode
        builds its graphs, a stall that would otherwise fall in a stream's first probe."""
        for drafter in self.drafters.values():
            if isinstance(drafter, ModelDrafter):
                drafter.step_ms  # noqa: B018 - timed once, on first read

    def close(self) -> None:
        for drafter in self.drafters.values():
            if isinstance(drafter, ModelDrafter):
                drafter.close()

    @staticmethod
    def undrafted(plan: Plan) -> Plan:
        """The plan without its guesses (a batch the KV cache has no room for is tried again
        so before anything is shed for it)."""
        if not plan.n_drafted:
            return plan
        return dataclasses.replace(plan, items=tuple(
            BatchItem(i.seq_id, i.phase, 1, i.logits) if i.draft else i for i in plan.items))
