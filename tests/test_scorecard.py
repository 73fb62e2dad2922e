"""The scorecard's figures from readings of a registry, each field by its definition
(docs/design/metrics.md, "Scorecard"); no engine."""

from __future__ import annotations

import sys

import pytest

from uma import scorecard as sc
from uma.metrics import Registry

CARD = {"model": "m.gguf", "latency_cap": 1.2, "rss_bytes": 3_000_000_000}


def registry() -> Registry:
    reg = Registry()
    for name in sc.COUNTERS:
        reg.counter(name, "")
    for name in sc.HISTOGRAMS:
        reg.histogram(name, "")
    return reg


def count(reg: Registry, **values: float) -> None:
    """Adds to counters, by name without `_total`."""
    for name, value in values.items():
        reg.counter(f"{name}_total", "").inc(value)


def gaps(reg: Registry, name: str, ms: float, n: int) -> None:
    for _ in range(n):
        reg.histogram(name, "").observe(ms)


def card(reg: Registry, start: sc.Reading | None = None, at: float = 10.0) -> dict:
    return sc.scorecard(sc.Reading.of(reg, at), start or sc.Reading.origin(0.0), **CARD)


def test_each_field_by_its_definition():
    reg = registry()
    count(reg, active_seconds=4.0, tokens_generated=400, tokens_prefilled=100,
          decode_rows=300, decode_rows_ready=400, bmt_bytes=8e8, tokens_copy_free=100,
          decode_seconds=2.5, sample_seconds=0.5)
    gaps(reg, sc.GAPS, 10.0, 100)
    gaps(reg, sc.ALONE, 10.0, 100)
    gaps(reg, sc.TTFT, 50.0, 4)
    c = card(reg)
    assert list(c) == list(sc.FIELDS)
    assert c["model"] == "m.gguf" and c["window"] == "since_start"
    assert (c["window_s"], c["active_s"], c["tokens_generated"]) == (10.0, 4.0, 400)
    assert c["tokens_per_s"] == 100.0  # per second of active time, not of the window
    assert c["cap_held"] is True and c["tokens_per_s_at_cap"] == 100.0
    # percentiles from the buckets: within the one the samples are in (7.5, 10]
    assert 7.5 < c["p95_ms"] == c["alone_p95_ms"] <= c["p99_ms"] <= 10.0
    assert 40.0 < c["ttft_p50_ms"] <= 50.0
    assert c["sum_bmt_mb_per_token"] == 2.0  # 800 MB over 100 prompt tokens + 300 rows
    assert c["scheduler_efficiency"] == 0.75
    assert c["copy_free_ratio"] == 0.25
    assert c["gpu_idle_pct"] == 25.0  # 3 s of 4 with a decode in flight
    assert c["residency_churn_mb_per_token"] == 0.0
    assert c["rss_gb"] == 3.0


def test_an_interval_counts_only_what_happened_in_it():
    reg = registry()
    count(reg, active_seconds=100.0, tokens_generated=100)
    gaps(reg, sc.GAPS, 5.0, 1000)  # fast gaps before the interval
    gaps(reg, sc.ALONE, 5.0, 1000)
    start = sc.Reading.of(reg, 100.0)
    count(reg, active_seconds=2.0, tokens_generated=600)
    gaps(reg, sc.GAPS, 40.0, 50)  # slow ones in it, beside background work
    c = sc.scorecard(sc.Reading.of(reg, 105.0), start, window="interval", **CARD)
    assert (c["window"], c["window_s"], c["active_s"]) == ("interval", 5.0, 2.0)
    assert (c["tokens_generated"], c["tokens_per_s"]) == (600, 300.0)
    assert 30.0 < c["p95_ms"] <= 40.0  # the interval's own, not diluted by the past
    assert 3.0 < c["alone_p95_ms"] <= 5.0  # the reference: since the start
    assert c["cap_held"] is False and c["tokens_per_s_at_cap"] is None


def test_the_cap_holds_within_latency_cap_times_the_gaps_alone():
    reg = registry()
    count(reg, active_seconds=1.0, tokens_generated=10)
    gaps(reg, sc.ALONE, 10.0, 100)
    gaps(reg, sc.GAPS, 10.0, 100)
    gaps(reg, sc.GAPS, 11.5, 100)  # beside background work: within 1.2x
    assert card(reg)["cap_held"] is True
    gaps(reg, sc.GAPS, 50.0, 200)
    assert card(reg)["cap_held"] is False


def test_with_nothing_to_compute_from_a_figure_is_none():
    c = card(registry())
    assert c["tokens_per_s"] is None and c["p95_ms"] is None and c["gpu_idle_pct"] is None
    assert c["cap_held"] is True  # no interactive gap went past the cap
    reg = registry()
    gaps(reg, sc.GAPS, 10.0, 10)  # gaps, but never one without background work
    assert card(reg)["cap_held"] is None and card(reg)["tokens_per_s_at_cap"] is None
    assert card(Registry())["tokens_generated"] == 0  # a registry without the engine's metrics


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_rss_is_vmrss():
    with open("/proc/self/status") as f:
        vmrss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert abs(sc.rss_bytes() - vmrss) <= 0.1 * vmrss
