"""uma.sched.slices: when a background context's requests may run, as pure functions."""

import pytest

from uma.sched.slices import NONE, Slice, SliceKnobs, SliceView, background_slice, owed_after

KNOBS = SliceKnobs(ride=4.0, background_share=0.15, pause_factor=1.8, pause_share=0.04,
                   idle_ms=100.0)
SPACING = 25  # 1 / pause_share


def view(**over):
    base = dict(streams=True, prompt_next=False, decoding=True, tick_ms=5.0, alone_p95_ms=12.0,
                min_ms=4.0, owed_ms=0.0, since_slice=SPACING)
    return SliceView(**{**base, **over})


def test_with_no_interactive_request_background_runs_idle_ticks():
    assert background_slice(view(streams=False), KNOBS) == Slice(100.0, "idle")
    # a least useful tick longer than the idle budget still runs
    assert background_slice(view(streams=False, min_ms=150.0), KNOBS) == Slice(150.0, "idle")
    # spacing is for the streams' gaps: with none, nothing waits for it
    assert background_slice(view(streams=False, since_slice=0), KNOBS).kind == "idle"


def test_a_slice_rides_before_the_streams_prompt_tick():
    # the gap may reach 4 x the prompt tick, counted at no less than the p95 alone: 48 - 10 ms
    prompt = dict(prompt_next=True, tick_ms=10.0)
    assert background_slice(view(**prompt), KNOBS) == Slice(pytest.approx(38.0), "ride")
    # a prompt tick past the p95: 4 x 20 - 20
    assert background_slice(view(prompt_next=True, tick_ms=20.0), KNOBS) == \
        Slice(pytest.approx(60.0), "ride")
    # rides need nothing owed: the gap is the streams' tail already
    assert background_slice(view(**prompt, owed_ms=-50.0), KNOBS).kind == "ride"


def test_no_ride_before_a_prompt_tick_with_no_stream_decoding():
    # a lone new request: no gap to hide a slice in, only its first token to delay
    lone = view(prompt_next=True, decoding=False, tick_ms=10.0)
    assert background_slice(lone, KNOBS) is NONE
    assert background_slice(view(prompt_next=True, decoding=True, tick_ms=10.0), KNOBS).kind \
        == "ride"


def test_a_ride_is_sized_from_the_prompt_tick_wherever_the_p95_alone_lands():
    # the same 15 ms prompt tick, the p95 alone on either side of the decode/prompt edge
    for p95 in (7.6, 12.0, 15.0):
        ride = background_slice(view(prompt_next=True, tick_ms=15.0, alone_p95_ms=p95), KNOBS)
        assert ride == Slice(pytest.approx(45.0), "ride")


def test_a_ride_counts_the_prompt_tick_at_most_ride_cap_times_the_p95_alone():
    # a CPU's long prompt tick: 4 x (2 x 12) - 30, not 4 x 30 - 30
    assert background_slice(view(prompt_next=True, tick_ms=30.0), KNOBS).ms == \
        pytest.approx(66.0)
    assert background_slice(view(prompt_next=True, tick_ms=94.0), KNOBS) is NONE
    assert background_slice(view(prompt_next=True, tick_ms=30.0),
                            SliceKnobs(ride_cap=1.0)).ms == pytest.approx(18.0)


def test_no_slice_before_a_decode_tick_unless_a_pause_is_owed():
    assert background_slice(view(), KNOBS) is NONE
    assert background_slice(view(owed_ms=1000.0, since_slice=2 * SPACING - 1), KNOBS) is NONE


def test_slices_are_spaced_one_in_1_over_pause_share_ticks():
    prompt = dict(prompt_next=True, tick_ms=15.0)
    assert background_slice(view(**prompt, since_slice=SPACING - 1), KNOBS) is NONE
    assert background_slice(view(**prompt, since_slice=SPACING), KNOBS).kind == "ride"
    # no share of ticks for slices: none while the streams run
    assert background_slice(view(**prompt, since_slice=10**6), SliceKnobs(pause_share=0.0)) \
        is NONE


def test_a_ride_that_leaves_no_room_for_the_least_tick_is_not_run():
    assert background_slice(view(prompt_next=True, tick_ms=10.0, min_ms=39.0), KNOBS) is NONE
    assert background_slice(view(prompt_next=True, tick_ms=10.0), SliceKnobs(ride=0.0)) is NONE


def test_with_no_prompt_tick_to_ride_what_is_owed_is_paid_in_pauses():
    owed = dict(owed_ms=20.0, since_slice=2 * SPACING)
    # 1.8 x 12 - 5 = 16.6 ms, once a slice has waited as many ticks again for a prompt tick
    assert background_slice(view(**owed), KNOBS) == Slice(pytest.approx(16.6), "pause")
    assert background_slice(view(owed_ms=16.0, since_slice=99), KNOBS) is NONE  # not enough
    off = SliceKnobs(background_share=0.0)
    assert background_slice(view(**owed), off) is NONE


def test_before_the_streams_p95_is_known_gaps_are_measured_against_the_tick():
    unknown = view(alone_p95_ms=0.0, owed_ms=50.0, since_slice=2 * SPACING)
    # 1.8 x 5 - 5 = 4 ms, at least the least tick
    assert background_slice(unknown, KNOBS) == Slice(pytest.approx(4.0), "pause")
    ride = view(alone_p95_ms=0.0, prompt_next=True, tick_ms=15.0)
    assert background_slice(ride, KNOBS) == Slice(pytest.approx(45.0), "ride")


def test_owed_time_accrues_with_the_streams_and_is_bounded():
    assert owed_after(0.0, 10.0, 0.0, KNOBS, cap_ms=100.0) == pytest.approx(1.5)
    assert owed_after(5.0, 10.0, 4.0, KNOBS, cap_ms=100.0) == pytest.approx(2.5)
    assert owed_after(99.0, 100.0, 0.0, KNOBS, cap_ms=100.0) == 100.0
    assert owed_after(0.0, 0.0, 500.0, KNOBS, cap_ms=100.0) == -100.0


def test_under_the_gap_bound_no_slice_makes_a_gap_past_it():
    # the bound policy's gap bound: max(100 ms, 4 x the p95 alone) / 1.25
    bound = SliceKnobs(ride=4.0, ride_cap=2.0, gap_ms=100.0, gap_factor=4.0, gap_margin=1.25)
    # a CPU's long prompt tick: the ride alone would make 4 x (2 x 30) = 240 ms
    tick = dict(prompt_next=True, tick_ms=60.0, alone_p95_ms=30.0)
    assert background_slice(view(**tick), SliceKnobs()).ms == pytest.approx(180.0)
    assert background_slice(view(**tick), bound) == Slice(pytest.approx(96.0 - 60.0), "ride")
    # where the p95 alone is long, the bound is 4x it: 4 x 40 / 1.25 = 128 ms
    long = dict(prompt_next=True, tick_ms=60.0, alone_p95_ms=40.0)
    assert background_slice(view(**long), bound).ms == pytest.approx(128.0 - 60.0)
    # a pause, too, ends at the bound (a large pause_factor would take it past)
    wide = SliceKnobs(pause_factor=10.0, gap_ms=100.0)
    owed = view(owed_ms=500.0, since_slice=2 * SPACING, tick_ms=20.0, alone_p95_ms=20.0)
    assert background_slice(owed, wide) == Slice(pytest.approx(80.0 - 20.0), "pause")
