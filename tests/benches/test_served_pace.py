"""The served-pace window (benches/served_pace.py) on hand-made streams: tokens/s is counted
only while every stream decodes, and an event that carried two tokens counts two."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from served_pace import window  # noqa: E402


def test_only_the_window_where_every_stream_decodes_counts():
    early = {"times": [0.0, 1.0, 2.0, 3.0, 4.0], "tokens": 5, "events": 5}
    late = {"times": [2.0, 3.0, 4.0, 5.0, 6.0], "tokens": 5, "events": 5}
    got = window([early, late])
    # the window is (2, 4]: early's tokens at 3 and 4, late's at 3 and 4
    assert got["tps"] == pytest.approx(4 / 2.0)
    assert got["tokens"] == 10 and got["gap_p50_ms"] == pytest.approx(1000.0)


def test_an_event_carrying_two_tokens_counts_both():
    s = {"times": [0.0, 1.0, 2.0], "tokens": 6, "events": 3}
    assert window([s])["tps"] == pytest.approx(2 * 2 / 2.0)


def test_a_stream_with_no_token_gives_no_figure():
    got = window([{"times": [0.0, 1.0], "tokens": 2, "events": 2},
                  {"times": [], "tokens": 0, "events": 0}])
    assert got["tps"] != got["tps"]  # NaN: nothing to compare
