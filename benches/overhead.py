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
import json
import os
import platform
import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_tools import ensure_tools  # noqa: E402
from servers import llama_server, process_cpu_s, uma_server  # noqa: E402
from streams import Stream, socket_completion, sse_completion  # noqa: E402
from uma import synth  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ("The quick brown fox jumps over the lazy dog while the slow grey cat watches from the "
          "warm windowsill and the morning light moves across the kitchen floor. ") * 4


@dataclass
class Run:
    side: str
    ttft_ms: float
    tokens_per_s: float
    tokens: int
    prompt_tokens: int
    server_cpu_s: float
    client_cpu_s: float
    server_ttft_ms: float = float("nan")  # the daemon's own, where the path reports it

    @property
    def cpu_ms_per_token(self) -> float:
        return 1e3 * (self.server_cpu_s + self.client_cpu_s) / self.tokens


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measured(side: str, pid: int, stream: Callable[[], Stream]) -> Run:
    """Runs one stream (benches/streams.py), with the server's and this client's CPU time."""
    server0, client0 = process_cpu_s(pid), own_cpu_s()
    s = stream()
    client1, server1 = own_cpu_s(), process_cpu_s(pid)
    gen_s = s.times[-1] - s.times[0]
    n = s.completion_tokens
    return Run(side, 1e3 * s.ttft_s, (n - 1) / gen_s if gen_s > 0 else float("nan"), n,
               s.prompt_tokens, server1 - server0, client1 - client0, s.server_ttft_ms)


def median_row(runs: list[Run]) -> dict:
    return {
        "ttft_ms": statistics.median(r.ttft_ms for r in runs),
        "server_ttft_ms": statistics.median(r.server_ttft_ms for r in runs),
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
    ap.add_argument("--backend", default="cpu", help="which llama-server build to compare")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "results" / "overhead.json")
    ns = ap.parse_args()

    tools = ensure_tools(ns.backend)
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    load_before = os.getloadavg()
    common = {"threads": ns.threads, "ctx": ns.ctx, "parallel": 1, "gpu_layers": ns.gpu_layers}
    with uma_server(model, args=("--max-tokens", str(ns.max_tokens)), **common) as d, \
            llama_server(tools["llama-server"], model, **common) as peer:
        http_port, port, peer_pid = d.port, peer.port, peer.pid
        body = {"prompt": PROMPT, "max_tokens": ns.max_tokens, "temperature": 0,
                "ignore_eos": True}
        sides = {
            "uma socket": (d.pid, lambda: socket_completion(
                d.socket, PROMPT, max_tokens=ns.max_tokens, ignore_eos=True)),
            "uma http/sse": (d.pid, lambda: sse_completion(http_port, body)),
            "llama-server http/sse": (peer_pid, lambda: sse_completion(
                port, {**body, **peer.extra})),
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
    inside = rows["uma socket"]["server_ttft_ms"]
    print(f"uma socket: {inside:.2f} ms of its TTFT inside the daemon (arrival to first token "
          f"sampled), {rows['uma socket']['ttft_ms'] - inside:.2f} ms in transport and client")
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
