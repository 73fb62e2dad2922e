"""The two servers every scenario compares, started the same way: UMA Serve (`uma run`, its
Unix socket plus the OpenAI-compatible HTTP gateway) and llama.cpp's own llama-server built from
the same third_party/llama.cpp (benches/llama_tools.py). Same model file, threads, context,
slots and GPU offload on both sides."""

from __future__ import annotations

import argparse
import http.client
import os
import re
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from uma import testing

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Server:
    name: str
    pid: int
    port: int  # HTTP (OpenAI-compatible)
    socket: str | None = None  # UMA's Unix socket; None for llama-server
    extra: dict | None = None  # request fields this server needs (llama-server: no prompt cache)


def process_cpu_s(pid: int) -> float:
    """User + system time of every thread of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def memory_kb(pid: int) -> dict[str, int]:
    """RSS and PSS of a process (kB), from /proc/<pid>/smaps_rollup. PSS splits each shared
    page (the mmapped weights) between the processes mapping it."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower()] = int(rest.split()[0])
    return out


@contextmanager
def uma_server(model: Path, *, threads: int, ctx: int, parallel: int, policy: str = "bound",
               gpu_layers: int = 0, args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> Iterator[Server]:
    """`uma run` with these flags, and `env` for settings that have no flag (UMA_<NAME>)."""
    cmd = ("--http", "127.0.0.1:0", "--threads", str(threads), "--parallel", str(parallel),
           "--ctx", str(ctx), "--policy", policy, "--gpu-layers", str(gpu_layers), *args)
    # run_daemon starts it with no prompts kept across restarts: every run starts cold, as
    # llama-server does (a benchmark of restarts asks for them in env)
    with testing.run_daemon(model, *cmd,
                            env={"UMA_THREADS_BATCH": str(threads), **(env or {})}) as d:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", "".join(d.stderr)).group(1))
        yield Server(f"uma {policy}", d.pid, port, socket=d.socket)


# llama-server parses every streamed completion's text as a chat message, /v1/completions
# too, and at this commit a text with malformed UTF-8 (a random model's byte tokens) fails the
# content-only parser: the server throws "The model produced output that does not match the
# expected Content-only format" and ends the stream early. A parser that accepts anything (one
# epsilon) leaves the parse nothing to fail; /v1/completions streams the raw text regardless.
ACCEPT_ANYTHING = '{"parsers":[{"type":"epsilon"}],"rules":{},"root":0}'


@contextmanager
def llama_server(tool: Path, model: Path, *, threads: int, ctx: int, parallel: int = 1,
                 gpu_layers: int = 0, args: tuple[str, ...] = (),
                 prompt_cache: bool = False) -> Iterator[Server]:
    """llama-server splits ctx between its `parallel` slots; prompt caching is off so both
    sides compute every prompt, unless prompt_cache (its default settings: each slot reuses
    the prompt it last held, plus its RAM cache)."""
    with socket.socket() as s:  # a free port; llama-server cannot report the one it picked
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(tool), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", str(parallel),
           "-ngl", str(gpu_layers), "--log-disable", *args]
    if not prompt_cache:
        cmd += ["--no-cache-prompt", "-cram", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:  # no ready line to wait for: poll /health, bounded
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {' '.join(cmd)}")
            time.sleep(0.2)
        yield Server("llama-server", proc.pid, port, extra={
            "cache_prompt": prompt_cache, "chat_parser": ACCEPT_ANYTHING})
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def add_server_args(ap: argparse.ArgumentParser) -> None:
    """The options every side-by-side benchmark takes: the model, the llama.cpp build and
    where the model runs."""
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--backend", default="cpu", help="which llama.cpp tools build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)


def model_and_server(ns: argparse.Namespace) -> tuple[Path, Path]:
    """The model add_server_args named (a GGUF path, else a synth preset, written on first
    use) and the llama-server of its backend's build."""
    from llama_tools import ensure_tools
    from uma import synth

    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    return path, ensure_tools(ns.backend)["llama-server"]


def alternating(names: list[str], repeat: int) -> Iterator[tuple[int, str]]:
    """(run, side) pairs: every side once a run, the order reversed every other run, so that
    no side always runs first on a machine that warms up or slows down."""
    for r in range(repeat):
        for name in (names if r % 2 == 0 else names[::-1]):
            yield r, name


def run_sides(sides: dict[str, Callable[[], AbstractContextManager[Server]]], repeat: int,
              measure: Callable[[Server], dict[str, float]]) -> dict[str, list[dict]]:
    """measure(server) on a fresh server of each side, `repeat` times in alternating order;
    each run's row printed as it ends. Returns the rows by side."""
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for r, name in alternating(list(sides), repeat):
        with sides[name]() as server:
            runs[name].append(measure(server))
        print(f"run {r} {name:20s} " + _row(runs[name][-1]), flush=True)
    return runs


def medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each side's median of every figure over its runs (printed too)."""
    out = {}
    for name, rows in runs.items():
        out[name] = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        print(f"{name:20s} median: " + _row(out[name]), flush=True)
    return out


def _row(row: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in row.items())


FAIR_SIDES = ("uma", "uma, fair share off", "llama-server")


def add_fair_sides_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sides", nargs="+", default=list(FAIR_SIDES), choices=FAIR_SIDES,
                    help="which of the sides to run")


def fair_sides(ns: argparse.Namespace, model: Path, slots: int,
               uma_env: dict[str, str] | None = None
               ) -> dict[str, Callable[[], AbstractContextManager[Server]]]:
    """The fair-share benchmarks' sides that ns.sides names: UMA Serve (with uma_env's
    settings), UMA without fair share, and llama-server with one KV buffer, each with `slots`
    slots."""
    common = {"threads": ns.threads, "ctx": slots * 1024, "parallel": slots,
              "gpu_layers": ns.gpu_layers}
    sides: dict[str, Callable[[], AbstractContextManager[Server]]] = {
        "uma": lambda: uma_server(model, env=uma_env, **common),
        "uma, fair share off": lambda: uma_server(model, args=("--no-fair-share",), **common),
    }
    if "llama-server" in ns.sides:
        from llama_tools import ensure_tools

        tool = ensure_tools(ns.backend)["llama-server"]
        sides["llama-server"] = lambda: llama_server(tool, model, args=("-kvu",), **common)
    return {name: side for name, side in sides.items() if name in ns.sides}
