"""Counters, gauges and histograms (uma.metrics)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from uma.metrics import Histogram, Registry

samples = st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), min_size=1,
                   max_size=200)


@given(samples)
def test_quantiles_are_ordered_and_never_above_the_largest_sample(values):
    h = Histogram("x", "")
    for v in values:
        h.observe(v)
    s = h.summary()
    assert s["p50"] <= s["p95"] <= s["p99"] <= s["max"] == max(values)
    assert s["count"] == len(values)
    assert math.isclose(s["mean"], sum(values) / len(values), rel_tol=1e-9, abs_tol=1e-9)


def test_a_tight_cluster_inside_one_bucket_reports_no_percentile_past_its_maximum():
    # Ticks of 2.0-2.11 ms all land in the (2, 3] bucket: interpolating to the bucket's
    # bound once reported p95 2.70 and p99 2.94 beside max 2.11.
    h = Histogram("tick_ms", "")
    for i in range(100):
        h.observe(2.0 + 0.11 * i / 99)
    s = h.summary()
    assert s["p95"] <= s["max"] and s["p99"] <= s["max"]
    assert s["max"] == 2.11


def test_registry_returns_the_first_metric_of_a_name():
    reg = Registry()
    c = reg.counter("requests_total", "requests")
    assert reg.counter("requests_total", "again") is c
    c.inc(3)
    assert reg.snapshot() == {"requests_total": 3}
