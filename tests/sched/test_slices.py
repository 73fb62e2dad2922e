"""uma.sched.slices: when a background context's requests may run, as pure functions."""

import pytest

from uma.sched.slices import Slice, SliceKnobs, SliceView, background_slice, owed_after

KNOBS = SliceKnobs(fill=1.0, background_share=0.15, pause_factor=1.8, pause_share=0.04,
                   idle_ms=100.0)


def view(**over):
    base = dict(streams=True, prompt_next=False, tick_ms=5.0, alone_p95_ms=12.0, min_ms=4.0,
                owed_ms=0.0, since_pause=0)
    return SliceView(**{**base, **over})


def test_with_no_interactive_request_background_runs_idle_ticks():
    assert background_slice(view(streams=False), KNOBS) == Slice(100.0)
    # a least useful tick longer than the idle budget still runs
    assert background_slice(view(streams=False, min_ms=150.0), KNOBS) == Slice(150.0)


def test_a_slice_fills_the_streams_gap_up_to_their_p95_alone():
    assert background_slice(view(), KNOBS) == Slice(7.0)  # 12 - 5
    assert background_slice(view(), SliceKnobs(fill=1.1)).ms == pytest.approx(8.2)


def test_no_fill_beside_a_prompt_or_where_the_least_tick_does_not_fit():
    assert background_slice(view(prompt_next=True), KNOBS) == Slice(0.0)
    assert background_slice(view(min_ms=7.5), KNOBS) == Slice(0.0)


def test_what_filling_does_not_pay_is_paid_in_spaced_pauses():
    owed = dict(prompt_next=True, owed_ms=20.0)
    # 1.8 x 12 - 5 = 16.6 ms, once 25 ticks (1 / 0.04) have passed since the last
    assert background_slice(view(**owed, since_pause=25), KNOBS) == Slice(
        pytest.approx(16.6), pause=True)
    assert background_slice(view(**owed, since_pause=24), KNOBS) == Slice(0.0)
    assert background_slice(view(prompt_next=True, owed_ms=16.0, since_pause=99), KNOBS) \
        == Slice(0.0)  # not owed enough for the pause
    off = SliceKnobs(background_share=0.0)
    assert background_slice(view(**owed, since_pause=99), off) == Slice(0.0)


def test_before_the_streams_p95_is_known_only_pauses_run():
    unknown = view(alone_p95_ms=0.0, owed_ms=50.0, since_pause=30)
    # measured against the tick itself: 1.8 x 5 - 5 = 4 ms, at least the least tick
    assert background_slice(unknown, KNOBS) == Slice(pytest.approx(4.0), pause=True)
    assert background_slice(view(alone_p95_ms=0.0), KNOBS) == Slice(0.0)


def test_owed_time_accrues_with_the_streams_and_is_bounded():
    assert owed_after(0.0, 10.0, 0.0, KNOBS, cap_ms=100.0) == pytest.approx(1.5)
    assert owed_after(5.0, 10.0, 4.0, KNOBS, cap_ms=100.0) == pytest.approx(2.5)
    assert owed_after(99.0, 100.0, 0.0, KNOBS, cap_ms=100.0) == 100.0
    assert owed_after(0.0, 0.0, 500.0, KNOBS, cap_ms=100.0) == -100.0
