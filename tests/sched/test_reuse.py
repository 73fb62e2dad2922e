"""Which cached prefix a request starts from: the tier that saves the most predicted time."""

from __future__ import annotations

import pytest

from uma.sched.cost import CostEstimate
from uma.sched.reuse import MIN_REUSE_TOKENS, Candidates, Reuse, choose_reuse, worth_a_snapshot

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
