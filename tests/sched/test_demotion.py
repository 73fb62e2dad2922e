"""Which background requests give their sequences to waiting interactive ones
(uma.sched.demotion)."""

from uma.sched.demotion import demote
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
