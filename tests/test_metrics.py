"""Counters, gauges and histograms (uma.metrics)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from uma.metrics import Counter, Histogram, Registry

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


def test_a_family_makes_one_instrument_per_label_value_up_to_its_limit():
    reg = Registry()
    tokens = reg.family("app_tokens_total", "tokens", "app", Counter)
    assert reg.family("app_tokens_total", "tokens", "app", Counter) is tokens
    tokens.max_children = 3
    for app, n in [("editor", 2), ("chat", 1), ("editor", 3), ("a", 1), ("b", 4), ("c", 5)]:
        tokens.child(app).inc(n)
    # past three apps, new ones count together, as "other"
    assert reg.snapshot()["app_tokens_total"] == {"editor": 5, "chat": 1, "a": 1, "other": 9}
    ttft = reg.family("app_ttft_ms", "ttft", "app", Histogram)
    ttft.child("editor").observe(12.0)
    assert reg.snapshot()["app_ttft_ms"]["editor"]["count"] == 1


def test_a_lane_shares_counters_and_histograms_and_names_its_own_gauges():
    reg = Registry()
    lane = reg.lane("background_")
    reg.counter("tokens_total", "t").inc(2)
    lane.counter("tokens_total", "t").inc(3)
    lane.histogram("ttft_ms", "h").observe(5.0)
    reg.gauge("requests_running", "r").set(4)
    lane.gauge("requests_running", "r").set(1)
    snap = reg.snapshot()
    assert snap["tokens_total"] == 5
    assert snap["ttft_ms"]["count"] == 1
    assert snap["requests_running"] == 4 and snap["background_requests_running"] == 1


def test_a_window_of_a_histogram_holds_the_samples_since_its_copy():
    h = Histogram("gap", "")
    for ms in (5.0,) * 100:
        h.observe(ms)
    earlier = h.copy()
    for ms in (40.0,) * 10:
        h.observe(ms)
    window = h.since(earlier)
    assert (window.count, window.sum) == (10, 400.0)
    assert 30.0 < window.quantile(0.5) <= 40.0  # the window's, not the 100 before it
    assert h.copy().since(h.copy()).count == 0 and math.isnan(h.since(h).quantile(0.95))
    earlier.observe(1.0)  # a copy is apart from its original
    assert h.count == 110
