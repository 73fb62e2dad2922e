"""Prometheus text rendered from uma.metrics instruments; no model needed."""

from __future__ import annotations

import math

from uma.metrics import Counter, Histogram, Registry
from uma.server import prometheus


def test_counters_gauges_and_histograms():
    reg = Registry()
    reg.counter("requests_stop_total", "requests ended: stop").inc(3)
    reg.gauge("kv_cells_used", "KV positions held").set(1.5)
    h = reg.histogram("tick_ms", "whole tick time", bounds=(1, 2.5, 10))
    for value in (0.5, 1, 2, 7, 50):
        h.observe(value)
    assert prometheus.render(reg) == "\n".join([
        "# HELP uma_requests_stop_total requests ended: stop",
        "# TYPE uma_requests_stop_total counter",
        "uma_requests_stop_total 3",
        "# HELP uma_kv_cells_used KV positions held",
        "# TYPE uma_kv_cells_used gauge",
        "uma_kv_cells_used 1.5",
        "# HELP uma_tick_ms whole tick time",
        "# TYPE uma_tick_ms histogram",
        'uma_tick_ms_bucket{le="1"} 2',  # le is inclusive: 1 falls in the first bucket
        'uma_tick_ms_bucket{le="2.5"} 3',
        'uma_tick_ms_bucket{le="10"} 4',
        'uma_tick_ms_bucket{le="+Inf"} 5',
        "uma_tick_ms_sum 60.5",
        "uma_tick_ms_count 5",
    ]) + "\n"


def test_per_class_metrics_share_one_family_with_a_class_label():
    reg = Registry()
    reg.histogram("ttft_ms_interactive", "time to first token, interactive", (50,)).observe(20)
    reg.histogram("ttft_ms_background", "time to first token, background", (50,)).observe(80)
    text = prometheus.render(reg)
    assert text.count("# TYPE uma_ttft_ms histogram") == 1
    assert "# HELP uma_ttft_ms time to first token\n" in text
    assert 'uma_ttft_ms_bucket{class="interactive",le="50"} 1' in text
    assert 'uma_ttft_ms_bucket{class="background",le="50"} 0' in text
    assert 'uma_ttft_ms_count{class="background"} 1' in text


def test_special_values_and_help_escapes():
    reg = Registry()
    reg.gauge("a", "line one\nback\\slash").set(math.nan)
    reg.gauge("b", "b").set(math.inf)
    text = prometheus.render(reg)
    assert "# HELP uma_a line one\\nback\\\\slash" in text
    assert "uma_a NaN" in text and "uma_b +Inf" in text


def test_per_app_metrics_are_one_family_with_an_app_label():
    reg = Registry()
    tokens = reg.family("app_tokens_total", "tokens generated", "app", Counter)
    tokens.child("editor").inc(3)
    tokens.child('odd"name').inc(1)
    reg.family("app_ttft_ms", "time to first token", "app", Histogram).child("editor").observe(7)
    text = prometheus.render(reg)
    assert "# TYPE uma_app_tokens_total counter" in text
    assert 'uma_app_tokens_total{app="editor"} 3' in text
    assert 'uma_app_tokens_total{app="odd\\"name"} 1' in text  # escaped
    assert 'uma_app_ttft_ms_bucket{app="editor",le="7.5"} 1' in text
    assert 'uma_app_ttft_ms_count{app="editor"} 1' in text
