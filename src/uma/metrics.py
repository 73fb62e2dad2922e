"""Counters, gauges and histograms cheap enough to record on every tick.

Recording is a few attribute updates under the GIL (no locks: each metric is written by one
thread, the compute thread or the output thread, and read as a consistent-enough snapshot).
`Registry.snapshot()` returns plain dicts for JSON, `uma metrics` and the Prometheus exporter.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

# Latency buckets in milliseconds: fine around interactive inter-token times (5-100 ms), coarse
# out to the multi-second pauses that stock servers show under a long prompt.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    1, 2, 3, 5, 7.5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 100, 125, 150, 200, 250, 300, 400, 500,
    750, 1000, 1500, 2000, 3000, 5000, 10000, 30000,
)


class Counter:
    __slots__ = ("name", "help", "value")

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help, self.value = name, help, 0

    def inc(self, n: float = 1) -> None:
        self.value += n


class Gauge:
    """A value that goes up and down: set by its owner, or read from `fn` when given (for
    what is cheaper to count when asked than to track, e.g. open connections)."""

    __slots__ = ("name", "help", "_value", "fn")

    def __init__(self, name: str, help: str, fn: Callable[[], float] | None = None) -> None:
        self.name, self.help, self._value, self.fn = name, help, 0.0, fn

    def set(self, value: float) -> None:
        self._value = value

    @property
    def value(self) -> float:
        return self.fn() if self.fn is not None else self._value


class Histogram:
    """Fixed buckets (upper bounds). A quantile is found by rank: the bucket holding the q-th
    fraction of the samples, interpolated linearly within it, and never above the largest
    sample seen (the top bucket's bound can be far above it)."""

    __slots__ = ("name", "help", "bounds", "counts", "count", "sum", "max")

    def __init__(self, name: str, help: str, bounds: Iterable[float] = LATENCY_BUCKETS_MS) -> None:
        self.name, self.help = name, help
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value

    def quantile(self, q: float) -> float:
        if self.count == 0:
            return math.nan
        rank = q * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            if c and seen + c >= rank:
                lo = self.bounds[i - 1] if i > 0 else 0.0
                hi = min(self.bounds[i], self.max) if i < len(self.bounds) else self.max
                return min(lo + (hi - lo) * ((rank - seen) / c), self.max)
            seen += c
        return self.max

    def copy(self) -> Histogram:
        """The samples so far, apart from later ones: a reading that `since` subtracts."""
        h = Histogram(self.name, self.help, self.bounds)
        h.counts = list(self.counts)
        # From the copied buckets, not self.count: another thread's observe() may have
        # counted a sample between the two reads.
        h.count, h.sum, h.max = sum(h.counts), self.sum, self.max
        return h

    def since(self, earlier: Histogram) -> Histogram:
        """The samples observed after `earlier` (a copy of this histogram) was taken. A
        window's own largest sample is not kept, so its max, and the cap on its quantiles,
        is this histogram's: a quantile in the top bucket may be above the window's."""
        h = Histogram(self.name, self.help, self.bounds)
        h.counts = [a - b for a, b in zip(self.counts, earlier.counts, strict=True)]
        h.count, h.sum, h.max = sum(h.counts), self.sum - earlier.sum, self.max
        return h

    def summary(self) -> dict[str, float]:
        mean = self.sum / self.count if self.count else math.nan
        return {
            "count": self.count, "mean": mean, "p50": self.quantile(0.5),
            "p95": self.quantile(0.95), "p99": self.quantile(0.99), "max": self.max,
        }


M = TypeVar("M", "Counter", "Histogram")


class Family(Generic[M]):
    """Instruments of one kind, one for each value of a label (an app's name), made on first
    use. Past max_children values, new ones share the child named OVERFLOW: names that
    clients choose (or that connections get) must not grow the daemon's memory for ever."""

    __slots__ = ("name", "help", "label", "kind", "children", "max_children")
    OVERFLOW = "other"

    def __init__(self, name: str, help: str, label: str, kind: type[M],
                 max_children: int = 64) -> None:
        self.name, self.help, self.label, self.kind = name, help, label, kind
        self.children: dict[str, M] = {}
        self.max_children = max_children

    def child(self, value: str) -> M:
        c = self.children.get(value)
        if c is None:
            if len(self.children) >= self.max_children:
                value = self.OVERFLOW
                c = self.children.get(value)
            if c is None:
                c = self.children[value] = self.kind(self.name, self.help)
        return c

    def summary(self) -> dict[str, object]:
        return {value: c.summary() if isinstance(c, Histogram) else c.value
                for value, c in self.children.items()}


class LoadMeter:
    """The share of recent wall time spent busy, over a window of whole seconds: per-second
    sums, so recording is two list writes (per tick) and reading sums the window."""

    __slots__ = ("window", "_busy", "_second")

    def __init__(self, window_s: int = 10) -> None:
        self.window = window_s
        self._busy = [0.0] * window_s
        self._second = [-1] * window_s  # which second each slot holds

    def add(self, busy_s: float, now: float) -> None:
        second = int(now)
        i = second % self.window
        if self._second[i] != second:
            self._second[i], self._busy[i] = second, 0.0
        self._busy[i] += busy_s

    def value(self, now: float) -> float:
        """Busy share of the last `window` seconds (the current one counted in full)."""
        second = int(now)
        busy = sum(b for b, s in zip(self._busy, self._second, strict=True)
                   if second - self.window < s <= second)
        return min(1.0, busy / self.window)


Instrument = Counter | Gauge | Histogram | Family[Counter] | Family[Histogram]


class Registry:
    """Named metrics; creating one twice returns the first."""

    def __init__(self) -> None:
        self._metrics: dict[str, Instrument] = {}

    def _get(self, cls, name: str, help: str, *args):
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = cls(name, help, *args)
        elif not isinstance(metric, cls):
            raise TypeError(f"metric {name} already exists as a {type(metric).__name__}")
        return metric

    def counter(self, name: str, help: str) -> Counter:
        return self._get(Counter, name, help)

    def gauge(self, name: str, help: str, fn: Callable[[], float] | None = None) -> Gauge:
        return self._get(Gauge, name, help, fn)

    def histogram(
        self, name: str, help: str, bounds: Iterable[float] = LATENCY_BUCKETS_MS
    ) -> Histogram:
        return self._get(Histogram, name, help, bounds)

    def family(self, name: str, help: str, label: str, kind: type[M]) -> Family[M]:
        """Per-`label` instruments of `kind` (e.g. per app), under one name."""
        return self._get(Family, name, help, label, kind)

    def lane(self, prefix: str) -> Registry:
        """A view for a second scheduler (a background context, uma.engine.background): its
        counters, histograms and families are this registry's (the two add up: tokens, time
        to first token by class), its gauges are its own, named with prefix (the requests it
        runs, its KV cells: a state, which the two would overwrite)."""
        return _Lane(self, prefix)

    def __iter__(self):
        return iter(list(self._metrics.values()))

    def snapshot(self) -> dict[str, object]:
        """{name: value} for counters and gauges, {name: summary dict} for histograms, and
        {name: {label value: either}} for families."""
        out: dict[str, object] = {}
        for m in self:
            out[m.name] = m.summary() if isinstance(m, Histogram | Family) else m.value
        return out


class _Lane(Registry):
    def __init__(self, parent: Registry, prefix: str) -> None:
        super().__init__()
        self._metrics = parent._metrics
        self._prefix = prefix

    def gauge(self, name: str, help: str, fn: Callable[[], float] | None = None) -> Gauge:
        return super().gauge(self._prefix + name, help, fn)
