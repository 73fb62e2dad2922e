"""The scorecard: the design brief's few figures of how well the daemon serves (seed 004,
"Scorecard & observability"), each computed from what the engine measures.

    start = Reading.of(registry)              # or Reading.origin(t): since the engine started
    ...
    card = scorecard(Reading.of(registry), start, model=..., latency_cap=1.2,
                     rss_bytes=rss_bytes())

A pure function over two readings of the metrics registry: the counters' differences and the
histograms' samples between them make the window's figures. docs/design/metrics.md ("Scorecard")
defines every field, its window and its unit.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from uma.metrics import Counter, Histogram, Registry

# The fields in the order the table, the log line and the CSV file show them.
FIELDS = (
    "model", "window", "window_s", "active_s", "tokens_generated", "tokens_per_s",
    "tokens_per_s_at_cap", "latency_cap", "cap_held", "alone_p95_ms", "p95_ms", "p99_ms",
    "ttft_p50_ms", "ttft_p95_ms", "sum_bmt_mb_per_token", "scheduler_efficiency",
    "copy_free_ratio", "gpu_idle_pct", "residency_churn_mb_per_token", "rss_gb",
)

# What a reading keeps of the registry (the names the engine records them under).
COUNTERS = (
    "active_seconds_total", "tokens_generated_total", "tokens_prefilled_total",
    "decode_rows_total", "decode_rows_ready_total", "bmt_bytes_total",
    "tokens_copy_free_total", "decode_seconds_total", "sample_seconds_total",
)
GAPS, ALONE, TTFT = "inter_token_ms_interactive", "inter_token_ms_alone", "ttft_ms_interactive"
HISTOGRAMS = (GAPS, ALONE, TTFT)


@dataclass(frozen=True)
class Reading:
    """The registry's counters and latency histograms the scorecard needs, at one moment."""

    at: float  # time.monotonic() when taken
    counters: Mapping[str, float] = field(default_factory=dict)  # missing: 0
    histograms: Mapping[str, Histogram] = field(default_factory=dict)  # copies; missing: empty

    @classmethod
    def of(cls, registry: Registry, at: float | None = None) -> Reading:
        counters, histograms = {}, {}
        for m in registry:
            if isinstance(m, Counter) and m.name in COUNTERS:
                counters[m.name] = m.value
            elif isinstance(m, Histogram) and m.name in HISTOGRAMS:
                histograms[m.name] = m.copy()
        return cls(time.monotonic() if at is None else at, counters, histograms)

    @classmethod
    def origin(cls, at: float) -> Reading:
        """Nothing counted yet, at `at`: the start of a window since then."""
        return cls(at)

    def histogram(self, name: str) -> Histogram:
        return self.histograms.get(name) or Histogram(name, "")


def scorecard(end: Reading, start: Reading, *, model: str, latency_cap: float,
              rss_bytes: int, window: str = "since_start") -> dict[str, object]:
    """The scorecard of the window from `start` to `end` (docs/design/metrics.md, "Scorecard").
    A figure with nothing to compute it from (no tokens, no gap yet) is None."""
    def delta(name: str) -> float:
        return end.counters.get(name, 0.0) - start.counters.get(name, 0.0)

    active = delta("active_seconds_total")
    tokens = delta("tokens_generated_total")
    gaps = end.histogram(GAPS).since(start.histogram(GAPS))
    ttft = end.histogram(TTFT).since(start.histogram(TTFT))
    # The reference is since the engine started in either window: an interval with background
    # work throughout has no alone gaps of its own, and the streams' pace alone is theirs.
    alone = _quantile(end.histogram(ALONE), 0.95)
    p95 = _quantile(gaps, 0.95)
    if p95 is None:
        held: bool | None = True  # no interactive gap in the window: none went past the cap
    elif alone is None:
        held = None  # no reference yet to hold it against
    else:
        held = p95 <= latency_cap * alone
    rate = _ratio(tokens, active)
    in_flight = delta("decode_seconds_total") + delta("sample_seconds_total")
    idle = _ratio(active - in_flight, active)
    passed = delta("tokens_prefilled_total") + delta("decode_rows_total")
    bmt = _ratio(delta("bmt_bytes_total"), passed)
    copy_free = _ratio(delta("tokens_copy_free_total"), tokens)
    return {
        "model": model,
        "window": window,
        "window_s": round(end.at - start.at, 3),
        "active_s": round(active, 3),
        "tokens_generated": int(tokens),
        "tokens_per_s": _round(rate, 2),
        "tokens_per_s_at_cap": _round(rate, 2) if held else None,
        "latency_cap": latency_cap,
        "cap_held": held,
        "alone_p95_ms": _round(alone, 3),
        "p95_ms": _round(p95, 3),
        "p99_ms": _round(_quantile(gaps, 0.99), 3),
        "ttft_p50_ms": _round(_quantile(ttft, 0.5), 3),
        "ttft_p95_ms": _round(_quantile(ttft, 0.95), 3),
        "sum_bmt_mb_per_token": _round(None if bmt is None else bmt / 1e6, 3),
        "scheduler_efficiency": _round(_ratio(delta("decode_rows_total"),
                                              delta("decode_rows_ready_total")), 4),
        "copy_free_ratio": _round(None if copy_free is None else min(copy_free, 1.0), 4),
        # the spans a decode was in flight may overlap the window's edges by a tick: clipped
        "gpu_idle_pct": _round(None if idle is None else 100.0 * max(idle, 0.0), 2),
        # llama.cpp maps the weights once and owns their pages; uma moves none
        # (docs/design/metrics.md)
        "residency_churn_mb_per_token": 0.0,
        "rss_gb": round(rss_bytes / 1e9, 4),
    }


def rss_bytes() -> int:
    """This process's resident memory: VmRSS in /proc/self/status on Linux; elsewhere the
    peak (getrusage's ru_maxrss), which is what those systems keep."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _quantile(h: Histogram, q: float) -> float | None:
    value = h.quantile(q)
    return None if math.isnan(value) else value


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
