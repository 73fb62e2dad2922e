"""Tests for uma.engine.prefix_index: matches and evictions of the prefix cache, checked against a
brute-force model of the same rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.engine.prefix_index import TIERS, Match, PrefixIndex
from uma.errors import InvalidRequestError

# --- a brute-force model: every rule written as a scan over all entries -------------------


@dataclasses.dataclass
class _RefEntry:
    tokens: tuple[int, ...]
    tier: str
    nbytes: int
    last_used: int
    pins: int = 0


class _Reference:
    def __init__(self) -> None:
        self.entries: dict[int, _RefEntry] = {}
        self.clock = 0

    def covering(self, tokens: tuple[int, ...], tier: str) -> int | None:
        hits = [(e.last_used, i) for i, e in self.entries.items()
                if tokens and e.tier == tier and e.tokens[:len(tokens)] == tokens]
        return max(hits)[1] if hits else None

    def insert(self, tokens: tuple[int, ...], tier: str, nbytes: int, new_id: int) -> int:
        existing = self.covering(tokens, tier)
        if existing is not None:
            self.touch(existing)
            return existing
        self.clock += 1
        self.entries[new_id] = _RefEntry(tokens, tier, nbytes, self.clock)
        return new_id

    def touch(self, entry: int) -> None:
        self.clock += 1
        self.entries[entry].last_used = self.clock

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
_ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), _tokens, st.sampled_from(TIERS), st.integers(0, 100)),
    st.tuples(st.just("lookup"), _tokens, st.sampled_from((None, *TIERS))),
    st.tuples(st.just("touch"), st.integers(0, 40)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("pin"), st.integers(0, 40)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_matches_brute_force_reference(ops):
    index, ref = PrefixIndex(), _Reference()
    ids: list[int] = []  # every id handed out, so integer picks can address old ones
    for op in ops:
        kind = op[0]
        if kind == "insert":
            _, tokens, tier, nbytes = op
            got = index.insert(tokens, tier, nbytes=nbytes if tier == "ram" else None)
            assert got == ref.insert(tokens, tier, nbytes if tier == "ram" else 0, got)
            ids.append(got)
        elif kind == "lookup":
            _, tokens, tier = op
            for n in range(len(tokens) + 1):  # every prefix: each stops at another node
                assert index.longest(tokens[:n], tier) == ref.longest(tokens[:n], tier)
                for t in TIERS:
                    assert index.covering(tokens[:n], t) == ref.covering(tokens[:n], t)
        elif ids:
            entry = ids[op[1] % len(ids)]
            if entry not in ref.entries:
                assert entry not in index
                continue
            if kind == "touch":
                index.touch(entry)
                ref.touch(entry)
            elif kind == "pin":
                index.pin(entry)
                ref.entries[entry].pins += 1
            else:
                index.remove(entry)
                del ref.entries[entry]
        assert len(index) == len(ref.entries)
        for t in TIERS:
            assert index.total(t) == ref.total(t)


@settings(max_examples=200, deadline=None)
@given(_ops, st.sampled_from(TIERS), st.integers(0, 60))
def test_evictions_are_lru_spare_pins_and_fit_when_possible(ops, tier, budget):
    index, ref = PrefixIndex(), _Reference()
    ids: list[int] = []
    for op in ops:
        if op[0] == "insert":
            _, tokens, t, nbytes = op
            got = index.insert(tokens, t, nbytes=nbytes if t == "ram" else None)
            ids.append(ref.insert(tokens, t, nbytes if t == "ram" else 0, got))
        elif op[0] in ("touch", "pin") and ids and ids[op[1] % len(ids)] in ref.entries:
            entry = ids[op[1] % len(ids)]
            if op[0] == "touch":
                index.touch(entry)
                ref.touch(entry)
            else:
                index.pin(entry)
                ref.entries[entry].pins += 1
    plan = index.evictions(tier, budget)

    unpinned = sorted((e.last_used, i) for i, e in ref.entries.items()
                      if e.tier == tier and not e.pins)
    assert list(plan.victims) == [i for _, i in unpinned[:len(plan.victims)]]  # LRU first
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


def test_evictions_follow_least_recent_use():
    index = PrefixIndex()
    a = index.insert([1] * 10, "kv")
    b = index.insert([2] * 10, "kv")
    c = index.insert([3] * 10, "kv")
    index.touch(a)
    assert index.evictions("kv", 30).victims == ()
    assert index.evictions("kv", 20).victims == (b,)
    assert index.evictions("kv", 5).victims == (b, c, a)


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
    other = index.insert([7], "ram", nbytes=1)
    assert index.insert([1, 2, 3], "ram", nbytes=99) == a  # equal: same id, no double count
    assert index.insert([1, 2], "ram", nbytes=20) == a  # a prefix of it: already covered
    assert len(index) == 2 and index.total("ram") == 31
    assert index.entry(a).nbytes == 30
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
