"""The working day's bookkeeping (benches/working_day.py) on hand-made records: each kind's
figures by third of the day, the cached share, and the ratios its targets are judged by."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

from working_day import Done, summary  # noqa: E402


def test_the_day_is_summed_up_per_kind_and_against_its_targets():
    done = [
        Done("agent", 0, 1.0, 400.0, 1540, 0, 0),  # the day's first agent prefills the prompt
        Done("agent", 1, 20.0, 60.0, 1540, 1500, 0),
        Done("agent", 2, 50.0, 80.0, 1540, 1500, 0),
        Done("chat", 0, 2.0, 100.0, 200, 0, 0),
        Done("chat", 0, 30.0, 120.0, 432, 200, 1),
        Done("chat", 0, 70.0, 90.0, 664, 432, 2),
        Done("chat", 0, 100.0, 110.0, 896, 664, 3),
        Done("short", 0, 5.0, 10.0, 10, 0, 0),
        Done("short", 0, 65.0, 30.0, 10, 0, 1),
        Done("embed", 0, 10.0, 50.0),
    ]
    out = summary(done, fresh_short_ms=10.0, minutes=2.0)  # thirds of 40 s
    assert out["requests"] == 10
    # medians by third (the upper one of two), a third with none of a kind left as nan
    first, second, last = out["agent"]["p50_by_third_ms"]
    assert out["agent"]["n"] == 3 and (first, second) == (400.0, 80.0) and math.isnan(last)
    assert out["chat"]["p50_by_third_ms"] == [120.0, 90.0, 110.0]
    prompt = 3 * 1540 + 200 + 432 + 664 + 896 + 2 * 10
    assert out["cached_share"] == pytest.approx((3000 + 200 + 432 + 664) / prompt)
    assert out["prefill_tokens_saved"] == 3000 + 200 + 432 + 664
    assert out["agent_later_over_first"] == pytest.approx(80.0 / 400.0)
    assert out["chat_from_turn_3_p50_ms"] == 110.0  # turns 3 and 4: the upper median
    assert out["short_worst_over_fresh"] == pytest.approx(3.0)
    assert "embed" in out and out["embed"]["p50_ms"] == 50.0


def test_a_kind_absent_from_the_day_is_left_out():
    out = summary([Done("chat", 0, 0.0, 100.0, 200, 0, 0)], fresh_short_ms=5.0, minutes=1.0)
    assert "agent" not in out and "short_p50_over_fresh" not in out
    assert out["cached_share"] == 0.0
