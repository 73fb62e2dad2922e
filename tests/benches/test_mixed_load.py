"""The scenario matrix's bookkeeping (benches/mixed_load.py) on hand-made streams: what a phase
reports, the verdicts, the histogram quantile, the result files and the per-scenario figure,
and the parser that keeps llama-server from cutting streams."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))

import mixed_load  # noqa: E402
import plots  # noqa: E402
import report  # noqa: E402
import servers  # noqa: E402
from streams import Stream  # noqa: E402


def phase_with(streams, prompts=None, bg_alone=None, truncated=0):
    phase = mixed_load.Phase(server=None)
    phase.streams = streams
    phase.prompts = prompts or {}
    phase.bg_alone = bg_alone or {}
    phase.truncated = truncated
    phase.t0, phase.t1 = 0.0, 2.0
    return phase


def test_a_phase_reports_each_background_request_over_its_time_alone():
    stream = Stream(0.0, times=[0.010, 0.020, 0.040], label="i0")
    bg = Stream(0.5, times=[1.0, 1.1, 1.5], label="bg0")
    phase = phase_with([("interactive", stream), ("background", bg)],
                       prompts={id(bg): "long prompt"}, bg_alone={"long prompt": 250.0},
                       truncated=1)
    row = phase.summary()
    assert row["bg_completion_ms"] == [1000.0]
    assert row["bg_slowdown"] == [4.0] and row["bg_slowdown_max"] == 4.0
    assert row["worst_pause_ms"] == pytest.approx(20.0) and row["truncated"] == 1
    assert row["tokens_per_s"] == 3.0


def test_verdicts_compare_each_loaded_phase_with_its_alone_phase():
    rows = [{"side": "uma bound", "phase": "churn alone", "itl_p95_ms": 20.0,
             "worst_pause_ms": 30.0, "i_ttft_p50_ms": 40.0},
            {"side": "uma bound", "phase": "churn + background", "itl_p95_ms": 26.0,
             "worst_pause_ms": 100.0, "i_ttft_p50_ms": 50.0, "bg_ttft_ms": 900.0,
             "bg_slowdown_max": 2.5}]
    (v,) = mixed_load.verdicts(rows)
    assert v["scenario"] == "churn" and v["p95_storm_over_alone"] == pytest.approx(1.3)
    assert not v["p95_met"] and v["bg_completed"]
    assert v["bg_slowdown_max"] == 2.5 and v["bg_met"]  # churn: requests come and go, <= 3x
    assert v["worst_gap_limit_ms"] == 100.0 and v["pause_met"]  # 100 ms: 4x 20 is less


def test_the_worst_gap_may_be_four_times_a_slow_devices_p95_alone():
    rows = [{"side": "s", "phase": "alone", "itl_p95_ms": 40.0, "worst_pause_ms": 50.0,
             "i_ttft_p50_ms": 1.0},
            {"side": "s", "phase": "storm", "itl_p95_ms": 44.0, "worst_pause_ms": 161.0,
             "i_ttft_p50_ms": 1.0, "bg_ttft_ms": 1.0, "bg_slowdown_max": 10.5}]
    (v,) = mixed_load.verdicts(rows)
    assert v["worst_gap_limit_ms"] == 160.0 and not v["pause_met"]
    assert v["p95_met"] and v["bg_target"] == 10.0 and not v["bg_met"]


def test_the_histogram_quantile_interpolates_within_its_bucket():
    buckets = {5.0: 10.0, 10.0: 30.0, float("inf"): 40.0}
    assert mixed_load.bucket_quantile(buckets, 0.5) == pytest.approx(7.5)
    assert mixed_load.bucket_quantile(buckets, 0.9) == 10.0  # past the last finite bound
    assert mixed_load.bucket_quantile({}, 0.5) != mixed_load.bucket_quantile({}, 0.5)  # NaN


def test_a_result_keeps_its_timelines_compressed_beside_it_and_reads_back_whole(tmp_path):
    timelines = {"uma bound | storm": [{"class": "interactive", "label": "i0", "sent": 0.0,
                                      "times": [0.01 * i for i in range(2000)]}]}
    rows = [{"side": "uma bound", "phase": "storm", "itl_p95_ms": 12.5}]
    path = report.write("m", {"command": "x"}, rows, {"verdicts": []}, timelines,
                        out_dir=tmp_path)
    summary = json.loads(path.read_text())
    assert "timelines" not in summary and summary["timelines_file"] == "m.timelines.json.xz"
    raw = tmp_path / "m.timelines.json.xz"
    assert raw.stat().st_size < len(json.dumps(timelines)) // 2
    back = report.load(path)
    assert back["timelines"] == timelines and back["rows"] == rows and back["verdicts"] == []
    assert (tmp_path / "m.csv").read_text().splitlines()[0] == "side,phase,itl_p95_ms"


def test_a_result_without_timelines_or_with_them_inline_loads_as_written(tmp_path):
    bare = report.write("bare", {}, [{"side": "uma"}], out_dir=tmp_path)
    assert report.load(bare)["rows"] == [{"side": "uma"}]
    assert not list(tmp_path.glob("*.xz"))
    inline = tmp_path / "old.json"  # as results were written before the split
    inline.write_text(json.dumps({"rows": [], "timelines": {"a | b": []}}))
    assert report.load(inline)["timelines"] == {"a | b": []}


def test_the_scenario_figure_has_a_column_per_side(tmp_path):
    line = {"class": "interactive", "label": "i0", "sent": 0.0, "times": [0.1, 0.12, 0.2]}
    bg = {"class": "background", "label": "bg0", "sent": 0.05, "times": [0.3, 0.31]}
    path = report.write("m", {}, [], timelines={
        "uma bound | poisson + background": [line, bg],
        "llama-server | poisson + background": [line, bg],
        "uma bound | poisson alone": [line]}, out_dir=tmp_path)
    out = plots.scenario(path, "poisson + background")
    assert out == tmp_path / "m_poisson_background.png" and out.stat().st_size > 0
    assert plots.scenario(path, "chat + background") is None
    # a result already in hand is drawn without reading the files again
    (tmp_path / "m.timelines.json.xz").unlink()
    again = plots.scenario(path, "poisson + background",
                           {"timelines": {"uma bound | poisson + background": [line, bg]}})
    assert again == out and again.stat().st_size > 0


def test_llama_servers_parser_accepts_anything():
    # a one-epsilon PEG arena, the shape llama.cpp's common_peg_arena::from_json reads
    arena = json.loads(servers.ACCEPT_ANYTHING)
    assert arena["parsers"] == [{"type": "epsilon"}] and arena["root"] == 0
    assert arena["rules"] == {}
