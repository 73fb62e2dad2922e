"""The goodput rule (uma.sched.speculation): pure functions of measured prices."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.sched import speculation
from uma.sched.speculation import (
    MAX_DRAFT,
    Acceptance,
    Candidate,
    RowPrice,
    ShapeCost,
    band,
    best_length,
    draft_lengths,
    probe_period,
    steady_length,
    steady_reach,
)


def flat(chance, n=MAX_DRAFT):
    """Survival of guesses each kept with this chance, whatever came before."""
    return tuple(chance ** j for j in range(1, n + 1))


def gpu(k):  # a guess costs a sliver of a 6 ms tick
    return 0.02


def cpu(k):  # a guess costs half a 12 ms tick in a short draft, less in a long one
    return 6.0 if k < 16 else 4.5


def lone(survival, price=gpu, tick=6.0, proposed=MAX_DRAFT):
    return draft_lengths([Candidate(0, proposed, survival)], price, 1.0, tick, 0.0)


def test_a_lone_stream_on_a_gpu_drafts_deep_when_guesses_hold():
    deep = lone(flat(0.9))[0]

    def per_ms(k):
        return (1 + sum(0.9 ** j for j in range(1, k + 1))) / (6.0 + 0.02 * k)

    assert deep >= 16 and per_ms(deep) == max(per_ms(k) for k in range(MAX_DRAFT + 1))
    assert lone(flat(0.9), proposed=5) == {0: 5}


def test_depth_follows_acceptance():
    depths = [lone(flat(a)).get(0, 0) for a in (0.3, 0.6, 0.8, 0.95)]
    assert depths == sorted(depths) and depths[0] < depths[-1]


def test_nothing_is_drafted_where_guesses_fail():
    assert lone(flat(0.0)) == {}
    assert lone(flat(0.2), cpu, 12.0) == {}


def test_a_cpu_drafts_short_only_at_high_acceptance_and_long_for_a_sure_run():
    assert lone(flat(0.45), cpu, 12.0) == {}
    # a quoted passage: once the lookup is right it stays right
    sure = (0.9,) * MAX_DRAFT
    assert lone(sure, cpu, 12.0)[0] >= 16


def test_busy_streams_turn_it_off_unless_guesses_are_nearly_sure():
    """32 streams: a guess costs what one more stream's row does, 1/32 of the tick."""
    def row(k):
        return 1.0

    cands = [Candidate(s, 8, flat(0.5)) for s in range(32)]
    assert draft_lengths(cands, row, 32.0, 33.0, 0.0) == {}
    sure = [Candidate(s, 8, flat(0.999)) for s in range(32)]
    assert draft_lengths(sure, row, 32.0, 33.0, 0.0)


def test_the_tick_bound_holds():
    got = draft_lengths([Candidate(0, MAX_DRAFT, flat(0.99))], gpu, 1.0, 6.0, 6.1)
    assert 0 < got[0] < MAX_DRAFT and 6.0 + got[0] * 0.02 <= 6.1 + 1e-9


def test_the_surest_streams_get_the_rows():
    def row(k):
        return 0.5

    got = draft_lengths([Candidate(0, 8, flat(0.95)), Candidate(1, 8, flat(0.4))], row, 2.0,
                        2.0, 0.0)
    assert got.get(0, 0) > got.get(1, 0)


def test_best_length_reports_what_it_adds():
    k, gained, spent = best_length(flat(0.5), 3, gpu, 1.0, 6.0, float("inf"))
    assert k == 3 and gained == pytest.approx(0.5 + 0.25 + 0.125) and spent == pytest.approx(0.06)


@pytest.mark.parametrize("streams, probe, tick, period", [(1, 24.0, 12.0, 100),
                                                          (32, 4.0, 32.0, 200),
                                                          (1, 0.08, 6.0, 1)])
def test_probes_take_a_fixed_share_of_the_time(streams, probe, tick, period):
    assert probe_period(streams, probe, tick) == period
    assert streams * probe / period <= speculation.PROBE_SHARE * tick + 1e-9


def test_row_price_is_measured_against_plain_ticks_of_as_many_decoders():
    price = RowPrice(initial_ms=9.0)
    assert price.per_guess(1) == price.per_guess(40) == 9.0
    price.observe(1, 4, 40.0)  # no plain tick to compare with yet: nothing learned
    assert price.per_guess(4) == 9.0
    for _ in range(30):
        price.observe(1, 0, 12.0)
        price.observe(1, 2, 24.0)   # 6 ms a guess in a short draft
        price.observe(1, 20, 102.0)  # 4.5 in a long one
    assert price.plain_ms(1) == pytest.approx(12.0)
    assert price.per_guess(2) == pytest.approx(6.0, rel=0.01)
    assert price.per_guess(20) == pytest.approx(4.5, rel=0.01)
    assert price.plain_ms(3) is None


def test_agreement_bands():
    assert [band(n) for n in (0, 2, 3, 4, 7, 8, 16, 31, 32, 99)] == [0, 0, 0, 1, 1, 2, 3, 3, 4, 4]


def test_acceptance_follows_runs_of_kept_guesses():
    acc = Acceptance()
    assert acc.survival(1, "ngram", 4)[0] == speculation.FIRST_PRIOR
    for _ in range(10):
        acc.record(1, "ngram", 4, 8, 8)
    s = acc.survival(1, "ngram", 4)
    assert s[7] > 0.8
    # a position no draft reached takes the chance of the one before it
    assert s[20] / s[19] == pytest.approx(s[8] / s[7])
    # another band and another stream learn from the drafter's chances, not this stream's
    assert acc.survival(1, "ngram", 0)[0] == speculation.FIRST_PRIOR
    assert speculation.FIRST_PRIOR < acc.survival(2, "ngram", 4)[0] < s[0]


def test_acceptance_falls_where_guesses_fail():
    acc = Acceptance()
    for _ in range(20):
        acc.record(1, "ngram", 0, 4, 0)
    assert acc.survival(1, "ngram", 0)[0] < 0.1


def test_guesses_after_a_rejected_one_are_not_counted_as_tried():
    acc = Acceptance()
    acc.record(1, "ngram", 0, 8, 2)  # tried 3: two kept, the third refused, five never tried
    kept, tried = acc._own[1, 0]
    assert kept[:4] == [1, 1, 0, 0] and tried[:4] == [1, 1, 1, 0]
    acc.forget(1)
    assert not acc._own


def test_a_plain_tick_is_asked_for_when_none_was_seen_lately():
    price = RowPrice(initial_ms=1.0)
    assert price.stale(8)  # never seen: the first tick of 8 decoders runs plain
    price.observe(8, 0, 10.0)
    for _ in range(speculation.CONTROL_TICKS):
        assert not price.stale(8)
        price.observe(8, 16, 30.0)
    assert price.stale(8)
    price.observe(8, 0, 10.0)
    assert not price.stale(8)


def test_a_draft_models_steps_are_priced_with_its_guesses():
    """A draft model's guess costs its step besides its row, and any draft its catching up on
    the token kept after the last: on a CPU whose draft step costs half the target's (the
    same model quantised), only nearly sure guesses pay, and then only a long draft."""
    def model(chance, step, once=6.0, tick=19.0):
        c = Candidate(0, MAX_DRAFT, flat(chance), drafting_ms=step, drafting_once_ms=once)
        return draft_lengths([c], lambda k: 3.0, 1.0, tick, 0.0).get(0, 0)

    assert model(0.98, 10.7) >= 6  # 1.2x at best
    assert model(0.9, 10.7) == 0  # where a lookup's guesses (no step) would pay
    assert lone(flat(0.9), lambda k: 3.0, 19.0)[0] > 0
    assert model(0.98, 20.0) == 0  # a draft model as slow as the target: never
    # the once-only cost moves the break-even: the same guesses pay without it and not with
    # a large one
    assert model(0.95, 8.0, once=0.0) > 0 and model(0.95, 8.0, once=400.0) == 0
    k, gained, spent = best_length(flat(0.98), MAX_DRAFT, lambda k: 3.0, 1.0, 19.0,
                                   float("inf"), 10.7, 6.0)
    assert spent == pytest.approx(k * (3.0 + 10.7) + 6.0)


def test_a_band_not_measured_takes_the_nearest_measured_price():
    """The price before any verify is the device's bare row; once short drafts are measured
    dearer (a host-bound engine's rows cost the host more than the device), a long draft
    is not priced at the bare row."""
    p = RowPrice(0.05)
    assert p.per_guess(2) == p.per_guess(50) == 0.05
    p.observe(8, 0, 1.0)
    for _ in range(20):
        p.observe(8, 2, 1.0 + 2 * 0.3)
    assert p.per_guess(2) == pytest.approx(0.3, rel=0.01)
    assert p.per_guess(50) == p.per_guess(20) == p.per_guess(2)
    p.observe(8, 50, 1.0 + 50 * 0.1)  # a long draft measured: its band moves from there
    assert p.per_guess(2) > p.per_guess(50) > 0.1


def every_length(survival, proposed, price, tokens, ms, bound_ms, drafting=0.0, once=0.0):
    """best_length by trying every length, for comparison."""
    best, rate = (0, 0.0, 0.0), tokens / ms
    for k, gained in enumerate(itertools.accumulate(survival[:min(proposed, MAX_DRAFT)]), 1):
        spent = k * (price(k) + drafting) + once
        if ms + spent > bound_ms:
            break
        if (tokens + gained) / (ms + spent) > rate:
            best, rate = (k, gained, spent), (tokens + gained) / (ms + spent)
    return best


@settings(max_examples=300, deadline=None)
@given(chances=st.lists(st.sampled_from([0.0, 0.3, 0.9, 0.99, 1.0]) | st.floats(0.0, 1.0),
                       min_size=MAX_DRAFT, max_size=MAX_DRAFT),
       bands=st.lists(st.sampled_from([0.01, 0.1, 1.0, 6.0]) | st.floats(0.001, 10.0),
                      min_size=len(speculation.GUESS_BANDS),
                      max_size=len(speculation.GUESS_BANDS)),
       proposed=st.integers(1, MAX_DRAFT), tokens=st.floats(1.0, 64.0),
       ms=st.floats(0.5, 50.0), drafting=st.sampled_from([0.0, 0.5]),
       once=st.sampled_from([0.0, 2.0]))
def test_the_best_length_stops_looking_only_where_no_longer_draft_could_win(
        chances, bands, proposed, tokens, ms, drafting, once):
    survival = tuple(itertools.accumulate(chances, lambda a, b: a * b))
    price = RowPrice(1.0)
    price.per_band, price.measured = list(bands), [True] * len(bands)
    for bound in (math.inf, ms * 2):
        assert best_length(survival, proposed, price.per_guess, tokens, ms, bound, drafting,
                           once) == every_length(survival, proposed, price.per_guess, tokens,
                                                 ms, bound, drafting, once)


def h200(k):  # SmolLM2 on an H200, settled: up to 8 rows nearly free, a 9th doubles the tick
    return 0.11 if k < 8 else 0.2


def test_a_steady_length_is_a_power_of_two_rows_and_follows_the_chances():
    assert steady_length(flat(0.8), MAX_DRAFT, h200, 1.3) == 7  # 8 rows: the cheap ones
    assert steady_length(flat(0.99), MAX_DRAFT, h200, 1.3) == 7  # a 9th row costs more
    assert steady_length(flat(0.99), MAX_DRAFT, gpu, 6.0) in (31, 63)  # rows nearly free
    assert steady_length(flat(0.4), MAX_DRAFT, h200, 1.3) in (1, 3)
    assert steady_length(flat(0.05), MAX_DRAFT, h200, 1.3) == 0  # a filler-like chance
    assert steady_length(flat(0.8), 5, h200, 1.3) == 3  # within the room left
    assert steady_length(flat(0.4), MAX_DRAFT, cpu, 12.0) == 0  # a CPU row costs half a tick
    for room in (1, 3, 7):
        assert steady_length(flat(0.9), room, h200, 1.3) == room
    # among 32 streams (a 3 ms tick making 32 tokens) a guess pays only when nearly sure
    assert steady_length(flat(0.5), MAX_DRAFT, h200, 3.0, tokens=32) == 0
    assert steady_length(flat(0.995), MAX_DRAFT, gpu, 3.0, tokens=32) > 0  # rows nearly free


def test_a_steady_stream_reaches_one_length_past_the_longest_it_verified():
    assert [steady_reach(k) for k in (0, 1, 3, 7, 15, 31, 63)] == [1, 3, 7, 15, 31, 63, 63]
    assert steady_reach(5) == 7  # a length cut short by the room left counts as verified


def settle(shape, rows, ms, n=4):
    for _ in range(n):
        shape.observe(rows, ms)


def test_a_change_of_shape_is_priced_by_the_ticks_that_pay_for_it():
    """On an H200 a tick of a new shape runs op by op and the next captures its graph: the
    return to plain ticks after a verify cost 3.5 and 2.8 ms against 1.3 settled."""
    shape = ShapeCost()
    settle(shape, 1, 1.3)
    assert shape.settled and shape.change_ms == 0.0
    for _ in range(20):
        shape.observe(4, 5.0)  # a verify: no settled time of its shape yet, nothing learned
        shape.observe(1, 3.5)
        shape.observe(1, 2.8)
        assert not shape.settled
        shape.observe(1, 1.3)
        assert shape.settled
        assert shape.change_ms == pytest.approx(3.7, rel=0.01)  # the first change: whole
    assert shape.dear(1.3) and not shape.dear(12.0)


def test_a_cpu_pays_little_for_a_change_and_a_prompt_breaks_the_shape():
    shape = ShapeCost()
    settle(shape, 1, 10.0)
    for _ in range(20):
        shape.observe(2, 17.0)
        shape.observe(1, 10.4)
        shape.observe(1, 9.9)
    assert shape.change_ms == pytest.approx(0.3, abs=0.05)
    assert not shape.dear(10.0)
    shape.broken()  # the next decode tick of the same rows is a change after a prompt tick
    shape.observe(1, 10.0)
    assert not shape.settled


def test_a_steady_stream_controls_its_prices_rarely_where_shapes_are_dear():
    price = RowPrice(0.1)
    price.observe(1, 0, 1.3)
    assert not price.stale(1, 185)
    for _ in range(100):
        price.observe(1, 7, 2.1)
    assert price.stale(1) and not price.stale(1, 185)


def test_streams_without_verifies_of_their_own_share_their_drafters_chances():
    """One tuple for every stream its drafter's chances speak for (the speculator decides
    from it once a tick), a stream's own once it has verified guesses."""
    acc = speculation.Acceptance()
    assert acc.survival(1, "ngram", 0) is acc.survival(2, "ngram", 0)
    acc.record(1, "ngram", 0, 4, 4)
    mine, theirs = acc.survival(1, "ngram", 0), acc.survival(2, "ngram", 0)
    assert mine is not theirs and mine[3] > theirs[3]
    assert theirs is acc.survival(3, "ngram", 0)
