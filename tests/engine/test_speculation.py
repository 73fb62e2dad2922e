"""Speculative decoding inside the batched tick, on the real core and a tiny synthetic model.

A drafter that knows the model's greedy answer (with every third guess wrong) stands in for a
lucky n-gram lookup, and the goodput rule is set aside so every guess is verified: what is
checked is the verification itself (kept guesses, removed cells, stops and cancels inside a
draft), not whether guesses pay (tests/sched/test_speculation.py).
"""

import itertools

import numpy as np
import pytest

import uma
from uma.engine.calibration import Timing
from uma.errors import InvalidRequestError
from uma.sched import speculation

from ..helpers import assert_same_greedy

PROMPTS = ["Once upon a time, in a land far away, there lived a",
           "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
           "def main():\n    return 0"]
N = 24


@pytest.fixture(scope="module")
def alone(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        return {p: e.generate(p, max_tokens=N, ignore_eos=True, logprobs=True) for p in PROMPTS}


class Oracle:
    """Guesses the greedy answer it was given, every third guess made wrong."""

    name = "ngram"

    def __init__(self, answers):
        self.answers = answers  # prompt length -> token ids (the prompts differ in length)
        self.proposed = 0

    def propose(self, req, k):
        answer = self.answers[len(req.prompt)]
        start = len(req.generated)
        guess = np.array(answer[start:start + k], np.int32)
        guess[2::3] = (guess[2::3] + 1) % 64
        self.proposed += len(guess)
        return guess, 8

    def forget(self, rid):
        pass


@pytest.fixture(params=["off", "on"], ids=["host-sampled", "device-sampled"])
def engine(tiny_path, alone, monkeypatch, request):
    """An engine whose streams speculate with the oracle on every tick, checking after every
    tick that each running sequence's cells end where its request says (n_past)."""
    monkeypatch.setattr(speculation, "best_length",
                        lambda survival, proposed, *a: (min(proposed, 5), 1.0, 1.0))
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=4, speculation="ngram",
                    device_sampling=request.param) as e:
        e.wait_ready()
        sched = e._scheduler
        lengths = {}
        with e._using_model():
            for p, r in alone.items():
                lengths[len(e._tokens(p, True))] = list(r.token_ids)
        oracle = Oracle(lengths)
        sched.speculator.drafters["ngram"] = oracle
        update, bad = sched.update, []

        def checked(order, ran):
            update(order, ran)
            for seq, req in sched.running.items():
                if req.n_prefilled >= len(req.tokens) and \
                        sched.ctx.seq_pos_max(seq) != req.n_past - 1:
                    bad.append((req.rid, sched.ctx.seq_pos_max(seq), req.n_past))

        sched.update = checked
        e.oracle, e.bad_positions = oracle, bad
        yield e
    assert not bad, f"cells past n_past after a verify: {bad}"


def metric(e, name):
    return sum(e.snapshot()[name].values())


def test_kept_guesses_give_the_greedy_answer(engine, alone):
    results = [engine.submit(p, max_tokens=N, ignore_eos=True, logprobs=True).result(60)
               for p in PROMPTS]
    for p, r in zip(PROMPTS, results, strict=True):
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
        assert r.usage.completion_tokens == N and r.finish_reason == "length"
    drafted, kept = metric(engine, "spec_drafted_tokens_total"), \
        metric(engine, "spec_accepted_tokens_total")
    # every third guess is wrong, so a verify keeps at most two
    assert drafted > 0 and 0 < kept < drafted
    passes = metric(engine, "spec_verify_passes_total")
    assert kept <= 2 * passes


def test_speculating_and_plain_streams_share_ticks(engine, alone):
    handles = [engine.submit(p, max_tokens=N, ignore_eos=True, logprobs=True,
                             speculation="ngram" if i % 2 else "off")
               for i, p in enumerate(PROMPTS * 2)]
    for h, p in zip(handles, PROMPTS * 2, strict=True):
        r = h.result(60)
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)
    assert metric(engine, "spec_verify_passes_total") > 0


def test_max_tokens_reached_inside_a_draft(engine, alone):
    for n in (1, 2, 3, 4, 7):
        r = engine.submit(PROMPTS[0], max_tokens=n, ignore_eos=True, logprobs=True).result(60)
        assert r.usage.completion_tokens == n and r.finish_reason == "length"
        assert_same_greedy(alone[PROMPTS[0]].token_ids[:n], r.token_ids,
                           alone[PROMPTS[0]].logprobs[:n], r.logprobs)


def test_a_stop_string_inside_an_accepted_draft(engine, alone, tiny_path):
    text = alone[PROMPTS[1]].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    want = text[:text.index(stop)]
    r = engine.submit(PROMPTS[1], max_tokens=N, ignore_eos=True, stop=[stop]).result(60)
    assert r.finish_reason == "stop" and r.text == want


def test_a_request_cancelled_between_verifies_leaves_the_others_exact(engine, alone):
    victim = engine.submit(PROMPTS[0], max_tokens=500, ignore_eos=True)
    others = [engine.submit(p, max_tokens=N, ignore_eos=True, logprobs=True)
              for p in PROMPTS[1:]]
    for event in victim:
        if len(event.token_ids):
            victim.cancel()
            break
    assert victim.result(60).finish_reason == "cancelled"
    for h, p in zip(others, PROMPTS[1:], strict=True):
        r = h.result(60)
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs, r.logprobs)


def steady_drafts(engine, monkeypatch, length, n):
    """The guesses each tick verified for one greedy request of n tokens, where changes of
    the tick's rows are dear and the steady length is length(room), after checking the
    answer is the greedy one."""
    monkeypatch.setattr(speculation.ShapeCost, "dear", lambda self, plain_ms: True)
    monkeypatch.setattr(speculation, "steady_length", lambda survival, room, *a: length(room))
    sched = engine._scheduler
    sched.trace = trace = []
    r = engine.submit(PROMPTS[2], max_tokens=n, ignore_eos=True, logprobs=True).result(60)
    sched.trace = None
    ref = engine.generate(PROMPTS[2], max_tokens=n, ignore_eos=True, logprobs=True,
                          speculation="off")
    assert_same_greedy(ref.token_ids, r.token_ids, ref.logprobs, r.logprobs)
    return [plan.n_drafted for n_pre, *_, plan in trace if not n_pre and plan.n_drafted]


def test_where_shapes_are_dear_a_stream_verifies_one_length_filled_out(engine, monkeypatch):
    """Where a change of the tick's rows costs more than a plain tick (CUDA's graphs), a lone
    stream verifies its steady length every tick: a lookup that finds two guesses is filled
    out to seven, and the answer is still the greedy one."""
    propose = engine.oracle.propose
    monkeypatch.setattr(engine.oracle, "propose", lambda req, k: propose(req, min(k, 2)))
    drafted = steady_drafts(engine, monkeypatch, lambda room: min(7, room), 40)
    # seven a tick (the 2 guesses, 5 fillers), until fewer tokens are left to make
    assert drafted[:3] == [7, 7, 7]
    sevens = next((i for i, d in enumerate(drafted) if d < 7), len(drafted))
    assert set(drafted[:sevens]) == {7}, drafted
    assert drafted[sevens:] == sorted(drafted[sevens:], reverse=True), drafted


def test_a_steady_stream_starts_on_a_found_guess_and_then_fills_out_what_it_lacks(
        engine, monkeypatch):
    """Where shapes are dear, a stream starts verifying only once its lookup finds a guess
    (fillers alone are seldom kept, and starting costs two changes of shape); once started,
    ticks where the lookup finds nothing are filled out, keeping the shape."""
    propose = engine.oracle.propose
    found_none = [range(0, 12), range(20, 30)]  # tokens generated while the lookup finds none
    monkeypatch.setattr(engine.oracle, "propose", lambda req, k: propose(req, k) if not any(
        len(req.generated) in r for r in found_none) else (np.zeros(0, np.int32), 0))
    monkeypatch.setattr(speculation.ShapeCost, "dear", lambda self, plain_ms: True)
    monkeypatch.setattr(speculation, "steady_length", lambda survival, room, *a: min(3, room))
    sched = engine._scheduler
    sched.trace = trace = []
    engine.generate(PROMPTS[2], max_tokens=60, ignore_eos=True)
    sched.trace = None
    drafted = [plan.n_drafted for n_pre, *_, plan in trace if not n_pre]
    first = next(i for i, d in enumerate(drafted) if d)
    # no verify while the first 12 tokens found nothing (a decode tick makes one token)
    assert first >= 11, drafted
    # then three a tick, through the second stretch without a guess, until the tail
    assert set(drafted[first:first + 12]) == {3}, drafted


def test_a_steady_stream_climbs_to_longer_drafts_one_length_at_a_time(engine, monkeypatch):
    """A draft length never verified is judged on chances carried over from shorter ones: a
    stream whose rule would take any length takes the next one past the longest it verified,
    a step at a time (a jump from 7 guesses to 63 cost an H200 stream half its speed)."""
    drafted = steady_drafts(engine, monkeypatch, lambda room: room, 120)
    plateaus = [d for k, d in enumerate(drafted) if k == 0 or d != drafted[k - 1]]
    assert plateaus[:3] == [7, 15, 31], drafted


def test_a_device_timed_dear_before_serving_runs_its_first_request_steady(engine, monkeypatch):
    """A change's cost timed before serving (uma.engine.calibration) tells the speculator that
    shapes are dear before the first request: its stream verifies one length from its first
    settled plain tick on, rather than following its lookup tick by tick until a change is
    measured (on an H200 a fresh daemon's first requests ran that way at 3.7 ms a tick)."""
    sched = engine._scheduler
    plain = min(ms for p, d, _, _, ms in sched.timing.ticks if (p, d) == (0, 1))
    assert not sched.speculator.shape.dear(plain)  # a CPU's changes are cheap
    sched.speculator.calibrated(Timing(sched.timing.ticks, change_ms=1e6))
    monkeypatch.setattr(speculation, "steady_length", lambda survival, room, *a: min(7, room))
    sched.trace = trace = []
    engine.generate(PROMPTS[2], max_tokens=40, ignore_eos=True)
    sched.trace = None
    drafted = [plan.n_drafted for n_pre, *_, plan in trace if not n_pre]
    # plain until the plain tick is known (settled), then seven a tick (the rule, patched in
    # the fixture, would take five), until fewer tokens are left
    first = next(i for i, d in enumerate(drafted) if d)
    assert 0 < first <= 4 and drafted[first:first + 3] == [7, 7, 7], drafted


def test_a_steady_stream_that_drafts_nothing_is_left_quiet_between_its_checks(engine,
                                                                          monkeypatch):
    """A stream whose steady length is 0 is looked at again only when its probe or its next
    choice of length is due, not every tick: at 32 streams of random text on an H200 the
    looks alone cost more than a tenth of the ticks' time."""
    monkeypatch.setattr(speculation.ShapeCost, "dear", lambda self, plain_ms: True)
    monkeypatch.setattr(speculation, "steady_length", lambda *a: 0)  # the chances say no
    looks = []
    monkeypatch.setattr(speculation, "probe_period", lambda *a: looks.append(1) or 10**6)
    sched = engine._scheduler
    sched.trace = trace = []
    engine.generate(PROMPTS[2], max_tokens=48, ignore_eos=True)
    sched.trace = None
    ticks = sum(1 for n_pre, *_ in trace if not n_pre)
    assert ticks >= 40 and 0 < len(looks) <= ticks // speculation.QUIET_TICKS + 1, \
        (ticks, len(looks))


def test_a_drafter_that_said_no_is_probed_again_across_requests_shorter_than_its_period(
        engine, monkeypatch):
    """Where chances say no, only a probe can say yes again; its period (hundreds of ticks
    where changes are dear) runs from the drafter's last verify, not each request's start:
    a day of requests each shorter than the period still probes."""
    monkeypatch.setattr(speculation.ShapeCost, "dear", lambda self, plain_ms: True)
    monkeypatch.setattr(speculation, "steady_length", lambda *a: 0)  # the chances say no
    monkeypatch.setattr(speculation, "probe_period", lambda *a: 30)

    def drafted(n):
        before = sum(engine.snapshot()["spec_drafted_tokens_total"].values())
        engine.generate(PROMPTS[2], max_tokens=n, ignore_eos=True)
        return sum(engine.snapshot()["spec_drafted_tokens_total"].values()) - before

    assert drafted(20) == 0  # 20 ticks: within the period
    assert drafted(20) > 0  # 40 ticks since the drafter's last verify (none): a probe


def test_prices_are_measured_again_on_settled_ticks_once_changes_turn_out_dear():
    """Before a change of shape is known to be dear, a verify's first tick (which pays for
    the change) priced its guess at 3.7 ms where settled guesses cost 0.1: the prices
    start again, and learn from settled ticks only."""
    from uma.engine.speculator import Speculator, Stream
    from uma.metrics import Registry
    from uma.sched.state import BatchItem, Phase, Plan

    spec = Speculator("ngram", Registry(), 4096)
    spec.prices = speculation.RowPrice(0.05)
    spec._streams[1] = Stream(by_model=False)  # a request that speculates is running

    def tick(guesses, ms):
        spec.measured(Plan((BatchItem(0, Phase.DECODE, 1 + guesses, True,
                                      draft=(7,) * guesses),)), ms)

    for _ in range(4):
        tick(0, 1.3)
    tick(1, 5.0)  # a verify, unsettled: its guess priced at 3.7 ms while nothing is known
    assert spec.prices.per_guess(1) > 1.0
    tick(0, 3.5)
    tick(0, 2.8)  # the change back is measured: dearer than a plain tick
    assert spec.shape.dear(1.3)
    assert spec.prices.per_guess(1) == 0.05 and spec.prices.plain_ms(1) is None
    for _ in range(3):
        tick(0, 1.3)
    tick(7, 9.0)
    tick(7, 5.0)  # the change to seven: paid for, not a price
    assert spec.prices.per_guess(7) == 0.05
    for _ in range(30):
        tick(7, 2.0)  # settled verifies of seven: 0.1 ms a guess
    assert spec.prices.plain_ms(1) == pytest.approx(1.3)
    assert spec.prices.per_guess(7) == pytest.approx(0.1, rel=0.01)


def test_a_tick_where_every_stream_is_quiet_passes_over_none_and_a_newcomer_wakes_it(
        monkeypatch):
    """Streams whose chances say no are looked at every QUIET_TICKS ticks; between looks a
    tick passes over none of them (at 32 streams on an H200 the pass alone cost a few percent
    of each tick). A stream admitted meanwhile is looked at on its first tick."""
    from uma.config import SamplingParams
    from uma.engine.speculator import Speculator
    from uma.metrics import Registry
    from uma.request import Request
    from uma.sched.state import BatchItem, Phase, Plan, Priority

    monkeypatch.setattr(speculation, "steady_length", lambda *a: 0)  # the chances say no
    monkeypatch.setattr(speculation, "probe_period", lambda *a: 10**6)
    spec = Speculator("ngram", Registry(), 4096)
    spec.prices = speculation.RowPrice(0.05)
    spec.shape.timed(100.0)  # changes are dear: each stream's steady length is chosen
    running, passes, looks = {}, [], []
    whole, look = spec._draft, spec._steady_length
    spec._draft = lambda *a: passes.append(spec._ticks) or whole(*a)
    spec._steady_length = lambda req, *a: looks.append((spec._ticks, req.rid)) or look(req, *a)

    def start(seq):
        req = Request(seq + 1, np.arange(8, dtype=np.int32) + 8 * seq,
                      SamplingParams(max_tokens=100), Priority.INTERACTIVE, 0)
        req.seq_id, req.n_past = seq, 8
        spec.admit(req)
        running[seq] = req

    def tick():
        spec.prices.observe(len(running), 0, 1.0)  # a plain tick of these streams: 1 ms
        plan = Plan(tuple(BatchItem(s, Phase.DECODE, 1, True) for s in running))
        assert spec.draft(plan, running, None, 512, lambda seq: 0) is plan

    start(0)
    for _ in range(20):
        tick()
    assert [rid for _, rid in looks] == [1, 1, 1]  # ticks 1, 9 and 17
    assert len(passes) == 3, passes  # the other 17 ticks passed over no stream
    start(1)
    tick()
    assert looks[-1] == (21, 2)  # the newcomer, on its first tick
    spec.forget(running.pop(0))
    tick()
    assert passes[-1] == 21  # a release: the next tick counts the streams left
    assert spec.eligible.value == 1


def test_a_stream_whose_lookups_find_nothing_looks_less_often_until_one_finds(monkeypatch):
    """Where guesses would pay, a stream looks its text up each tick; one that keeps finding
    nothing (random text) looks again after 1, 2, 4, then QUIET_TICKS ticks, and every
    tick once a lookup finds a guess again."""
    from uma.config import SamplingParams
    from uma.engine.speculator import Speculator
    from uma.metrics import Registry
    from uma.request import Request
    from uma.sched.state import BatchItem, Phase, Plan, Priority

    spec = Speculator("ngram", Registry(), 4096)
    spec.prices = speculation.RowPrice(0.05)  # a guess is cheap: worth looking for
    looks, finds = [], [False]

    class Lookup:
        name = "ngram"

        def propose(self, req, k):
            looks.append(spec._ticks)
            return np.full(1 if finds[0] else 0, 5, np.int32), 8

        def forget(self, rid):
            pass

    spec.drafters["ngram"] = Lookup()
    req = Request(1, np.arange(8, dtype=np.int32), SamplingParams(max_tokens=1000),
                  Priority.INTERACTIVE, 0)
    req.seq_id, req.n_past = 0, 8
    spec.admit(req)

    def tick():
        spec.prices.observe(1, 0, 1.0)  # a plain tick: 1 ms
        spec.draft(Plan((BatchItem(0, Phase.DECODE, 1, True),)), {0: req}, None, 512,
                   lambda seq: 0)

    for _ in range(30):
        tick()
    assert looks == [1, 2, 4, 8, 16, 24], looks
    finds[0] = True
    for _ in range(10):
        tick()
    assert looks[6:8] == [32, 33], looks  # found at 32: looked up each tick after


def test_a_drafter_whose_probes_keep_nothing_probes_less_often_until_a_guess_holds(
        monkeypatch):
    """Where chances say no, each probe that keeps nothing doubles the drafter's probe period,
    up to PROBE_BACKOFF times, so that where text never repeats probes cost a fraction of
    PROBE_SHARE; a kept guess brings the period back."""
    from uma.config import SamplingParams
    from uma.engine.runner import Ran
    from uma.engine.speculator import Speculator
    from uma.metrics import Registry
    from uma.request import Request
    from uma.sched.state import BatchItem, Phase, Plan, Priority

    monkeypatch.setattr(speculation, "steady_length", lambda *a: 0)  # the chances say no
    monkeypatch.setattr(speculation, "probe_period", lambda *a: 4)
    spec = Speculator("ngram", Registry(), 4096)
    spec.prices = speculation.RowPrice(0.05)
    spec.shape.timed(100.0)  # changes are dear: each stream's steady length is chosen

    class Lookup:
        name = "ngram"

        def propose(self, req, k):
            return np.full(k, 5, np.int32), 8

        def forget(self, rid):
            pass

    spec.drafters["ngram"] = Lookup()
    req = Request(1, np.arange(8, dtype=np.int32), SamplingParams(max_tokens=10**4),
                  Priority.INTERACTIVE, 0)
    req.seq_id, req.n_past = 0, 8
    spec.admit(req)
    probes, keeps = [], [0]

    def tick():
        spec.prices.observe(1, 0, 1.0)  # a plain tick: 1 ms
        plan = spec.draft(Plan((BatchItem(0, Phase.DECODE, 1, True),)), {0: req}, None, 512,
                          lambda seq: 0)
        if plan.n_drafted:
            probes.append(spec._ticks)
        spec.verified(plan, Ran(plan, 0.0, accepted={0: keeps[0]} if plan.n_drafted else {}),
                      {0: req})

    for _ in range(140):
        tick()
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[:5] == [8, 16, 32, 32, 32], probes  # 4 << 1, 2, 3, then no further
    keeps[0] = 1
    for _ in range(40):
        tick()
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[-2:] == [4, 4], probes  # a guess held: the period is back


def test_sampling_with_temperature_verifies_too(engine):
    r = engine.submit(PROMPTS[0], max_tokens=N, ignore_eos=True, temperature=0.8,
                      seed=3).result(60)
    assert r.usage.completion_tokens == N
    assert metric(engine, "spec_verify_passes_total") > 0


def test_requests_that_cannot_speculate_do_not(engine):
    """Penalties count every sampled row, top log-probabilities are one list a step, a grammar
    follows each token: such requests decode a token a tick."""
    before = engine.oracle.proposed
    engine.submit(PROMPTS[0], max_tokens=8, ignore_eos=True, repeat_penalty=1.3).result(60)
    engine.submit(PROMPTS[0], max_tokens=8, ignore_eos=True, top_logprobs=2).result(60)
    engine.submit(PROMPTS[0], max_tokens=8, ignore_eos=True, speculation="off").result(60)
    assert engine.oracle.proposed == before


def test_the_option_is_checked(tiny_path):
    with pytest.raises(InvalidRequestError, match="speculation must be one of off, ngram"):
        uma.SamplingParams(speculation="eagle")
    with pytest.raises(InvalidRequestError, match="speculation must be one of"):
        uma.EngineConfig(model=str(tiny_path), speculation="yes")
