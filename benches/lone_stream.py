"""One stream alone for about a minute: its inter-token gaps, longest against typical, on each
path (in process, over the Unix socket, over HTTP/SSE), and what the longest coincide with.

    python benches/lone_stream.py --model 1b --gpu-layers 99 --threads 8 --seconds 60 \
        --backend cuda --paths engine,socket,http,llama-server

The target (issue "GPU speed end to end"): the longest gap of a lone stream over 60 s at most
3x its median. In process, Python's garbage collections are recorded (gc.callbacks) and the
five longest gaps list any collection that overlapped them; on the served paths the gaps are
the client's, so they include the transport. Each long gap names the stream's KV position
modulo 256: llama.cpp sizes attention to the cache in steps of 256 positions, and the device
may rebuild its work there. llama-server (same build, same model) is the reference.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uma  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import llama_server, uma_server  # noqa: E402
from streams import socket_completion, sse_completion  # noqa: E402
from uma import synth  # noqa: E402
from uma.client import Client  # noqa: E402

PROMPT = "Tell a long story about a lighthouse keeper."


class GcLog:
    """Start and end (perf_counter seconds) and generation of every collection."""

    def __init__(self) -> None:
        self.events: list[tuple[float, float, int]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.events.append((self._start, time.perf_counter(), info["generation"]))


def gaps_report(times: list[float], gcs: list[tuple[float, float, int]] | None,
                prompt_tokens: int = 0) -> dict:
    t = np.asarray(times)
    gaps = np.diff(t) * 1e3
    p50 = float(np.median(gaps))
    top = np.argsort(gaps)[::-1][:5]
    longest = []
    for i in sorted(top.tolist(), key=lambda i: -gaps[i]):
        row = {"token": i + 1, "ms": round(float(gaps[i]), 2),
               "kv_mod_256": (prompt_tokens + i + 1) % 256}
        if gcs is not None:
            row["gc"] = [f"gen{g} {1e3 * (e - s):.1f} ms" for s, e, g in gcs
                         if s < t[i + 1] and e > t[i]]
        longest.append(row)
    return {"tokens": len(times), "seconds": round(float(t[-1] - t[0]), 1),
            "p50_ms": round(p50, 3), "p99_ms": round(float(np.percentile(gaps, 99)), 3),
            "max_ms": round(float(gaps.max()), 2), "max_over_p50": round(gaps.max() / p50, 2),
            "longest": longest}


def in_process(path: Path, ns: argparse.Namespace, tokens: int) -> dict:
    with uma.Engine(path, n_ctx=tokens + 256, n_seq_max=1, n_threads=ns.threads,
                    n_gpu_layers=ns.gpu_layers) as engine:
        engine.generate("warm up", max_tokens=8)
        log = GcLog()
        gc.callbacks.append(log)
        try:
            handle = engine.submit(PROMPT, max_tokens=tokens, ignore_eos=True)
            times = []
            for event in handle:
                if event.token_ids:
                    times.append(time.perf_counter())
            result = handle.result()
        finally:
            gc.callbacks.remove(log)
    return gaps_report(times, log.events, result.usage.prompt_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--paths", default="engine,socket,http",
                    help="any of engine, socket, http, llama-server")
    ap.add_argument("--backend", default="cpu", help="which llama-server build")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    with uma.Engine(path, n_ctx=512, n_seq_max=1, n_threads=ns.threads,
                    n_gpu_layers=ns.gpu_layers) as engine:  # the rate, for ~seconds of tokens
        engine.generate("warm up", max_tokens=8)
        rate = engine.generate(PROMPT, max_tokens=256, ignore_eos=True).tokens_per_second
    tokens = int(rate * ns.seconds)
    report: dict = {"model": str(path), "tokens": tokens, "rate_estimate": round(rate, 1)}
    paths = ns.paths.split(",")
    if "engine" in paths:
        report["engine"] = in_process(path, ns, tokens)
        print("engine", json.dumps(report["engine"]), flush=True)
    if {"socket", "http"} & set(paths):
        with uma_server(path, threads=ns.threads, ctx=tokens + 256, parallel=1,
                        gpu_layers=ns.gpu_layers,
                        args=("--max-tokens", str(tokens))) as server:
            body = {"prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True}
            if "socket" in paths:
                s = socket_completion(server.socket, PROMPT, max_tokens=tokens, ignore_eos=True)
                report["socket"] = gaps_report(s.times, None, s.prompt_tokens)
                # the daemon's own inter-token gaps (sampled to sampled): a long gap seen by
                # the client but not here was the transport's
                with Client(server.socket) as client:
                    itl = client.metrics()["inter_token_ms_interactive"]
                report["socket"]["daemon_itl"] = {k: itl[k] for k in ("p50", "p99", "max")
                                                  if k in itl}
                print("socket", json.dumps(report["socket"]), flush=True)
            if "http" in paths:
                s = sse_completion(server.port, {**body, "temperature": 0}, timeout=600)
                report["http"] = gaps_report(s.times, None, s.prompt_tokens)
                print("http", json.dumps(report["http"]), flush=True)
    if "llama-server" in paths:
        tool = ensure_tools(ns.backend)["llama-server"]
        with llama_server(tool, path, threads=ns.threads, ctx=tokens + 256,
                          gpu_layers=ns.gpu_layers) as peer:
            s = sse_completion(peer.port, {"prompt": PROMPT, "max_tokens": tokens,
                                           "ignore_eos": True, "temperature": 0,
                                           **(peer.extra or {})}, timeout=600)
            report["llama-server"] = gaps_report(s.times, None, s.prompt_tokens)
            print("llama-server", json.dumps(report["llama-server"]), flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
