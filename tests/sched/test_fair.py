"""Fair share between apps: admission order and parking, on synthetic snapshots."""

from __future__ import annotations

from uma.sched.fair import Ledger, admit_fairly, park, shares
from uma.sched.state import Phase, Priority, SessionView, Waiting

INT, BG = Priority.INTERACTIVE, Priority.BACKGROUND


def running(seq: int, app: str, priority: Priority = INT, weight: float = 1.0) -> SessionView:
    return SessionView(seq_id=seq, rid=seq, phase=Phase.DECODE, priority=priority, n_prompt=8,
                       n_prefilled=8, n_generated=1, n_past=9, arrival_ns=seq,
                       first_token_ns=1, last_token_ns=1, app=app, weight=weight)


def queued(rid: int, app: str, priority: Priority = INT, weight: float = 1.0) -> Waiting:
    return Waiting(rid, priority, 8, rid, app, weight)


def test_one_app_is_first_come_first_served_within_a_class():
    waiting = [queued(5, "a"), queued(3, "a", BG), queued(4, "a"), queued(1, "a", BG)]
    assert admit_fairly(waiting, 3) == (4, 5, 1)
    assert admit_fairly(waiting, 0) == () and admit_fairly([], 4) == ()


def test_within_an_app_the_interactive_request_due_first_goes_first():
    # the scheduler sets due_ns from the policy (first_token_due): a short prompt that came
    # later is due before a long one
    late_short = Waiting(6, INT, 8, 6, "a", 1.0, due_ns=100.0)
    waiting = [queued(5, "a"), late_short, queued(3, "a", BG)]
    waiting[0] = Waiting(5, INT, 2000, 5, "a", 1.0, due_ns=9_000.0)
    assert admit_fairly(waiting, 1) == (6,)
    assert admit_fairly(waiting, 3) == (6, 5, 3)


def test_free_sequences_go_to_the_app_holding_the_fewest():
    # a holds three, b one: b's later request goes before a's earlier ones, then they alternate
    sessions = [running(0, "a"), running(1, "a"), running(2, "a"), running(3, "b")]
    waiting = [queued(10, "a"), queued(11, "a"), queued(12, "b"), queued(13, "b")]
    assert admit_fairly(waiting, 3, sessions) == (12, 13, 10)


def test_weights_scale_what_an_app_holds():
    waiting = [queued(1, "a", weight=3.0), queued(2, "a", weight=3.0), queued(3, "a", weight=3.0),
               queued(4, "b"), queued(5, "b")]
    assert admit_fairly(waiting, 4) == (1, 4, 2, 3)  # a:b = 3:1 once both hold some


def test_an_idle_share_is_lent_to_whoever_has_work():
    # work-conserving: the flood takes every sequence nobody else asks for
    waiting = [queued(r, "flood") for r in range(10)]
    assert admit_fairly(waiting, 4) == (0, 1, 2, 3)
    assert park([running(s, "flood") for s in range(4)], waiting[4:], 0, 4) == ()


def test_an_app_that_arrives_during_a_flood_gets_a_sequence_at_the_next_tick():
    flood = [running(s, "a") for s in range(4)]
    late = [queued(20, "b")]
    # the flood's newest request is parked, and b is admitted ahead of a's queue
    assert park(flood, [queued(10, "a"), *late], 0, 4) == (3,)
    after = flood[:3]
    assert admit_fairly([queued(3, "a"), queued(10, "a"), *late], 1, after) == (20,)
    # from there nobody is parked: each app holds at least its share
    assert park([*after, running(5, "b")], [queued(3, "a"), queued(10, "a")], 0, 4) == ()


def test_a_free_sequence_is_used_before_anyone_is_parked():
    flood = [running(s, "a") for s in range(3)]
    assert park(flood, [queued(9, "b")], 1, 4) == ()


def test_background_work_never_parks_an_interactive_request():
    flood = [running(s, "a") for s in range(4)]
    assert park(flood, [queued(9, "b", BG)], 0, 4) == ()
    mixed = [running(0, "a"), running(1, "a", BG), running(2, "a"), running(3, "a")]
    assert park(mixed, [queued(9, "b", BG)], 0, 4) == (1,)  # its own class's, if any


def test_more_apps_than_sequences_each_get_one_in_turn():
    # four apps, two sequences: the share is one each (at least one), so the app holding
    # two gives one up for a waiting app, and nobody parks anyone to hold a second
    sessions = [running(0, "a"), running(1, "a")]
    waiting = [queued(5, "b"), queued(6, "c"), queued(7, "d")]
    assert shares(sessions, waiting, 2) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert park(sessions, waiting, 0, 2) == (1,)
    assert park([running(0, "a"), running(2, "b")], waiting[1:], 0, 2) == ()


def test_a_heavier_app_keeps_more_before_it_is_parked():
    heavy = [running(s, "a", weight=3.0) for s in range(4)]
    assert shares(heavy, [queued(9, "b")], 4) == {"a": 3, "b": 1}
    assert park(heavy, [queued(9, "b")], 0, 4) == (3,)
    assert park(heavy[:3], [queued(9, "b")], 1, 4) == ()


# --- service in tick time (the ledger) -------------------------------------------------------

def test_the_ledger_shares_each_tick_as_the_cost_model_prices_the_apps_rows():
    ledger = Ledger()
    ledger.arrive("a", 1.0, ())
    ledger.arrive("b", 2.0, {"a"})
    ledger.charge({"a": 3.0, "b": 1.0}, 8.0)  # a's rows priced 3 ms, b's 1 ms; the tick took 8
    assert ledger.served == {"a": 6.0, "b": 1.0}  # b's 2 ms at weight 2
    ledger.charge({"a": 0.0, "b": 0.0}, 4.0)  # rows priced at nothing: evenly
    assert ledger.served == {"a": 8.0, "b": 2.0}


def test_an_app_that_joins_starts_level_with_the_least_served_active_app():
    ledger = Ledger()
    ledger.arrive("a", 1.0, ())
    ledger.arrive("b", 1.0, {"a"})
    ledger.charge({"a": 1.0, "b": 1.0}, 200.0)
    ledger.charge({"a": 1.0}, 50.0)
    assert ledger.served == {"a": 150.0, "b": 100.0}
    ledger.arrive("c", 1.0, {"a", "b"})  # no banked credit: it starts at b's 100
    assert ledger.served["c"] == 100.0
    ledger.arrive("a", 1.0, {"a", "b", "c"})  # already active: unchanged
    assert ledger.served["a"] == 150.0
    # b and c go idle; a returning idle app keeps a debt above the floor, not a credit below
    ledger.charge({"a": 1.0}, 100.0)
    ledger.arrive("b", 1.0, {"a"})
    assert ledger.served["b"] == 250.0
    ledger.arrive("c", 1.0, {"a", "b"})
    assert ledger.served["c"] == 250.0


def test_idle_apps_are_forgotten_and_an_idle_engine_starts_afresh():
    ledger = Ledger()
    ledger.arrive("a", 1.0, ())
    ledger.arrive("b", 1.0, {"a"})
    ledger.charge({"a": 1.0}, 100.0)  # b served nothing, a 100
    ledger.arrive("c", 1.0, {"a"})  # b is idle: at or below the floor, it is dropped
    assert set(ledger.served) == {"a", "c"} and set(ledger.weights) == {"a", "c"}
    ledger.arrive("d", 3.0, ())  # nothing active: everyone starts afresh
    assert ledger.served == {} and ledger.weights == {"d": 3.0}


def test_a_free_sequence_goes_to_the_least_served_app():
    waiting = [queued(1, "a"), queued(2, "b")]
    sessions = [running(0, "b")]
    assert admit_fairly(waiting, 1, sessions) == (1,)  # holding fewest, as before
    assert admit_fairly(waiting, 1, sessions, {"a": 90.0, "b": 40.0}) == (2,)  # b less served
    # prompts given this tick count at their predicted cost: after b's 8 tokens at 10 ms
    # (80 ms) a is the less served, so the next goes to a
    more = [queued(1, "a"), queued(2, "b"), queued(3, "b")]
    assert admit_fairly(more, 2, sessions, {"a": 90.0, "b": 40.0}, 10.0) == (2, 1)
    assert admit_fairly(more, 2, sessions, {"a": 90.0, "b": 40.0}, 1.0) == (2, 3)


def test_an_app_above_its_share_is_parked_only_for_an_app_served_no_more():
    flood = [running(s, "a") for s in range(3)] + [running(3, "b")]
    waiting = [queued(9, "b")]
    assert park(flood, waiting, 0, 4, {"a": 100.0, "b": 100.0}) == (2,)  # level: b's turn
    assert park(flood, waiting, 0, 4, {"a": 100.0, "b": 160.0}) == ()  # b was served more


def test_apps_that_outnumber_the_sequences_take_turns_a_quantum_at_a_time():
    one = [running(0, "a")]
    waiting = [queued(5, "b")]
    assert park(one, waiting, 0, 1, {"a": 20.0, "b": 0.0}, quantum_ms=50.0) == ()
    assert park(one, waiting, 0, 1, {"a": 60.0, "b": 0.0}, quantum_ms=50.0) == (0,)
    # once b runs, a waits ahead of it: no switch back until b is a quantum ahead
    assert park([running(1, "b")], [queued(0, "a")], 0, 1, {"a": 60.0, "b": 30.0},
                quantum_ms=50.0) == ()
    assert park([running(1, "b")], [queued(0, "a")], 0, 1, {"a": 60.0, "b": 111.0},
                quantum_ms=50.0) == (1,)
    # the most served app gives up its sequence first
    two = [running(0, "a"), running(1, "c")]
    assert park(two, waiting, 0, 2, {"a": 60.0, "b": 0.0, "c": 80.0}, quantum_ms=50.0) == (1,)
    # without a quantum (the default), no time-slicing
    assert park(one, waiting, 0, 1, {"a": 1e9, "b": 0.0}) == ()


def test_an_app_whose_requests_cost_more_is_sliced_even_at_its_share():
    # each app holds its share of two, but a's prompts made it a quantum ahead of b
    sessions = [running(0, "a"), running(1, "a"), running(2, "b"), running(3, "b")]
    waiting = [queued(9, "b"), queued(8, "a")]
    assert park(sessions, waiting, 0, 4, {"a": 140.0, "b": 100.0}, quantum_ms=50.0) == ()
    assert park(sessions, waiting, 0, 4, {"a": 160.0, "b": 100.0}, quantum_ms=50.0) == (1,)


def test_the_time_slice_follows_the_largest_recent_request():
    ledger = Ledger()
    assert ledger.quantum_ms == 250.0  # before any request ended
    ledger.ended(60.0)
    assert ledger.largest_request_ms == 500.0 * 0.98  # the larger, decaying
    for _ in range(200):
        ledger.ended(60.0)
    assert ledger.largest_request_ms == 60.0 and ledger.quantum_ms == 30.0  # as requests cost now
    ledger.ended(900.0)
    assert ledger.largest_request_ms == 900.0
    ledger.ended(0.1)
    assert ledger.largest_request_ms == 900.0 * 0.98
    fresh = Ledger()
    for _ in range(1000):
        fresh.ended(0.0)
    assert fresh.quantum_ms == 5.0  # never shorter than a few ticks
