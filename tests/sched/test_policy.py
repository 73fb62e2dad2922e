"""Decisions the policies share (uma.sched.policy): admission, shedding on a full cache, the
chunk that brings a long prompt's first token in time."""

import math

import pytest

from uma.sched.policy import admit_by_class, shed_for_room, ttft_chunk_ms
from uma.sched.state import BatchItem, Phase, Plan, Waiting

from .snapshots import BG, INT, session


def test_admission_is_interactive_first_then_by_arrival():
    waiting = [Waiting(5, BG, 10, 5), Waiting(7, INT, 10, 7), Waiting(3, BG, 10, 3),
               Waiting(9, INT, 10, 9)]
    assert admit_by_class(waiting, 3) == (7, 9, 3)
    assert admit_by_class(waiting, 0) == () and admit_by_class([], 4) == ()


def test_interactive_requests_are_admitted_the_one_due_first_first():
    # a short prompt that came later is due before a long one (the policy's first_token_due)
    waiting = [Waiting(7, INT, 2000, 7, due_ns=9_000.0), Waiting(9, INT, 10, 9, due_ns=100.0),
               Waiting(3, BG, 10, 3)]
    assert admit_by_class(waiting, 1) == (9,)
    assert admit_by_class(waiting, 3) == (9, 7, 3)


def decode(seq):
    return BatchItem(seq, Phase.DECODE, 1, logits=True)


def test_a_full_cache_sheds_prompt_chunks_first():
    plan = Plan(items=(decode(0), BatchItem(1, Phase.PREFILL, 64, logits=False)))
    shed = shed_for_room(plan, [session(0, INT, Phase.DECODE), session(1, BG, Phase.PREFILL)])
    assert shed.plan.items == (decode(0),) and shed.preempt is None and shed.finish is None


def test_then_the_newest_background_request_goes_back_to_the_queue():
    sessions = [session(0, INT, Phase.DECODE), session(1, BG, Phase.DECODE),
                session(2, BG, Phase.DECODE), session(3, INT, Phase.DECODE)]
    shed = shed_for_room(Plan(items=tuple(decode(s) for s in range(4))), sessions)
    assert shed.preempt == 2 and [i.seq_id for i in shed.plan.items] == [0, 1, 3]
    inter = [session(0, INT, Phase.DECODE), session(3, INT, Phase.DECODE)]
    assert shed_for_room(Plan(items=(decode(0), decode(3))), inter).preempt == 3


def test_a_sequence_alone_that_does_not_fit_has_filled_the_context():
    shed = shed_for_room(Plan(items=(decode(4),)), [session(4, BG, Phase.DECODE)])
    assert shed.finish == 4 and shed.plan.items == () and shed.preempt is None


def test_prompt_chunks_alone_are_halved_then_one_token_makes_room_by_preempting():
    # Two prompts that fit the cache one at a time but not together: dropping every chunk ran
    # nothing, and the next tick planned the same chunks again, for ever.
    sessions = [session(0, INT, Phase.PREFILL, prompt=150), session(1, BG, Phase.PREFILL,
                                                                   prompt=150)]
    plan = Plan(items=(BatchItem(0, Phase.PREFILL, 150, logits=True),
                       BatchItem(1, Phase.PREFILL, 106, logits=False)))
    shed = shed_for_room(plan, sessions)
    assert shed.plan.items == (BatchItem(0, Phase.PREFILL, 75, logits=False),)
    assert shed.preempt is None
    one = shed_for_room(Plan(items=(BatchItem(0, Phase.PREFILL, 1, logits=False),)), sessions)
    assert one.preempt == 1 and one.plan.items == (BatchItem(0, Phase.PREFILL, 1, logits=False),)


def test_the_stretch_chunk_finishes_the_prompt_in_the_time_left():
    # In chunks of c ms, each paying the overhead, a prompt of `work` ms takes
    # work / (c - overhead) ticks of beside + c: at c = ttft_chunk_ms exactly the time left.
    for work, overhead, beside, left in [(390, 10, 18, 627), (100, 0, 30, 160),
                                         (1000, 25, 5, 2060)]:
        c = ttft_chunk_ms(work, overhead, beside, left)
        assert overhead < c < work + overhead
        assert work / (c - overhead) * (beside + c) == pytest.approx(left)
    assert ttft_chunk_ms(100, 5, 0, 500) == math.inf  # nothing beside it: in whole
    assert ttft_chunk_ms(100, 5, 10, 115) == math.inf  # due: in whole
