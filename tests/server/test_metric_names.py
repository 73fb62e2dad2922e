"""One catalogue of metric names: docs/design/metrics.md's table, checked against a running daemon's
`uma metrics` and `/metrics` (a name added, renamed or dropped anywhere fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from uma import testing
from uma.client import Client
from uma.server import prometheus

DOC = Path(__file__).resolve().parents[2] / "docs" / "design" / "metrics.md"
CLASSES = ("_interactive", "_background")


def documented() -> set[str]:
    names = re.findall(r"^\| `uma_([a-z0-9_]+)(?:\{(?:class|app|drafter)\})?` \|",
                       DOC.read_text(), re.M)
    assert len(names) == len(set(names)), "a name is listed twice"
    return set(names)


def from_snapshot(snapshot: dict) -> set[str]:
    names = set()
    for name in snapshot:
        if name == "model":  # the one field that is not a metric (documented as such)
            continue
        names.add(next((name.removesuffix(c) for c in CLASSES if name.endswith(c)), name))
    return names


def from_prometheus(text: str) -> set[str]:
    return {line.split()[2].removeprefix(prometheus.PREFIX)
            for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_docs_socket_and_prometheus_name_the_same_metrics(tiny_path):
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0") as d, Client(d.socket) as c:
        c.generate("hello", max_tokens=3)
        snapshot = c.metrics()
        text = httpx.get(f"{d.http_url}/metrics", timeout=30).text
    docs, socket_view, http_view = documented(), from_snapshot(snapshot), from_prometheus(text)
    assert socket_view == http_view, (socket_view ^ http_view)
    assert docs == http_view, f"undocumented: {http_view - docs}; gone: {docs - http_view}"
