"""A model split over two llama.cpp RPC workers on this machine (docs/guide/scaling-out.md):
UMA Serve against llama-server with the same workers and split, and each against a local run.

    python benches/rpc_split.py --model 134m --repeat 3

Two `uma rpc-worker` processes on loopback (one thread each) hold all the layers, half each
(`--rpc A,B --tensor-split 1,1`, every layer offloaded); the local sides hold them in process.
One stream, greedy, --tokens tokens after a short prompt, over HTTP/SSE, a fresh server a
run, the sides alternating. Reported: decode tokens/s (first token to last) and the time to
first token. Expect the workers to cost what moving each token's activations twice over
loopback and waiting on two processes costs; on one machine the workers also share its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_tools import ensure_tools  # noqa: E402
from servers import Server, add_server_args, llama_server, medians, run_sides, uma_server  # noqa: E402
from streams import sse_completion  # noqa: E402
from uma import synth  # noqa: E402

PROMPT = "Once upon a time, in a land far away, there lived a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def workers(n: int, threads: int) -> Iterator[list[str]]:
    """n `uma rpc-worker` processes on loopback, once each accepts connections."""
    procs, endpoints = [], []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "uma", "rpc-worker", "--port", str(port), "--threads",
                 str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            endpoints.append(f"127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while True:  # another process: polled, bounded
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the RPC worker on port {port} did not start")
                time.sleep(0.05)
        yield endpoints
    finally:
        for p in procs:
            p.kill()
            p.wait()


def measure(tokens: int):
    def run(server: Server) -> dict[str, float]:
        s = sse_completion(server.port, {"prompt": PROMPT, "max_tokens": tokens,
                                         "temperature": 0, "ignore_eos": True,
                                         **(server.extra or {})})
        if s.completion_tokens != tokens:
            raise RuntimeError(f"{server.name}: {s.completion_tokens} of {tokens} tokens")
        return {"decode_tok_s": (len(s.times) - 1) / (s.times[-1] - s.times[0]),
                "ttft_ms": s.ttft_s * 1e3}
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker-threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    tool = ensure_tools(ns.backend)["llama-server"]
    with workers(2, ns.worker_threads) as (one, two):
        split = ("--rpc", f"{one},{two}")
        common = {"threads": ns.threads, "ctx": 2048}
        sides = {
            "uma, local": lambda: uma_server(model, parallel=1, **common),
            "uma, 2 workers": lambda: uma_server(model, parallel=1, gpu_layers=99, **common,
                                                 args=(*split, "--tensor-split", "1,1")),
            "llama-server, local": lambda: llama_server(tool, model, **common),
            "llama-server, 2 workers": lambda: llama_server(tool, model, gpu_layers=99,
                                                            **common,
                                                            args=(*split, "-ts", "1,1")),
        }
        runs = run_sides(sides, ns.repeat, measure(ns.tokens))
    med = medians(runs)
    ratio = med["uma, 2 workers"]["decode_tok_s"] / med["llama-server, 2 workers"]["decode_tok_s"]
    print(f"uma / llama-server, both split over 2 workers, decode tokens/s: {ratio:.3f}")
    if ns.out:
        ns.out.write_text(json.dumps({"model": str(model), "args": {
            k: str(v) for k, v in vars(ns).items()}, "runs": runs, "medians": med,
            "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
