"""uma.metrics instruments as Prometheus text exposition (format 0.0.4). Data in, text out.

Every metric is named ``uma_<name>``. Metrics kept once per priority class (``ttft_ms_interactive``,
``ttft_ms_background``) become one metric with a ``class`` label, so a dashboard can sum or
compare the classes: ``uma_ttft_ms_bucket{class="interactive",le="50"}``. docs/design/metrics.md
lists the names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from uma.metrics import Counter, Family, Gauge, Histogram
from uma.priority import Priority

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "uma_"

Metric = Counter | Gauge | Histogram | Family
_KINDS = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}


def render(metrics: Iterable[Metric]) -> str:
    """The exposition text of `metrics` (a uma.metrics.Registry or any iterable of its
    instruments): one HELP and TYPE header per family, then its samples."""
    families: dict[str, list[tuple[str, Metric]]] = {}
    lines: list[str] = []
    for metric in metrics:
        if isinstance(metric, Family):
            lines.extend(_family(metric))
            continue
        base, klass = _split_class(metric.name)
        families.setdefault(base, []).append((klass, metric))
    for base, members in families.items():
        name = PREFIX + base
        first = members[0][1]
        help_text = first.help
        if members[0][0]:
            help_text = help_text.removesuffix(f", {members[0][0]}")
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {_KINDS[type(first)]}")
        for klass, metric in members:
            label = f'class="{klass}"' if klass else ""
            if isinstance(metric, Histogram):
                lines.extend(_histogram(name, label, metric))
            else:
                lines.append(f"{name}{_labels(label)} {_number(metric.value)}")
    return "\n".join(lines) + "\n"


def _family(f: Family) -> list[str]:
    """A labelled family: `uma_app_ttft_ms_bucket{app="editor",le="50"}`."""
    name = PREFIX + f.name
    lines = [f"# HELP {name} {_escape_help(f.help)}", f"# TYPE {name} {_KINDS[f.kind]}"]
    for value, metric in f.children.items():
        label = f'{f.label}="{_escape_label(value)}"'
        if isinstance(metric, Histogram):
            lines.extend(_histogram(name, label, metric))
        else:
            lines.append(f"{name}{_labels(label)} {_number(metric.value)}")
    return lines


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _split_class(name: str) -> tuple[str, str]:
    """('ttft_ms', 'interactive') for 'ttft_ms_interactive'; (name, '') for the rest."""
    for priority in Priority:
        suffix = "_" + priority.value
        if name.endswith(suffix):
            return name[: -len(suffix)], priority.value
    return name, ""


def _histogram(name: str, label: str, h: Histogram) -> list[str]:
    # Bucket counts are per bucket in uma.metrics; Prometheus buckets are cumulative.
    lines = []
    total = 0
    for bound, count in zip((*h.bounds, math.inf), h.counts, strict=True):
        total += count
        le = f'le="{_number(bound)}"'
        lines.append(f"{name}_bucket{_labels(label, le)} {total}")
    lines.append(f"{name}_sum{_labels(label)} {_number(h.sum)}")
    lines.append(f"{name}_count{_labels(label)} {h.count}")
    return lines


def _labels(*pairs: str) -> str:
    inner = ",".join(p for p in pairs if p)
    return f"{{{inner}}}" if inner else ""


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:  # NaN
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
