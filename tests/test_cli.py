"""The `uma` command line, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from uma import testing


def uma(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uma", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def daemon(tiny_path):
    with testing.run_daemon(tiny_path) as d:
        yield d


def test_generate_streams_to_stdout(daemon):
    r = uma("generate", "-p", "Hello", "--max-tokens", "5", "--socket", daemon.socket)
    assert r.returncode == 0 and r.stdout.strip() and r.stderr == ""


def test_generate_exit_codes(daemon, tmp_path):
    r = uma("generate", "-p", "x", "--max-tokens", "100000", "--socket", daemon.socket)
    assert r.returncode == 2 and "E_LIMIT_002" in r.stderr
    r = uma("generate", "-p", "x", "--temp", "-1", "--socket", daemon.socket)
    assert r.returncode == 2 and "temperature" in r.stderr
    r = uma("generate", "-p", "x", "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 5 and "uma run" in r.stderr


def test_generate_finds_the_socket_in_the_environment(daemon):
    r = uma("generate", "-p", "Hi", "--max-tokens", "3", "--no-stream",
            env={"UMA_SOCKET": daemon.socket})
    assert r.returncode == 0 and r.stdout.strip()


def test_metrics_as_json_and_table(daemon):
    r = uma("metrics", "--json", "--socket", daemon.socket)
    assert r.returncode == 0 and '"tokens_generated_total"' in r.stdout
    r = uma("metrics", "--socket", daemon.socket)
    assert r.returncode == 0 and "ticks_total" in r.stdout


def test_run_rejects_bad_settings(tmp_path, tiny_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('ctx = 4096\nparalel = 8\n')
    r = uma("run", str(tiny_path), "--config", str(conf))
    assert r.returncode == 4 and "paralel" in r.stderr
    r = uma("run", str(tiny_path), "--parallel", "0", "--socket", testing.short_socket_path())
    assert r.returncode == 4 and "invalid --parallel: must be in [1, 2**31), not 0" in r.stderr
    r = uma("run", str(tmp_path / "missing.gguf"), "--socket", testing.short_socket_path())
    assert r.returncode == 1 and "not found" in r.stderr
    r = uma("run", str(tiny_path), env={"UMA_CTX": "lots"},)
    assert r.returncode == 4 and "invalid UMA_CTX: must be an integer, not 'lots'" in r.stderr


def test_model_synth_and_info(tmp_path):
    out = tmp_path / "m.gguf"
    r = uma("model", "synth", "tiny", "-o", str(out), "--seed", "3")
    assert r.returncode == 0 and out.exists()
    r = uma("model", "info", str(out))
    assert r.returncode == 0 and '"n_layer": 2' in r.stdout
    r = uma("model", "synth", "huge")
    assert r.returncode != 0 and "unknown preset" in r.stderr
