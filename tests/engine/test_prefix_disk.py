"""The prefix cache's disk tier: snapshot files written, trimmed, refused when damaged or
foreign, and an engine that starts again restoring what the last one had cached."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import uma
from uma.engine.prefix_disk import MAGIC, DiskTier, state_key
from uma.engine.snapshots import Part

from ..helpers import assert_same_greedy


def some_parts(n: int = 1) -> tuple[Part, ...]:
    return (Part(0, bytes(range(256)) * n), Part(8, b"the rest"))


def written(disk: DiskTier, tokens: np.ndarray, parts=None, *, mtime: int | None = None):
    disk.write(tokens, parts or some_parts())
    disk.flush()
    path = disk.path_of(tokens)
    if mtime is not None:  # an order of age that no file system's clock can blur
        os.utime(path, ns=(mtime, mtime))
    return path


def test_a_snapshot_written_is_read_back_as_it_was(tmp_path):
    disk = DiskTier(tmp_path, "key", 1 << 20)
    tokens = np.arange(40, dtype=np.int32)
    path = written(disk, tokens)
    [saved] = disk.read(1 << 20)
    assert np.array_equal(saved.tokens, tokens) and saved.parts == some_parts()
    assert saved.path == path and path.parent == tmp_path / "key" and disk.written == 1
    written(disk, tokens)  # the same prompt again: one file
    assert len(list(disk.dir.iterdir())) == 1
    disk.close()
    disk.close()  # idempotent


def test_reading_keeps_within_the_limit_newest_first(tmp_path):
    disk = DiskTier(tmp_path, "key", 1 << 20)
    for i in range(3):
        written(disk, np.arange(i, i + 20, dtype=np.int32), mtime=(i + 1) * 10**9)
    size = os.path.getsize(disk.path_of(np.arange(0, 20, dtype=np.int32)))
    got = list(disk.read(2 * size))
    assert [int(s.tokens[0]) for s in got] == [2, 1]
    disk.close()


def test_the_folder_stays_within_its_budget_dropping_the_oldest(tmp_path):
    one = DiskTier(tmp_path, "probe", 1 << 20)
    size = os.path.getsize(written(one, np.arange(20, dtype=np.int32)))
    one.close()
    disk = DiskTier(tmp_path, "key", int(2.5 * size))
    paths = [written(disk, np.arange(i, i + 20, dtype=np.int32), mtime=(i + 1) * 10**9)
             for i in range(4)]
    assert [p.exists() for p in paths] == [False, False, True, True]
    # a snapshot larger than the whole budget is not written at all
    big = np.arange(100, 120, dtype=np.int32)
    written(disk, big, some_parts(20))
    assert not disk.path_of(big).exists() and paths[3].exists()
    disk.close()


def damaged(data: bytes, how: str) -> bytes:
    if how == "a flipped byte":
        return data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    if how == "truncated":
        return data[:-7]
    if how == "not a snapshot":
        return b"GGUF" + data[4:]
    assert how == "a broken header"
    return MAGIC + (5).to_bytes(4, "little") + b"{nope" + data[len(MAGIC) + 4:]


@pytest.mark.parametrize("how", ["a flipped byte", "truncated", "not a snapshot",
                                 "a broken header"])
def test_a_damaged_file_is_skipped_with_a_warning(tmp_path, caplog, how):
    disk = DiskTier(tmp_path, "key", 1 << 20)
    good = written(disk, np.arange(30, dtype=np.int32), mtime=10**9)
    bad = written(disk, np.arange(1, 31, dtype=np.int32), mtime=2 * 10**9)
    bad.write_bytes(damaged(bad.read_bytes(), how))
    with caplog.at_level(logging.WARNING, logger="uma.engine"):
        got = list(disk.read(1 << 20))
    assert [s.path for s in got] == [good] and disk.skipped == 1
    assert f"skipped {bad}" in caplog.text
    disk.close()


def test_a_file_saved_for_another_model_or_build_is_never_loaded(tmp_path, caplog):
    theirs = DiskTier(tmp_path, "theirs", 1 << 20)
    path = written(theirs, np.arange(30, dtype=np.int32))
    theirs.close()
    mine = DiskTier(tmp_path, "mine", 1 << 20)
    (mine.dir / path.name).write_bytes(path.read_bytes())  # copied into the wrong folder
    with caplog.at_level(logging.WARNING, logger="uma.engine"):
        assert list(mine.read(1 << 20)) == []
    assert "saved by another model, KV type or llama.cpp build" in caplog.text
    mine.close()


def test_the_key_tells_models_kv_types_and_builds_apart(tiny_path, tiny_moe_path):
    base = dict(model=str(tiny_path), type_k="f16", type_v="f16", flash_attn="auto",
                llama_commit="abc")
    key = state_key(**base)
    assert key == state_key(**base)
    for change in ({"model": str(tiny_moe_path)}, {"type_k": "q8_0"}, {"type_v": "q8_0"},
                   {"flash_attn": "off"}, {"llama_commit": "abd"}):
        assert state_key(**{**base, **change}) != key, change


PROMPT = "Once upon a time, in a land far away, there lived a llama. " * 6


def test_an_engine_started_again_restores_what_the_last_one_cached(tiny_path, tmp_path):
    conf = dict(n_ctx=2048, n_seq_max=2, prefix_cache_disk_mb=64,
                prefix_cache_dir=str(tmp_path))
    with uma.Engine(tiny_path, **conf) as first:
        first.generate(PROMPT, max_tokens=4, ignore_eos=True)
        assert first.snapshot()["prefix_cache_restored_bytes_total"] == 0
    assert len(list(tmp_path.rglob("*.kv"))) == 1  # its live entry, saved as it closed
    turn = PROMPT + "The llama said"
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2) as fresh:
        want = fresh.generate(turn, max_tokens=8, ignore_eos=True, logprobs=True)
    with uma.Engine(tiny_path, **conf) as again:
        got = again.generate(turn, max_tokens=8, ignore_eos=True, logprobs=True)
        seen = again.snapshot()
        n_prompt = len(again.model.tokenize(PROMPT))
    assert seen["prefix_cache_disk_loaded"] == 1 and seen["prefix_cache_disk_bytes"] > 0
    assert seen["prefix_cache_restored_bytes_total"] > 0
    assert seen["prefix_cache_reused_tokens_total"] >= n_prompt - 2
    assert_same_greedy(want.token_ids, got.token_ids, want.logprobs, got.logprobs)


def test_other_kv_types_start_cold_and_an_embedded_engine_writes_nothing(tiny_path, tmp_path):
    conf = dict(n_ctx=2048, n_seq_max=2, prefix_cache_dir=str(tmp_path))
    with uma.Engine(tiny_path, **conf) as e:  # prefix_cache_disk_mb: 0 unless asked
        e.generate(PROMPT, max_tokens=2)
    assert not list(tmp_path.rglob("*.kv"))
    with uma.Engine(tiny_path, prefix_cache_disk_mb=64, **conf) as e:
        e.generate(PROMPT, max_tokens=2)
    with uma.Engine(tiny_path, prefix_cache_disk_mb=64, type_k="q8_0", type_v="q8_0",
                    **conf) as other:
        other.generate(PROMPT + "More", max_tokens=2)
        assert other.snapshot()["prefix_cache_restored_bytes_total"] == 0
    assert len({p.parent for p in tmp_path.rglob("*.kv")}) == 2  # a folder per key
