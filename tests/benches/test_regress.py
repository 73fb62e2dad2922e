"""The CI performance gate (benches/regress.py) on hand-made pytest-benchmark reports."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

import regress  # noqa: E402


def report(**medians):
    return {"benchmarks": [{"name": k, "stats": {"min": v}} for k, v in medians.items()]}


def run(tmp_path, current, baseline, *extra):
    (tmp_path / "r.json").write_text(json.dumps(current))
    (tmp_path / "b.json").write_text(json.dumps(baseline))
    return regress.main([str(tmp_path / "r.json"), "--baseline", str(tmp_path / "b.json"),
                         *extra])


def test_times_are_judged_relative_to_the_same_runs_reference():
    rel = regress.relative_medians(report(test_reference_calibration=2.0, test_a=1.0))
    assert rel == {"test_a": 0.5}


def test_a_machine_twice_as_slow_everywhere_passes(tmp_path):
    slow = report(test_reference_calibration=2.0, test_a=2.0, test_b=8.0)
    assert run(tmp_path, slow, {"test_a": 1.0, "test_b": 4.0}) == 0


def test_one_hot_path_twice_as_slow_fails(tmp_path, capsys):
    now = report(test_reference_calibration=1.0, test_a=1.0, test_b=8.0)
    assert run(tmp_path, now, {"test_a": 1.0, "test_b": 4.0}) == 1
    assert "test_b" in capsys.readouterr().err


def test_new_benchmarks_are_reported_not_failed_and_update_records_them(tmp_path):
    now = report(test_reference_calibration=1.0, test_new=3.0)
    assert run(tmp_path, now, {}) == 0
    assert run(tmp_path, now, {}, "--update") == 0
    assert json.loads((tmp_path / "b.json").read_text()) == {"test_new": 3.0}


def test_a_report_without_the_reference_is_refused():
    with pytest.raises(SystemExit, match="test_reference_calibration"):
        regress.relative_medians(report(test_a=1.0))


def test_a_suite_wide_shift_is_the_machine_and_one_path_beyond_it_fails(tmp_path, capsys):
    # A processor whose reference runs fast reads every path 1.6x slower: that passes, and a
    # path 2x beyond that shift still fails.
    base = {"test_a": 1.0, "test_b": 1.0, "test_c": 1.0, "test_d": 1.0}
    shifted = report(test_reference_calibration=1.0, test_a=1.6, test_b=1.6, test_c=1.7,
                     test_d=2.1)
    assert run(tmp_path, shifted, base) == 0
    beyond = report(test_reference_calibration=1.0, test_a=1.6, test_b=1.6, test_c=1.7,
                    test_d=3.4)
    assert run(tmp_path, beyond, base) == 1
    assert "test_d" in capsys.readouterr().err


def test_a_faster_machine_does_not_make_the_gate_stricter():
    assert regress.machine_shift({"a": 0.5, "b": 0.6, "c": 0.7}) == 1.0
    assert regress.machine_shift({}) == 1.0
