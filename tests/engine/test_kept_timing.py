"""The device's timing kept across starts (uma.engine.calibration.KeptTiming), on the real core
with the tiny synthetic model: the first start times the device and keeps it, the next with the
same model and settings reads it back and runs no scratch decode, other settings time again,
and a damaged file is timed over."""

from __future__ import annotations

from uma import Engine
from uma.config import EngineConfig


def started(path, folder, n_ctx: int = 512) -> Engine:
    config = EngineConfig(model=str(path), n_ctx=n_ctx, n_seq_max=2, n_threads=1)
    return Engine.from_config(config, timing_dir=folder)


def test_a_second_start_reads_the_kept_timing_and_times_nothing(tiny_path, tmp_path):
    with started(tiny_path, tmp_path) as first:
        first.wait_ready()
        done, planned = first.calibration
        assert planned > 0 and done == planned
        timing = first._scheduler.timing
        assert timing.ticks and timing.change_ms is not None
    assert len(list(tmp_path.glob("*.json"))) == 1
    with started(tiny_path, tmp_path) as second:
        second.wait_ready()
        assert second.calibration == (0, 0)  # no scratch decode
        assert second._scheduler.timing == timing  # floats come back exactly
        assert len(second.generate("Hello", max_tokens=4, ignore_eos=True).token_ids) == 4


def test_other_settings_time_again_and_a_damaged_file_is_timed_over(tiny_path, tmp_path):
    with started(tiny_path, tmp_path) as e:
        e.wait_ready()
    with started(tiny_path, tmp_path, n_ctx=1024) as other:
        other.wait_ready()
        assert other.calibration[1] > 0
    kept = sorted(tmp_path.glob("*.json"))
    assert len(kept) == 2
    for path in kept:
        path.write_text("{not json")
    with started(tiny_path, tmp_path) as again:
        again.wait_ready()
        assert again.calibration[1] > 0
    with started(tiny_path, tmp_path) as last:
        last.wait_ready()
        assert last.calibration == (0, 0)
