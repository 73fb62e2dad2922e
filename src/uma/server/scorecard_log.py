"""The scorecard logged every `scorecard_interval_s` seconds: one log line each, and a row of a
CSV file when `scorecard_csv` is set (docs/design/metrics.md, "Scorecard").

Each entry is the scorecard of the interval since the last one, so the file is a time series.
It runs on a thread of its own that sleeps between entries: the compute thread only bumps the
counters it reads, and an idle daemon still wakes once an interval, not more.
"""

from __future__ import annotations

import csv
import datetime
import json
import logging
import os
import threading
from typing import TYPE_CHECKING

from uma.scorecard import FIELDS

if TYPE_CHECKING:
    from uma.engine import Engine

log = logging.getLogger("uma.scorecard")

HEADER = ("time", *FIELDS)  # time: when the interval ended, UTC (ISO 8601)


class ScorecardLog:
    """Logs an engine's scorecard every interval_s seconds, and appends it to csv_path."""

    def __init__(self, interval_s: float, csv_path: str | None = None) -> None:
        """Opens (creates) the CSV file now, so that a path that cannot be written fails the
        daemon's start, before the model loads, rather than the first interval: OSError."""
        self.interval_s = interval_s
        self.csv_path = None if csv_path is None else os.path.expanduser(csv_path)
        if self.csv_path is not None:
            with open(self.csv_path, "a", newline="", encoding="utf-8") as f:
                if f.tell() == 0:  # a new (or empty) file: the header, once
                    csv.writer(f).writerow(HEADER)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, engine: Engine) -> None:
        """Logs `engine`'s scorecard from now on, on a thread of its own."""
        self._thread = threading.Thread(target=self._run, args=(engine,), name="uma-scorecard",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread (after the entry it may be writing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, engine: Engine) -> None:
        since = engine.reading()
        while not self._stop.wait(self.interval_s):
            now = engine.reading()
            try:
                self.write(engine.scorecard(since, now))
            except Exception:  # noqa: BLE001 - a full disk: said, and tried again next time
                log.exception("could not write the scorecard")
            since = now

    def write(self, card: dict[str, object]) -> None:
        """One entry: the log line, then the CSV row."""
        log.info("scorecard %s", json.dumps(card, separators=(",", ":")))
        if self.csv_path is None:
            return
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        cells = ["" if card.get(f) is None else card[f] for f in FIELDS]
        with open(self.csv_path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f).writerow([stamp, *cells])
