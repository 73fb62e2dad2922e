"""Which cached prefix a request starts from (the tier that saves the most predicted time), and
what keeping an entry is worth."""

from __future__ import annotations

import pytest

from uma.sched.cost import CostEstimate
from uma.sched.reuse import (
    KEEP_HALF_LIFE,
    MAX_APPS,
    MIN_REUSE_TOKENS,
    Candidates,
    Reuse,
    choose_reuse,
    keep_value,
    worth_a_snapshot,
)

# a prompt token costs 1 ms; restores run at 1 MB per ms
COST = CostEstimate(per_prefill_ms=1.0)
RATE = 1e6


def test_live_cells_are_shared_from_the_shortest_worthwhile_match():
    assert choose_reuse(Candidates(MIN_REUSE_TOKENS - 1, 0, 0), COST, RATE) == Reuse("", 0, 0.0)
    assert choose_reuse(Candidates(MIN_REUSE_TOKENS, 0, 0), COST, RATE) == \
        Reuse("kv", MIN_REUSE_TOKENS, MIN_REUSE_TOKENS)


@pytest.mark.parametrize(("ram_bytes", "tier"), [
    (50e6, "ram"),  # a 50 ms copy for 600 tokens of prefill beyond the live 400: restored
    (700e6, "kv"),  # a 700 ms copy saves less than sharing the live cells does
])
def test_a_snapshot_is_restored_where_its_copy_costs_less_than_the_prefill_it_saves(
        ram_bytes, tier):
    choice = choose_reuse(Candidates(400, 1000, int(ram_bytes)), COST, RATE)
    assert choice.tier == tier
    assert choice.tokens == (1000 if tier == "ram" else 400)


def test_a_snapshot_no_longer_than_the_live_match_is_never_restored():
    assert choose_reuse(Candidates(500, 500, 1), COST, RATE).tier == "kv"
    assert choose_reuse(Candidates(0, MIN_REUSE_TOKENS - 1, 1), COST, RATE).tier == ""


def test_a_slower_restore_bandwidth_turns_the_choice():
    c = Candidates(0, 1000, 100_000_000)
    assert choose_reuse(c, COST, 1e6).tier == "ram"  # 100 ms for 1,000 ms of prefill
    assert choose_reuse(c, COST, 5e4).tier == ""  # 2,000 ms: prefilling is faster


def test_a_prefill_is_priced_at_least_at_what_large_prompt_chunks_have_cost():
    # a cost model that learned prompt tokens as nearly free (small chunks on a GPU) would
    # prefill rather than restore; the throughput large chunks showed says otherwise
    free = CostEstimate(per_prefill_ms=0.0001)
    c = Candidates(0, 8000, 263_551_608)
    assert choose_reuse(c, free, 7.8e6).tier == ""
    assert choose_reuse(c, free, 7.8e6, prompt_ms_per_token=0.019).tier == "ram"


def test_a_snapshot_is_worth_its_copy_where_the_prefill_it_saves_is_twice_that():
    assert worth_a_snapshot(1000, None, 1.0)  # no copy timed yet: this one is, to learn it
    assert worth_a_snapshot(1000, 0.01, 20.0)  # 10 ms of copy for 20 ms of prefill
    assert not worth_a_snapshot(1000, 0.01, 19.0)
    # the same entry on a device where prefill is cheap and its scattered cells dear
    assert not worth_a_snapshot(200, 0.3, 5.0)


def test_a_fresh_entry_is_worth_one_reuse_per_cell_whatever_its_length():
    # in the KV tier tokens and cells are one count: length cancels
    assert keep_value(100, 100, hits=0, apps=1, age=0) == 1.0
    assert keep_value(8000, 8000, hits=0, apps=1, age=0) == 1.0
    assert keep_value(100, 100, hits=0, apps=0, age=0) == 1.0  # no app told: counts as one
    # in the RAM tier the cost is bytes: the same entry in twice the bytes is worth half
    assert keep_value(100, 2000, 0, 1, 0) == 2 * keep_value(100, 4000, 0, 1, 0)
    # the tokens only it holds, where others hold a prefix of it, per cell of all it holds
    assert keep_value(30, 430, 0, 1, 0) == pytest.approx(30 / 430)
    assert keep_value(0, 430, 5, 3, 0) == 0.0


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_k_apps_reusing_an_entry_weigh_more_than_one_app_reusing_it_k_times(k):
    # k apps: the first inserted it, each other reused it once; one app: inserted, k reuses
    shared = keep_value(100, 100, hits=k - 1, apps=k, age=0)
    repeated = keep_value(100, 100, hits=k, apps=1, age=0)
    assert shared > repeated


def test_apps_count_up_to_the_bound():
    assert keep_value(100, 100, 1, MAX_APPS + 5, 0) == keep_value(100, 100, 1, MAX_APPS, 0)


def test_worth_halves_every_half_life_of_uses_and_goes_below_a_fresh_entry():
    shared = keep_value(100, 100, hits=1, apps=2, age=0)  # one other app reused it: 4
    assert shared == 4.0
    assert keep_value(100, 100, 1, 2, KEEP_HALF_LIFE) == pytest.approx(shared / 2)
    fresh = keep_value(100, 100, 0, 1, 0)
    assert keep_value(100, 100, 1, 2, 2 * KEEP_HALF_LIFE - 1) > fresh
    assert keep_value(100, 100, 1, 2, 2 * KEEP_HALF_LIFE + 1) < fresh
