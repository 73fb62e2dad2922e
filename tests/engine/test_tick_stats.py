"""The tick statistics' own bookkeeping."""

import dataclasses

from uma.engine.tick_stats import LARGE_CHUNK, TickReport, TickStats
from uma.metrics import Registry
from uma.sched.cost import CostModel
from uma.sched.state import BatchItem, Phase, Plan, PlanNotes


def report(n_prefill: int, tick_ms: float) -> TickReport:
    plan = Plan(items=(BatchItem(0, Phase.PREFILL, n_prefill, logits=True),))
    return TickReport(plan, n_prefill, 0, tick_ms / 1e3, 0.0, tick_ms / 1e3, tick_ms / 1e3, 1,
                      0, 0, False, None, 0, 1)


def test_what_a_prompt_token_costs_is_learned_from_large_chunks_only():
    stats = TickStats(Registry(), CostModel())
    stats.record(report(LARGE_CHUNK - 1, 100.0))  # mostly the tick's fixed cost on a GPU
    assert stats.prompt_ms_per_token == 0.0
    stats.record(report(1000, 150.0))
    assert stats.prompt_ms_per_token == 0.15
    stats.record(report(1000, 250.0))  # smoothed
    assert 0.15 < stats.prompt_ms_per_token < 0.25


def test_the_tick_is_shared_out_between_apps_as_their_rows_were_priced():
    stats = TickStats(Registry(), CostModel())
    stats.record(dataclasses.replace(report(300, 90.0), apps={"editor": 1.0, "batch": 2.0}))
    stats.record(dataclasses.replace(report(300, 10.0), apps={"editor": 0.0, "batch": 0.0}))
    service = {app: c.value for app, c in stats.m.app_service.children.items()}
    assert service == {"editor": 30.0 + 5.0, "batch": 60.0 + 5.0}  # evenly where unpriced


def test_pauses_and_the_background_contexts_grants_are_counted():
    stats = TickStats(Registry(), CostModel())
    plain = report(16, 20.0)
    paused = dataclasses.replace(plain, plan=dataclasses.replace(
        plain.plan, notes=PlanNotes(budget_ms=80.0, paused=True, apart_ms=45.0)))
    for t in (plain, paused, plain):
        stats.record(t)
    assert stats.m.pauses.value == 1 and stats.m.apart_ms.value == 45.0


def test_the_scorecards_counts_follow_each_tick():
    stats = TickStats(Registry(), CostModel())
    plan = Plan(items=(BatchItem(0, Phase.DECODE, 1, logits=True),
                       BatchItem(1, Phase.DECODE, 1, logits=True)))
    tick = dataclasses.replace(report(0, 10.0), plan=plan, n_decode=2, n_ready=3,
                               bmt_bytes=5e6, n_copy_free=2, n_sampled=2, sample_s=0.004)
    stats.record(tick)
    stats.record(dataclasses.replace(tick, n_sampled=0, sample_s=0.0))  # a chunk, no logits
    m = stats.m
    assert (m.decode_rows.value, m.decode_ready.value) == (4, 6)
    assert (m.bmt_bytes.value, m.copy_free.value) == (1e7, 4)
    assert m.sampling_ms_last.value == 4.0  # the last tick that sampled
