"""The scorecard served (docs/design/metrics.md, "Scorecard"): a `uma run --http` subprocess on a
tiny synthetic model, asked through every door, and its interval log; the log's writer alone."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from uma import testing
from uma.client import Client
from uma.scorecard import FIELDS
from uma.server.scorecard_log import HEADER, ScorecardLog

INTERVAL_S = 0.2


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory):
    return tmp_path_factory.mktemp("scorecard") / "scorecard.csv"


@pytest.fixture(scope="module")
def daemon(tiny_path, csv_path):
    env = {"UMA_SCORECARD_INTERVAL_S": str(INTERVAL_S), "UMA_SCORECARD_CSV": str(csv_path)}
    # One compute thread: on a busy machine ggml's threads wait for each other at every
    # barrier, and a tiny model's decode slows a hundredfold (tests/server/test_http.py).
    with testing.run_daemon(tiny_path, "--http", "127.0.0.1:0", "--ctx", "8192",
                            "--threads", "1", env=env) as d:
        yield d


def wait_for(predicate, timeout=30.0, interval=0.05):
    """Polls a condition of another process (its file, its log), failing after timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


def vmrss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_every_door_serves_the_same_fields(daemon):
    with Client(daemon.socket) as c:
        c.generate("Once upon a time", max_tokens=16, ignore_eos=True)
        socket_card = c.scorecard()
    http_card = httpx.get(f"{daemon.http_url}/scorecard", timeout=30).json()
    metrics = httpx.get(f"{daemon.http_url}/metrics", timeout=30,
                        headers={"Accept": "application/json"})
    assert metrics.headers["content-type"] == "application/json"
    r = subprocess.run([sys.executable, "-m", "uma", "scorecard", "--json", "--socket",
                        daemon.socket], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cards = [socket_card, http_card, metrics.json(), json.loads(r.stdout)]
    assert all(list(card) == list(FIELDS) for card in cards)
    assert socket_card["tokens_generated"] >= 16 and socket_card["window"] == "since_start"
    assert all(socket_card[f] is not None for f in (
        "tokens_per_s", "p95_ms", "ttft_p50_ms", "sum_bmt_mb_per_token", "scheduler_efficiency",
        "copy_free_ratio", "gpu_idle_pct", "rss_gb"))
    # Prometheus scrapers, which ask for text, still get it
    text = httpx.get(f"{daemon.http_url}/metrics", timeout=30,
                     headers={"Accept": "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"})
    assert text.headers["content-type"].startswith("text/plain") and "# TYPE uma_" in text.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_rss_is_the_daemons_resident_memory(daemon):
    with Client(daemon.socket) as c:
        card = c.scorecard()
    assert abs(card["rss_gb"] * 1e9 - vmrss(daemon.pid)) <= 0.1 * vmrss(daemon.pid)


def test_tokens_per_second_agree_with_what_the_client_counted(daemon):
    """The engine's rate is per second of active time (a request queued or running); the
    client's, over its own wall time from the first submit to the last result, holds the
    active time and its edges (the socket both ways, tokenising the prompts): a few ms of a
    run of about a second, so the two agree within 20 % (the engine's never the lower, but
    for the card's rounding of active_s to the millisecond)."""
    with Client(daemon.socket) as c:
        before = c.scorecard()
        t0 = time.monotonic()
        streams = [c.submit(f"stream {i} of four", max_tokens=160, ignore_eos=True)
                   for i in range(4)]
        counted = sum(s.result().usage.completion_tokens for s in streams)
        wall = time.monotonic() - t0
        after = c.scorecard()
    assert after["tokens_generated"] - before["tokens_generated"] == counted == 4 * 160
    active = after["active_s"] - before["active_s"]
    engine_rate, client_rate = counted / active, counted / wall
    assert 0.98 * client_rate <= engine_rate <= 1.2 * client_rate, (engine_rate, client_rate)
    # interactive streams alone hold the cap, so the rate at the cap is the rate
    assert after["cap_held"] is True
    assert after["tokens_per_s_at_cap"] == after["tokens_per_s"] == pytest.approx(
        after["tokens_generated"] / after["active_s"], rel=0.01)


def test_each_interval_is_logged_and_written_to_the_csv_file(daemon, csv_path):
    with Client(daemon.socket) as c:
        c.generate("an interval", max_tokens=8, ignore_eos=True)

    def rows() -> list[list[str]]:
        with open(csv_path, newline="") as f:
            return list(csv.reader(f))
    wait_for(lambda: len(rows()) >= 3)  # the header and two intervals
    header, *entries = rows()
    assert tuple(header) == HEADER and header.count("time") == 1
    assert all(len(row) == len(HEADER) and row[HEADER.index("window")] == "interval"
               for row in entries)
    logged = [line for line in daemon.stderr if "uma.scorecard: scorecard {" in line]
    assert logged, "no scorecard line in the daemon's log"
    card = json.loads(logged[-1].split("scorecard ", 1)[1])
    assert list(card) == list(FIELDS) and card["window"] == "interval"


# --- the log's writer, alone ----------------------------------------------------------------


class _Engine:
    """What ScorecardLog asks of an engine, with a card per interval."""

    def __init__(self) -> None:
        self.cards = 0
        self.written = threading.Event()

    def reading(self) -> int:
        return self.cards

    def scorecard(self, since: int, now: int) -> dict:
        self.cards += 1
        if self.cards >= 2:
            self.written.set()
        return {"model": "m", "window": "interval", "tokens_generated": self.cards,
                "p95_ms": None}


def test_the_header_is_written_once_and_a_missing_value_is_an_empty_cell(tmp_path):
    path = tmp_path / "s.csv"
    first = ScorecardLog(0.01, str(path))
    engine = _Engine()
    first.start(engine)
    assert engine.written.wait(30)
    first.stop()
    ScorecardLog(0.01, str(path)).write({"model": "m", "tokens_generated": 9})  # appended
    with open(path, newline="") as f:
        header, *entries = list(csv.reader(f))
    assert tuple(header) == HEADER and len(entries) >= 3
    assert all(row[0] != "time" for row in entries)
    last = dict(zip(HEADER, entries[-1], strict=True))
    assert (last["model"], last["tokens_generated"], last["p95_ms"]) == ("m", "9", "")


def test_a_csv_path_that_cannot_be_written_fails_at_once(tmp_path):
    with pytest.raises(OSError):
        ScorecardLog(1.0, str(tmp_path / "no" / "such" / "dir.csv"))
    assert not os.path.exists(tmp_path / "no")
