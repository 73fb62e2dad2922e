"""Tests for uma.engine.prefix_index: matches, reuse records and evictions of the prefix cache,
checked against a brute-force model of the same rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.engine.prefix_index import TIERS, Match, PrefixIndex, Reuses
from uma.errors import InvalidRequestError
from uma.sched.reuse import KEEP_HALF_LIFE, MAX_APPS, keep_value

# --- a brute-force model: every rule written as a scan over all entries -------------------


@dataclasses.dataclass
class _RefEntry:
    tokens: tuple[int, ...]
    tier: str
    nbytes: int
    last_used: int
    pins: int = 0
    hits: int = 0
    apps: set[str] = dataclasses.field(default_factory=set)

    def used_by(self, app: str) -> None:
        if app and len(self.apps) < MAX_APPS:
            self.apps.add(app)


class _Reference:
    def __init__(self) -> None:
        self.entries: dict[int, _RefEntry] = {}
        self.clock = 0

    def covering(self, tokens: tuple[int, ...], tier: str) -> int | None:
        hits = [(e.last_used, i) for i, e in self.entries.items()
                if tokens and e.tier == tier and e.tokens[:len(tokens)] == tokens]
        return max(hits)[1] if hits else None

    def insert(self, tokens: tuple[int, ...], tier: str, nbytes: int, new_id: int,
               app: str = "") -> int:
        existing = self.covering(tokens, tier)
        if existing is not None:
            self.touch(existing, app)
            return existing
        self.clock += 1
        self.entries[new_id] = _RefEntry(tokens, tier, nbytes, self.clock)
        self.entries[new_id].used_by(app)
        return new_id

    def touch(self, entry: int, app: str = "", hit: bool = False) -> None:
        self.clock += 1
        e = self.entries[entry]
        e.last_used = self.clock
        e.hits += hit
        e.used_by(app)

    def value(self, entry: int) -> float:
        """keep_value for the tokens past the longest prefix whose keeper (among the entries
        of its tier holding that prefix that no longer one extends: a pinned one, else the most
        valuable) is another entry."""
        e = self.entries[entry]
        mine = {i: o for i, o in self.entries.items() if o.tier == e.tier}

        def full(o: _RefEntry, n: int) -> float:
            cost = len(o.tokens) if o.tier == "kv" else o.nbytes
            return keep_value(n, cost, o.hits, len(o.apps), self.clock - o.last_used)

        def extended(o: _RefEntry) -> bool:
            return any(len(x.tokens) > len(o.tokens) and x.tokens[:len(o.tokens)] == o.tokens
                       for x in mine.values())

        shared = 0
        for n in range(len(e.tokens), 0, -1):
            holders = [i for i, o in mine.items() if o.tokens[:n] == e.tokens[:n]
                       and len(o.tokens) >= n and not extended(o)]
            keeper = max(holders, default=None, key=lambda i: (
                mine[i].pins > 0, full(mine[i], len(mine[i].tokens)), mine[i].last_used, i))
            if keeper != entry:
                shared = n
                break
        return full(e, len(e.tokens) - shared)

    def longest(self, tokens: tuple[int, ...], tier: str | None) -> Match | None:
        best = None
        for i, e in self.entries.items():
            if tier is not None and e.tier != tier:
                continue
            n = 0
            while n < min(len(tokens), len(e.tokens)) and tokens[n] == e.tokens[n]:
                n += 1
            if n == 0:
                continue
            key = (n, e.tier == "kv", e.last_used)
            if best is None or key > best[0]:
                best = (key, Match(entry=i, tier=e.tier, length=n))  # type: ignore[arg-type]
        return None if best is None else best[1]

    def total(self, tier: str) -> int:
        return sum(len(e.tokens) if tier == "kv" else e.nbytes
                   for e in self.entries.values() if e.tier == tier)


_tokens = st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple)
_apps = st.sampled_from(("", "a", "b", "c"))
_ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), _tokens, st.sampled_from(TIERS), st.integers(0, 100), _apps),
    st.tuples(st.just("lookup"), _tokens, st.sampled_from((None, *TIERS))),
    st.tuples(st.just("touch"), st.integers(0, 40), _apps),
    st.tuples(st.just("hit"), st.integers(0, 40), _apps),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("pin"), st.integers(0, 40)),
), max_size=60)


def _play(index: PrefixIndex, ref: _Reference, op: tuple, ids: list[int]) -> None:
    """Applies an insert, touch, hit, pin or remove to both (an id picked from those handed
    out, so integer picks can address old ones)."""
    kind = op[0]
    if kind == "insert":
        _, tokens, tier, nbytes, app = op
        got = index.insert(tokens, tier, nbytes=nbytes if tier == "ram" else None, app=app)
        assert got == ref.insert(tokens, tier, nbytes if tier == "ram" else 0, got, app)
        ids.append(got)
        return
    if not ids:
        return
    entry = ids[op[1] % len(ids)]
    if entry not in ref.entries:
        assert entry not in index
        return
    if kind in ("touch", "hit"):
        getattr(index, kind)(entry, op[2])
        ref.touch(entry, op[2], hit=kind == "hit")
    elif kind == "pin":
        index.pin(entry)
        ref.entries[entry].pins += 1
    elif kind == "remove":
        index.remove(entry)
        del ref.entries[entry]


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_matches_brute_force_reference(ops):
    index, ref = PrefixIndex(), _Reference()
    ids: list[int] = []
    for op in ops:
        if op[0] == "lookup":
            _, tokens, tier = op
            for n in range(len(tokens) + 1):  # every prefix: each stops at another node
                assert index.longest(tokens[:n], tier) == ref.longest(tokens[:n], tier)
                for t in TIERS:
                    assert index.covering(tokens[:n], t) == ref.covering(tokens[:n], t)
        else:
            _play(index, ref, op, ids)
        assert len(index) == len(ref.entries)
        for t in TIERS:
            assert index.total(t) == ref.total(t)
        for i, e in ref.entries.items():
            assert index.entry(i).reuses == Reuses(e.hits, frozenset(e.apps))
            assert index.value(i) == ref.value(i)


@settings(max_examples=200, deadline=None)
@given(_ops, st.sampled_from(TIERS), st.integers(0, 60))
def test_evictions_go_by_keep_value_spare_pins_and_fit_when_possible(ops, tier, budget):
    index, ref = PrefixIndex(), _Reference()
    ids: list[int] = []
    for op in ops:
        if op[0] != "lookup":
            _play(index, ref, op, ids)
    plan = index.evictions(tier, budget)

    unpinned = sorted((ref.value(i), e.last_used, i) for i, e in ref.entries.items()
                      if e.tier == tier and not e.pins)
    # worth least first, ties least recently used first
    assert list(plan.victims) == [i for *_, i in unpinned[:len(plan.victims)]]
    assert all(not ref.entries[v].pins for v in plan.victims)
    for v in plan.victims:
        index.remove(v)
    assert index.total(tier) == plan.total_after
    pinned_total = sum(len(e.tokens) if tier == "kv" else e.nbytes
                       for e in ref.entries.values() if e.tier == tier and e.pins)
    if pinned_total <= budget:
        assert plan.fits and index.total(tier) <= budget
        if plan.victims:  # no more than needed: sparing the last victim would not fit
            last = ref.entries[plan.victims[-1]]
            assert plan.total_after + (len(last.tokens) if tier == "kv" else last.nbytes) > budget
    else:
        assert not plan.fits
        assert len(plan.victims) == len(unpinned)


# --- the rules, one at a time -------------------------------------------------------------


def test_kv_is_preferred_over_ram_at_equal_length_whatever_the_recency():
    index = PrefixIndex()
    kv = index.insert([1, 2, 3], "kv")
    ram = index.insert([1, 2, 3, 4], "ram", nbytes=10)
    index.touch(ram)
    assert index.longest([1, 2, 3, 9]) == Match(entry=kv, tier="kv", length=3)
    assert index.longest([1, 2, 3, 4]) == Match(entry=ram, tier="ram", length=4)  # longer wins
    assert index.longest([1, 2, 3, 9], tier="ram") == Match(entry=ram, tier="ram", length=3)


def test_most_recent_wins_among_equal_matches_of_one_tier():
    index = PrefixIndex()
    a = index.insert([1, 2, 3], "kv")
    b = index.insert([1, 2, 4], "kv")
    assert index.longest([1, 2, 5]) == Match(entry=b, tier="kv", length=2)
    index.touch(a)
    assert index.longest([1, 2, 5]) == Match(entry=a, tier="kv", length=2)


def test_partial_hit_reports_the_shared_length_not_the_entry_length():
    index = PrefixIndex()
    e = index.insert(list(range(10)), "kv")
    assert index.longest([0, 1, 2, 99]) == Match(entry=e, tier="kv", length=3)
    assert index.longest([0, 1]) == Match(entry=e, tier="kv", length=2)
    assert index.longest([5, 6]) is None
    assert index.longest([]) is None


def test_with_no_reuse_recorded_evictions_follow_least_recent_use():
    index = PrefixIndex()
    a = index.insert([1] * 10, "kv")
    b = index.insert([2] * 10, "kv")
    c = index.insert([3] * 10, "kv")
    index.touch(a)
    assert index.evictions("kv", 30).victims == ()
    assert index.evictions("kv", 20).victims == (b,)
    assert index.evictions("kv", 5).victims == (b, c, a)


def test_hits_count_reuses_only_and_apps_are_remembered_up_to_a_bound():
    index = PrefixIndex()
    e = index.insert([1] * 20, "kv", app="a")
    index.touch(e, "b")  # a refresh (an equal insert): not a hit
    assert index.insert([1] * 20, "kv", app="c") == e
    assert index.entry(e).reuses == Reuses(0, frozenset("abc"))
    index.hit(e, "a")
    index.hit(e)  # "": no app told
    assert index.entry(e).reuses == Reuses(2, frozenset("abc"))
    for k in range(20):
        index.hit(e, f"app{k}")
    assert len(index.entry(e).reuses.apps) == MAX_APPS and index.entry(e).reuses.hits == 22


def test_an_entry_a_longer_one_extends_goes_first_ties_by_recency():
    """A chat's earlier turns: each next turn's entry starts with all of the last one's
    tokens, so the earlier entries save nothing; they go first, least recently used first,
    whatever their hits, before the fresh entry of another prompt."""
    index = PrefixIndex()
    turns = [index.insert([5] * 10 * t, "kv", app="chat") for t in (1, 2, 3)]
    index.hit(turns[0], "chat")
    index.hit(turns[1], "chat")
    other = index.insert([6] * 10, "kv", app="other")
    assert index.value(turns[0]) == index.value(turns[1]) == 0.0
    assert index.evictions("kv", 60).victims == (turns[0],)
    assert index.evictions("kv", 40).victims == (turns[0], turns[1])
    # then the oldest of the two unreused: the last turn before the newer stranger
    assert index.evictions("kv", 0).victims == (turns[0], turns[1], turns[2], other)
    index.remove(turns[2])
    assert index.value(turns[1]) > 0  # nothing extends it any more


def test_a_prefix_entries_share_is_credited_to_one_keeper_a_pinned_one_first():
    """Two entries start with the same 95 tokens: the one worth more keeps that prefix and the
    other is worth only its own last five, so it goes before a stranger of no reuse; where the
    other is pinned, that prefix stays whatever goes, and the one worth more is worth only its
    own five."""
    index = PrefixIndex()
    shared = [9] * 95
    plain = index.insert(shared + [1] * 5, "kv", app="x")
    reused = index.insert(shared + [2] * 5, "kv", app="x")
    for app in "yz":
        index.hit(reused, app)
    stranger = index.insert([3] * 100, "kv", app="w")
    assert index.value(plain) == pytest.approx(index.value(reused) * 5 / 100 / 9, rel=0.1)
    assert index.evictions("kv", 200).victims == (plain,)
    index.pin(plain)
    assert index.value(reused) < index.value(stranger)
    assert index.evictions("kv", 200).victims == (reused,)


def test_a_record_moved_to_another_tier_keeps_its_worth():
    index = PrefixIndex()
    kv = index.insert([1] * 40, "kv", app="a")
    for app in "bc":
        index.hit(kv, app)
    moved = index.entry(kv).reuses
    index.remove(kv)
    ram = index.insert([1] * 40, "ram", nbytes=40, app="", reuses=moved)
    fresh = index.insert([2] * 40, "ram", nbytes=40, app="d")
    assert index.entry(ram).reuses == Reuses(2, frozenset("abc"))
    assert index.evictions("ram", 40).victims == (fresh,)


SYSTEM = list(range(1000, 1400))  # 400 tokens every app's prompt starts with


def _play_apps_then_chats(index: PrefixIndex, budget: int, lru: bool) -> Match | None:
    """Six apps send the shared system prompt and a question of their own; then four chats
    of eight turns, each turn an entry and the whole history; every request reuses the
    longest prefix cached (a hit by its app) and leaves its KV, and entries leave for the
    budget (least recently used first where `lru`). Returns what a seventh app's prompt
    finds."""
    live: set[int] = set()

    def request(prompt: list[int], reply: list[int], app: str) -> None:
        match = index.longest(prompt, "kv")
        if match is not None:
            index.hit(match.entry, app)
        live.add(index.insert(prompt + reply, "kv", app=app))
        if lru:
            over = index.total("kv") - budget
            for e in sorted(live, key=lambda e: index.entry(e).last_used):
                if over <= 0:
                    break
                over -= index.entry(e).tokens
                index.remove(e)
                live.discard(e)
        else:
            for e in index.evictions("kv", budget).victims:
                index.remove(e)
                live.discard(e)

    for a in range(6):
        request(SYSTEM + [2000 + a] * 20, [3000 + a] * 10, f"app{a}")
    for c in range(4):
        history: list[int] = []
        for t in range(8):
            history = history + [4000 + 100 * c + t] * 50
            request(history, [5000 + 100 * c + t] * 10, f"chat{c}")
            history = history + [5000 + 100 * c + t] * 10
    return index.longest(SYSTEM + [2100] * 20, "kv")


def test_a_prompt_several_apps_share_outlives_one_off_conversations():
    """A working day in miniature: under least-recent use the conversations' turns push every entry
    holding the shared system prompt out and the next app prefills it again; weighed by
    reuse, an entry the apps reused outlives the chats' (which compete among themselves)."""
    budget = 2000
    lost = _play_apps_then_chats(PrefixIndex(), budget, lru=True)
    assert lost is None or lost.length < len(SYSTEM)
    index = PrefixIndex()
    kept = _play_apps_then_chats(index, budget, lru=False)
    assert kept is not None and kept.length == len(SYSTEM)
    assert len(index.entry(kept.entry).reuses.apps) >= 2 and index.total("kv") <= budget
    # one entry keeps the system prompt: the other apps' are worth their own questions only,
    # and went, leaving the chats room for their latest turns
    assert len(index) >= 3


def test_an_entry_nobody_reuses_for_long_goes():
    """Three apps' entry (worth nine fresh ones) outlives fresh one-off entries while its
    worth halves every KEEP_HALF_LIFE uses of the cache, and then goes: after log2(9) half
    lives, give or take the few uses the oldest fresh entry is behind."""
    index = PrefixIndex()
    shared = index.insert([1] * 100, "kv", app="a")
    index.hit(shared, "b")
    index.hit(shared, "c")
    for k in range(10 * KEEP_HALF_LIFE):
        index.insert([2, k] * 50, "kv", app="one-off")  # as long as it, used once
        for victim in index.evictions("kv", 5 * 100).victims:  # room for five
            index.remove(victim)
        if shared not in index:
            break
    assert 3 * KEEP_HALF_LIFE < k < 4 * KEEP_HALF_LIFE


def test_pinned_entries_are_never_evicted_and_an_unmeetable_budget_is_reported():
    index = PrefixIndex()
    a = index.insert([1] * 10, "ram", nbytes=100)
    b = index.insert([2] * 10, "ram", nbytes=50)
    index.pin(a)
    index.pin(a)
    plan = index.evictions("ram", 60)
    assert plan.victims == (b,) and plan.total_after == 100 and not plan.fits
    index.unpin(a)
    assert index.evictions("ram", 60).victims == (b,)  # pins count: still held once
    index.unpin(a)
    assert index.evictions("ram", 60).victims == (a,)
    with pytest.raises(InvalidRequestError, match="not pinned"):
        index.unpin(a)


def test_removing_a_branch_point_keeps_the_branches_findable():
    index = PrefixIndex()
    branch_point = index.insert([1, 2], "kv")
    index.insert([1, 2, 3], "kv")
    newest = index.insert([1, 2, 4], "kv")
    index.remove(branch_point)
    assert index.longest([1, 2]) == Match(entry=newest, tier="kv", length=2)
    assert index.longest([1]) == Match(entry=newest, tier="kv", length=1)


def test_a_prompt_leaving_mid_edge_does_not_continue_into_the_children():
    index = PrefixIndex()
    a = index.insert([1, 2, 3, 5], "kv")
    index.insert([1, 2, 3, 6], "kv")  # makes [1, 2, 3] an edge with children 5 and 6
    index.touch(a)
    assert index.longest([1, 5, 6]) == Match(entry=a, tier="kv", length=1)


def test_removed_entries_leave_lookups():
    index = PrefixIndex()
    short = index.insert([1, 2], "kv")
    long = index.insert([1, 2, 3, 4], "kv")
    index.remove(long)
    assert long not in index
    assert index.longest([1, 2, 3, 4]) == Match(entry=short, tier="kv", length=2)
    index.remove(short)
    assert index.longest([1, 2, 3, 4]) is None
    assert len(index) == 0 and index.total("kv") == 0
    with pytest.raises(InvalidRequestError, match="no prefix entry"):
        index.touch(short)


def test_reinserting_an_equal_or_covered_key_refreshes_the_existing_entry():
    index = PrefixIndex()
    a = index.insert([1, 2, 3], "ram", nbytes=30)
    other = index.insert([7], "ram", nbytes=10)  # as many bytes a token: equal but for recency
    assert index.insert([1, 2, 3], "ram", nbytes=99) == a  # equal: same id, no double count
    assert index.insert([1, 2], "ram", nbytes=20) == a  # a prefix of it: already covered
    assert len(index) == 2 and index.total("ram") == 40
    assert index.entry(a).nbytes == 30 and index.entry(a).reuses.hits == 0  # refreshed, not hit
    assert index.evictions("ram", 30).victims == (other,)  # a was refreshed, so it is newer
    assert index.insert([1, 2, 3], "kv") != a  # another tier is another copy
    longer = index.insert([1, 2, 3, 4], "ram", nbytes=40)  # longer: a new entry
    assert longer != a and index.longest([1, 2, 3], tier="ram").entry == longer


def test_numpy_token_arrays_are_accepted_and_copied():
    index = PrefixIndex()
    prompt = np.arange(100, dtype=np.int32)
    e = index.insert(prompt, "kv")
    prompt[:] = 0  # the caller reuses its buffer: the index kept its own copy
    assert index.longest(np.arange(50, dtype=np.int32)) == Match(entry=e, tier="kv", length=50)


@pytest.mark.parametrize(("call", "message"), [
    (lambda i: i.insert([1], "gpu"), "tier must be"),
    (lambda i: i.insert([1], "ram"), "needs nbytes"),
    (lambda i: i.insert([1], "ram", nbytes=-1), "nbytes must be >= 0"),
    (lambda i: i.insert([1], "kv", nbytes=5), "measured in tokens"),
    (lambda i: i.insert([], "kv"), "empty"),
    (lambda i: i.insert([[1, 2]], "kv"), "one-dimensional"),
    (lambda i: i.insert(["a"], "kv"), "integer ids"),
    (lambda i: i.evictions("kv", -1), "budget must be >= 0"),
    (lambda i: i.total("disk"), "tier must be"),
    (lambda i: i.longest([1], tier="disk"), "tier must be"),
])
def test_bad_input_is_an_invalid_request_naming_the_problem(call, message):
    with pytest.raises(InvalidRequestError, match=message):
        call(PrefixIndex())


def test_stats_count_entries_pins_tokens_and_bytes():
    index = PrefixIndex()
    a = index.insert([1, 2, 3], "kv")
    index.insert([4, 5], "kv")
    index.insert([1, 2, 3], "ram", nbytes=64)
    index.pin(a)
    stats = index.stats()
    assert (stats.kv.entries, stats.kv.pinned, stats.kv.tokens) == (2, 1, 5)
    assert (stats.ram.entries, stats.ram.pinned, stats.ram.tokens, stats.ram.nbytes) == (
        1, 0, 3, 64)


# --- lookups walk the prompt's path, not the entries -------------------------------------


def test_long_prompt_lookup_visits_its_path_not_every_entry():
    rng = np.random.default_rng(0)
    prompt = rng.integers(1000, 32000, size=32_768)
    index = PrefixIndex()
    for first in range(199):  # strangers: each starts with a token the prompt never uses
        index.insert(np.concatenate(([first], rng.integers(0, 32000, size=2_000))), "kv")
    hit = index.insert(prompt[:30_000], "ram", nbytes=1)
    before = index.node_visits
    assert index.longest(prompt) == Match(entry=hit, tier="ram", length=30_000)
    assert index.node_visits - before == 2  # the root and the one edge the prompt follows


def test_nested_prefixes_cost_one_visit_per_prefix_on_the_path():
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 32000, size=32_768)
    index = PrefixIndex()
    for n in range(1, 201):
        index.insert(prompt[:160 * n], "ram", nbytes=n)
    before = index.node_visits
    assert index.longest(prompt).length == 32_000
    assert index.node_visits - before <= 201


def test_a_hit_records_the_longest_prefix_any_reuse_took():
    from uma.engine.prefix_index import Reuses

    r = Reuses().used_by("a", hit=True, length=40).used_by("b", hit=True, length=25)
    assert (r.hits, r.matched) == (2, 40)
    assert r.used_by("c").matched == 40  # a refresh (no hit) leaves it
