"""Serving overhead of one stream: UMA Serve over its Unix socket, UMA Serve over HTTP/SSE (the
OpenAI-compatible gateway of the same daemon), and llama.cpp's own llama-server.

All three serve the same model file from the same ggml build (benches/llama_tools.py) with the
same threads, one slot, the same prompt and max_tokens, greedy, ignore_eos, and no prompt cache.
Runs alternate between the sides (the order rotates every round) and the table shows medians:

* TTFT: request sent -> first token received, at the client;
* tokens/s: (tokens - 1) / (last token - first token), at the client;
* CPU per token: the server process's user+system time (/proc/<pid>/stat, all its threads) plus
  this client's own (getrusage), divided by the tokens generated.

Both HTTP sides are read by the same small stdlib client (http.client, one JSON parse per event),
the socket side by uma.Client (one msgpack frame per event).

    python benches/overhead.py --model 134m --threads 2 --max-tokens 128 --repeat 5
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_tools import ensure_tools  # noqa: E402
from uma import synth, testing  # noqa: E402
from uma.client import Client  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ("The quick brown fox jumps over the lazy dog while the slow grey cat watches from the "
          "warm windowsill and the morning light moves across the kitchen floor. ") * 4
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    side: str
    ttft_ms: float
    tokens_per_s: float
    tokens: int
    prompt_tokens: int
    server_cpu_s: float
    client_cpu_s: float

    @property
    def cpu_ms_per_token(self) -> float:
        return 1e3 * (self.server_cpu_s + self.client_cpu_s) / self.tokens


def process_cpu_s(pid: int) -> float:
    """User + system time of every thread of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


Stream = Callable[[], tuple[float, list[float], int, int]]


def measured(side: str, pid: int, stream: Stream) -> Run:
    """Runs one stream. stream() returns (when the request was sent, when each event with
    tokens arrived, tokens generated, prompt tokens), the counts as the server reports them."""
    server0, client0 = process_cpu_s(pid), own_cpu_s()
    t0, times, n, n_prompt = stream()
    client1, server1 = own_cpu_s(), process_cpu_s(pid)
    gen_s = times[-1] - times[0]
    return Run(side, 1e3 * (times[0] - t0), (n - 1) / gen_s if gen_s > 0 else float("nan"), n,
               n_prompt, server1 - server0, client1 - client0)


def socket_stream(path: str, max_tokens: int) -> Stream:
    def stream():
        with Client(path) as client:
            times = []
            t0 = time.perf_counter()
            events = client.submit(PROMPT, max_tokens=max_tokens, ignore_eos=True)
            for event in events:
                if event.token_ids:
                    times.append(time.perf_counter())
            usage = events.result().usage
        return t0, times, usage.completion_tokens, usage.prompt_tokens
    return stream


def sse_stream(host: str, port: int, max_tokens: int, extra: dict | None = None) -> Stream:
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, **(extra or {})})

    def stream():
        conn = http.client.HTTPConnection(host, port, timeout=600)
        conn.connect()
        times = []
        usage = {}
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{host}:{port} answered {resp.status}: {resp.read()[:500]!r}")
        for line in iter(resp.readline, b""):
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
            usage = chunk.get("usage") or usage
        conn.close()
        if not usage:
            raise RuntimeError(f"{host}:{port} sent no usage (stream_options.include_usage)")
        return t0, times, usage["completion_tokens"], usage["prompt_tokens"]
    return stream


@contextmanager
def llama_server(tool: Path, model: Path, threads: int, ctx: int,
                 slots: int = 1) -> Iterator[tuple[int, int]]:
    with socket.socket() as s:  # a free port; llama-server cannot report the one it picked
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(tool), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", str(slots), "-ngl", "0",
           "--no-cache-prompt", "-cram", "0", "--log-disable"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
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
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(30)


def median_row(runs: list[Run]) -> dict:
    return {
        "ttft_ms": statistics.median(r.ttft_ms for r in runs),
        "tokens_per_s": statistics.median(r.tokens_per_s for r in runs),
        "cpu_ms_per_token": statistics.median(r.cpu_ms_per_token for r in runs),
        "server_cpu_ms_per_token": statistics.median(1e3 * r.server_cpu_s / r.tokens
                                                     for r in runs),
        "client_cpu_ms_per_token": statistics.median(1e3 * r.client_cpu_s / r.tokens
                                                     for r in runs),
        "tokens": runs[0].tokens, "prompt_tokens": runs[0].prompt_tokens, "runs": len(runs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset name or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5, help="measured runs per side")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "results" / "overhead.json")
    ns = ap.parse_args()

    tools = ensure_tools("cpu")
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    load_before = os.getloadavg()
    uma_args = ("--http", "127.0.0.1:0", "--threads", str(ns.threads), "--parallel", "1",
                "--ctx", str(ns.ctx), "--max-tokens", str(ns.max_tokens))
    with testing.run_daemon(model, *uma_args, env={"UMA_THREADS_BATCH": str(ns.threads)}) as d, \
            llama_server(tools["llama-server"], model, ns.threads, ns.ctx) as (peer_pid, port):
        http_port = int(re.search(r"http://127\.0\.0\.1:(\d+)", "".join(d.stderr)).group(1))
        sides = {
            "uma socket": (d.pid, socket_stream(d.socket, ns.max_tokens)),
            "uma http/sse": (d.pid, sse_stream("127.0.0.1", http_port, ns.max_tokens)),
            "llama-server http/sse": (peer_pid, sse_stream(
                "127.0.0.1", port, ns.max_tokens, extra={"cache_prompt": False})),
        }
        for pid, stream in sides.values():  # warm-up, not recorded
            measured("warm-up", pid, stream)
        runs: dict[str, list[Run]] = {name: [] for name in sides}
        names = list(sides)
        for i in range(ns.repeat):
            for name in names[i % 3:] + names[:i % 3]:
                pid, stream = sides[name]
                runs[name].append(measured(name, pid, stream))
    rows = {name: median_row(rs) for name, rs in runs.items()}
    base = rows["llama-server http/sse"]
    print(f"\n{ns.max_tokens} tokens after a {rows['uma socket']['prompt_tokens']}-token prompt, "
          f"{ns.threads} threads, {model.name}, medians of {ns.repeat} alternating runs\n")
    print(f"{'side':24s} {'TTFT ms':>9s} {'tok/s':>8s} {'CPU ms/tok':>11s} "
          f"{'(server':>8s} {'client)':>8s} {'TTFT vs peer':>13s} {'CPU vs peer':>12s}")
    for name, r in rows.items():
        print(f"{name:24s} {r['ttft_ms']:9.2f} {r['tokens_per_s']:8.1f} "
              f"{r['cpu_ms_per_token']:11.3f} {r['server_cpu_ms_per_token']:8.3f} "
              f"{r['client_cpu_ms_per_token']:8.3f} "
              f"{100 * (r['ttft_ms'] / base['ttft_ms'] - 1):+12.1f}% "
              f"{100 * (r['cpu_ms_per_token'] / base['cpu_ms_per_token'] - 1):+11.1f}%")
    report = {
        "model": str(model), "threads": ns.threads, "max_tokens": ns.max_tokens,
        "repeat": ns.repeat, "ctx": ns.ctx, "machine": platform.machine(),
        "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "medians": rows, "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()},
    }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
