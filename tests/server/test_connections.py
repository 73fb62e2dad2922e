"""The connection policy (uma.server.connections), without I/O: who gets a connection, who goes
to the reserve, and which idle connection is closed to make room."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uma.server.connections import RESERVE, Admission, Caps, Held, admit

CAPS = Caps(total=4, per_peer=3)


def idle(peer, since, reserved=False) -> Held:
    return Held(peer, since, reserved)


def busy(peer, reserved=False) -> Held:
    return Held(peer, None, reserved)


def test_with_room_a_connection_is_admitted_and_nothing_is_closed():
    assert admit({}, "a", CAPS) == Admission("admit")
    assert admit({1: idle("a", 0.0), 2: busy("b")}, "a", CAPS) == Admission("admit")


def test_a_peer_at_its_share_makes_room_from_its_own_idle_connections_only():
    held = {1: idle("b", 0.0), 2: idle("a", 5.0), 3: busy("a"), 4: idle("a", 3.0)}
    # b's connection has been idle longest, but a pays for its own: its longest idle, 4
    assert admit(held, "a", CAPS) == Admission("admit", close=4)


def test_a_peer_at_its_share_with_every_connection_busy_goes_to_the_reserve():
    held = {1: busy("a"), 2: busy("a"), 3: busy("a")}
    assert admit(held, "a", CAPS) == Admission("reserve", full="peer")
    assert admit(held, "b", CAPS) == Admission("admit")  # one peer never fills the cap


def test_at_the_cap_the_peer_holding_most_gives_up_its_longest_idle():
    held = {1: idle("b", 0.0), 2: idle("a", 2.0), 3: idle("a", 1.0), 4: busy("a")}
    assert admit(held, "c", CAPS) == Admission("admit", close=3)
    # among peers holding as many, the longest idle connection goes
    held = {1: idle("b", 0.0), 2: busy("b"), 3: idle("a", 1.0), 4: busy("a")}
    assert admit(held, "c", CAPS) == Admission("admit", close=1)


def test_busy_connections_are_never_closed_for_room():
    held = {1: busy("a"), 2: busy("b"), 3: busy("c"), 4: busy("d")}
    assert admit(held, "e", CAPS) == Admission("reserve", full="total")


def test_the_reserve_takes_one_connection_a_peer_and_always_the_newest():
    full = {1: busy("a"), 2: busy("b"), 3: busy("c"), 4: busy("d")}
    held = {**full, 5: idle("e", 1.0, reserved=True)}
    # e's new reserve connection replaces its older one; f gets a reserve slot of its own
    assert admit(held, "e", CAPS) == Admission("reserve", close=5, full="total")
    assert admit(held, "f", CAPS) == Admission("reserve", full="total")
    spares = {10 + i: idle(f"p{i}", float(i), reserved=True) for i in range(RESERVE)}
    assert admit({**full, **spares}, "z", CAPS) == Admission("reserve", close=10, full="total")


def test_refused_only_when_even_the_reserve_is_busy():
    full = {1: busy("a"), 2: busy("b"), 3: busy("c"), 4: busy("d")}
    spares = {10 + i: busy(f"p{i}", reserved=True) for i in range(RESERVE)}
    assert admit({**full, **spares}, "z", CAPS) == Admission("refuse", full="total")


def test_unknown_peers_count_each_on_their_own():
    held = {1: busy(None), 2: busy(None), 3: busy(None)}
    assert admit(held, None, CAPS) == Admission("admit")  # no share to be held to
    held = {1: idle(None, 0.0), 2: idle(None, 1.0), 3: idle("a", 2.0), 4: idle("a", 3.0)}
    assert admit(held, None, CAPS).close == 3  # a holds two: the most


@pytest.mark.parametrize("total", [1, 2, 3, 4, 8, 64, 1000])
def test_one_peer_never_holds_the_whole_limit(total):
    caps = Caps.of(total)
    assert 1 <= caps.per_peer <= total
    if total >= 2:
        assert caps.per_peer < total
    assert Caps.of(64).per_peer == 48


PEERS = st.sampled_from(["a", "b", "c", None])
CONNS = st.lists(st.tuples(PEERS, st.none() | st.floats(0, 100), st.booleans()), max_size=16)


def legal(conns: list[tuple], caps: Caps) -> dict[int, Held]:
    """The connections of a list that the caps let be open together, in order."""
    held: dict[int, Held] = {}
    for i, (peer, since, reserved) in enumerate(conns):
        pool = [h for h in held.values() if h.reserved == reserved]
        limit, share = (caps.reserve, caps.reserve_per_peer) if reserved else \
            (caps.total, caps.per_peer)
        if len(pool) < limit and (peer is None or
                                  sum(h.peer == peer for h in pool) < share):
            held[i] = Held(peer, since, reserved)
    return held


@given(CONNS, PEERS)
def test_every_admission_keeps_the_caps_and_closes_only_an_idle_connection(conns, peer):
    held = legal(conns, CAPS)
    decision = admit(held, peer, CAPS)
    after = dict(held)
    if decision.close is not None:
        assert held[decision.close].idle_since is not None, "a busy connection was closed"
        # a regular newcomer makes room among regular connections, a spare among spares
        assert held[decision.close].reserved == (decision.verdict == "reserve")
        del after[decision.close]
    if decision.verdict == "refuse":
        # only when the reserve has no room either: the peer's own spare is busy, or all
        # spares are and they are all taken
        assert decision.close is None
        spares = [h for h in held.values() if h.reserved]
        mine = [h for h in spares if peer is not None and h.peer == peer]
        if len(mine) < CAPS.reserve_per_peer:
            assert len(spares) >= CAPS.reserve
        else:
            spares = mine
        assert all(h.idle_since is None for h in spares)
        return
    after[-1] = Held(peer, 0.0, decision.verdict == "reserve")
    for reserved, (limit, share) in ((False, (CAPS.total, CAPS.per_peer)),
                                     (True, (CAPS.reserve, CAPS.reserve_per_peer))):
        pool = [h for h in after.values() if h.reserved == reserved]
        assert len(pool) <= limit
        per_peer = collections.Counter(h.peer for h in pool if h.peer is not None)
        assert all(n <= share for n in per_peer.values())
    if decision.verdict == "reserve":
        # only when no regular connection could be had: the peer's own are all busy, or
        # all are and the cap is reached
        regular = [h for h in held.values() if not h.reserved]
        mine = [h for h in regular if peer is not None and h.peer == peer]
        if decision.full == "peer":
            assert len(mine) >= CAPS.per_peer and all(h.idle_since is None for h in mine)
        else:
            assert len(regular) >= CAPS.total and all(h.idle_since is None for h in regular)
