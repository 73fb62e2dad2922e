"""Which background requests give their sequences to waiting interactive ones
(uma.sched.demotion)."""

import dataclasses

from uma.sched.demotion import demote, give_way
from uma.sched.state import Phase, Priority, SessionView, Waiting

BG, INT = Priority.BACKGROUND, Priority.INTERACTIVE


def session(seq, rid, priority, n_past):
    return SessionView(seq_id=seq, rid=rid, phase=Phase.DECODE, priority=priority,
                       n_prompt=n_past, n_prefilled=n_past, n_generated=1, n_past=n_past,
                       arrival_ns=rid, first_token_ns=rid, last_token_ns=rid)


def waiting(rid, priority):
    return Waiting(rid=rid, priority=priority, n_prompt=10, arrival_ns=rid)


def test_one_background_request_set_aside_per_interactive_one_short_of_a_sequence():
    running = [session(0, 1, BG, 900), session(1, 2, BG, 40), session(2, 3, BG, 300)]
    # the fewest KV positions first: the least to prefill again
    assert demote(running, [waiting(9, INT)], free=0) == (1,)
    assert demote(running, [waiting(9, INT), waiting(10, INT)], free=0) == (1, 2)
    # a free sequence takes one of them; queued background requests ask for nothing
    assert demote(running, [waiting(9, INT), waiting(10, INT), waiting(11, BG)], free=1) == (1,)


def test_nothing_set_aside_while_free_sequences_suffice_or_for_background_work():
    running = [session(0, 1, BG, 900), session(1, 2, BG, 40)]
    assert demote(running, [waiting(9, INT)], free=1) == ()
    assert demote(running, [waiting(9, BG)], free=0) == ()
    assert demote(running, [], free=0) == ()


def test_interactive_requests_are_never_set_aside():
    running = [session(0, 1, INT, 10), session(1, 2, BG, 500), session(2, 3, INT, 20)]
    assert demote(running, [waiting(9, INT)] * 3, free=0) == (1,)
    assert demote([session(0, 1, INT, 10)], [waiting(9, INT)], free=0) == ()


def test_a_tie_sets_the_newest_aside():
    running = [session(0, 1, BG, 64), session(1, 5, BG, 64), session(2, 3, BG, 64)]
    assert demote(running, [waiting(9, INT)], free=0) == (1,)


def prompt(seq, rid, due, app="a", first_token_ns=0):
    """An interactive request still prefilling its prompt, due at `due` (the test's clock)."""
    view = SessionView(seq_id=seq, rid=rid, phase=Phase.PREFILL, priority=INT, n_prompt=900,
                       n_prefilled=100, n_generated=0, n_past=100, arrival_ns=rid,
                       first_token_ns=first_token_ns, last_token_ns=0, app=app)
    return view, due


def give_way_of(prompts, waiting_dues, free, app="a"):
    sessions = [v for v, _ in prompts]
    dues = {v.seq_id: d for v, d in prompts}
    queued = [dataclasses.replace(waiting(9 + k, INT), app=app, due_ns=d)
              for k, d in enumerate(waiting_dues)]
    return give_way(sessions, queued, free, lambda s: dues[s.seq_id])


def test_a_prompt_gives_way_to_a_request_of_its_app_due_before_it():
    prompts = [prompt(0, 1, due=5_000), prompt(1, 2, due=9_000)]
    # the one due last gives way first, one per newcomer short of a sequence
    assert give_way_of(prompts, [100], free=0) == (1,)
    assert give_way_of(prompts, [100, 200], free=0) == (1, 0)
    assert give_way_of(prompts, [100, 200], free=1) == (1,)
    # a newcomer due after every prompt waits its turn
    assert give_way_of(prompts, [10_000], free=0) == ()
    assert give_way_of(prompts, [6_000], free=0) == (1,)
    assert give_way_of(prompts, [100], free=1) == ()


def test_no_stream_and_no_other_apps_prompt_gives_way():
    started = prompt(0, 1, due=9_000, first_token_ns=5)  # set aside once, mid-answer
    assert give_way_of([started], [100], free=0) == ()
    assert give_way_of([prompt(0, 1, due=9_000, app="b")], [100], free=0) == ()
    streaming = dataclasses.replace(prompt(0, 1, due=9_000)[0], phase=Phase.DECODE)
    assert give_way_of([(streaming, 9_000)], [100], free=0) == ()
    background = dataclasses.replace(prompt(0, 1, due=9_000)[0], priority=BG)
    assert give_way_of([(background, 9_000)], [100], free=0) == ()
