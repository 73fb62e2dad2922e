"""Served decode at the engine's pace: what apps read over HTTP and the Unix socket, against
uma.Engine in process, llama.cpp's llama-batched-bench and llama-server, side by side.

Each stream count gets every side in turn, the order reversed every other run. The served
sides are read by client processes that import nothing of UMA Serve for HTTP
(benches/pace_client.py: httpx, or the official openai client with --client openai), one
process per app (--apps, the streams shared among them), all started together. Every side
decodes the same short prompts (distinct, so nothing is reused) to --tg tokens with end of
generation ignored; tokens/s is counted over the window in which every stream is decoding
(from the last first token to the first last token), from the tokens' arrival times at the
client (the engine's own token times in process; llama-batched-bench's own figure).

    python benches/served_pace.py --model 134m --threads 2 --streams 1,8 --repeat 3
    python benches/served_pace.py --model 1b --backend cuda --gpu-layers 99 --threads 8 \\
        --streams 1,8,32 --repeat 3 --tg 512

A lone stream's longest gap against its p50 is reported at one stream (the issue's 3x bound).
The daemon's CPU seconds per served token tell where a served token's host time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
from decode_throughput import model_path, peer_speeds  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import Server, alternating, llama_server, process_cpu_s, uma_server  # noqa: E402

CLIENT = Path(__file__).resolve().parent / "pace_client.py"


def prompts(n: int) -> list[str]:
    return [f"App note {i}: the weather report for district {i * 7 % 97} says" for i in range(n)]


def window(streams: list[dict]) -> dict:
    """tokens/s over the window in which every stream decodes; an event's share of tokens is
    its stream's tokens over its events (nearly always one)."""
    firsts = [s["times"][0] for s in streams if s["times"]]
    lasts = [s["times"][-1] for s in streams if s["times"]]
    if len(firsts) < len(streams):
        return {"tps": float("nan")}
    lo, hi = max(firsts), min(lasts)
    n = 0.0
    for s in streams:
        per_event = s["tokens"] / max(1, s["events"])
        n += per_event * sum(1 for t in s["times"] if lo < t <= hi)
    gaps = np.diff(streams[0]["times"]) * 1e3 if len(streams[0]["times"]) > 2 else [np.nan]
    return {"tps": n / (hi - lo) if hi > lo else float("nan"),
            "gap_p50_ms": float(np.percentile(gaps, 50)), "gap_max_ms": float(np.max(gaps)),
            "tokens": int(sum(s["tokens"] for s in streams)),
            "events": int(sum(s["events"] for s in streams))}


def served(job: dict, n: int, apps: int) -> list[dict]:
    """n streams over `apps` client processes, started together."""
    shares = [n // apps + (1 if i < n % apps else 0) for i in range(min(apps, n))]
    texts = iter(prompts(n))
    procs = []
    for k in shares:
        p = subprocess.Popen([sys.executable, str(CLIENT)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        # each process gets its own prompts: the job's body names one, the client repeats
        # it, so the apps' texts differ by app and the streams' by their position in it
        body = {**job["body"], "prompt": next(texts)}
        for _ in range(k - 1):
            next(texts)
        p.stdin.write(json.dumps({**job, "streams": k, "body": body}) + "\n")
        p.stdin.flush()
    for p in procs:  # each says "ready" once its connections are set up
        line = p.stderr.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"client failed: {line}{p.stderr.read()[-2000:]}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"client failed ({p.returncode}): {stderr[-2000:]}")
        out.extend(json.loads(stdout))
    return out


def engine_side(engine, n: int, tg: int) -> dict:
    handles = [engine.submit(p, max_tokens=tg, ignore_eos=True) for p in prompts(n)]
    results = [h.result(timeout=3600) for h in handles]
    streams = [{"times": [t / 1e3 for t in r.timings.token_ms], "tokens": len(r.timings.token_ms),
                "events": len(r.timings.token_ms)} for r in results]
    return window(streams)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset, catalogue name or GGUF")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tg", type=int, default=256, help="tokens each stream generates")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--apps", type=int, default=4, help="client processes (at most one a stream)")
    ap.add_argument("--client", default="httpx", choices=("httpx", "openai"),
                    help="what reads the HTTP sides")
    ap.add_argument("--sides", default="engine,uma-http,uma-socket,llama-server,batched-bench")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ns = ap.parse_args()

    import uma
    from uma.server import settings

    tools = ensure_tools(ns.backend)
    model = model_path(ns.model)
    sides = ns.sides.split(",")
    rows = []
    for n in (int(x) for x in ns.streams.split(",")):
        ctx = max(4096, n * (64 + ns.tg) + 256)
        body = {"max_tokens": ns.tg, "ignore_eos": True, "temperature": 0}
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        with ExitStack() as stack, tempfile.TemporaryDirectory() as timing:
            # the in-process engine gets exactly the daemon's settings from the same flags
            conf = settings.resolve([{"model": str(model), "threads": ns.threads,
                                      "threads_batch": ns.threads, "parallel": n, "ctx": ctx,
                                      "gpu_layers": ns.gpu_layers}])
            engine = (stack.enter_context(uma.Engine.from_config(conf.engine, timing_dir=timing))
                      if "engine" in sides else None)
            if engine is not None:
                engine.generate("warm up", max_tokens=4)
            uma_srv: Server | None = None
            if {"uma-http", "uma-socket"} & set(sides):
                uma_srv = stack.enter_context(uma_server(
                    model, threads=ns.threads, ctx=ctx, parallel=n, gpu_layers=ns.gpu_layers))
            peer: Server | None = None
            if "llama-server" in sides:
                peer = stack.enter_context(llama_server(
                    tools["llama-server"], model, threads=ns.threads, ctx=ctx, parallel=n,
                    gpu_layers=ns.gpu_layers, args=("--kv-unified",)))
            for srv in (uma_srv, peer):  # one warm-up request each
                if srv is not None:
                    served({"client": ns.client, "url": f"http://127.0.0.1:{srv.port}",
                            "body": {**body, "max_tokens": 8, **(srv.extra or {})}}, 1, 1)
            for run, side in alternating(sides, ns.repeat):
                cpu0 = None
                if side == "engine":
                    row = engine_side(engine, n, ns.tg)
                elif side == "batched-bench":
                    _, tg = peer_speeds(tools["llama-batched-bench"], model, 32, ns.tg, n,
                                        ns.threads, ns.gpu_layers, True, "f16")
                    row = {"tps": tg}
                else:
                    srv = uma_srv if side.startswith("uma") else peer
                    job = {"client": "socket" if side == "uma-socket" else ns.client,
                           "url": f"http://127.0.0.1:{srv.port}", "socket": srv.socket,
                           "body": {**body, **(srv.extra or {})}}
                    cpu0 = process_cpu_s(srv.pid)
                    t0 = time.perf_counter()
                    streams = served(job, n, ns.apps)
                    wall = time.perf_counter() - t0
                    row = window(streams)
                    row["server_cpu_per_token_ms"] = (
                        1e3 * (process_cpu_s(srv.pid) - cpu0) / max(1, row["tokens"]))
                    row["wall_s"] = wall
                runs[side].append(row)
                print(f"streams {n:3d} run {run} {side:14s} " + "  ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in row.items()), flush=True)
        summary = {"streams": n}
        for side, rs in runs.items():
            tps = [r["tps"] for r in rs]
            summary[side] = {"tps": tps, "median": statistics.median(tps)}
            if n == 1 and "gap_max_ms" in rs[0]:
                summary[side]["gap_max_over_p50"] = [r["gap_max_ms"] / r["gap_p50_ms"]
                                                     for r in rs]
        if "engine" in runs:
            base = summary["engine"]["median"]
            for side in sides:
                summary[side]["over_engine"] = [t / base for t in summary[side]["tps"]]
        rows.append(summary)
        print(json.dumps(summary), flush=True)

    if ns.out:
        info = report.run_info(model, backend=ns.backend, threads=ns.threads,
                               client=ns.client, apps=ns.apps, tg=ns.tg)
        ns.out.write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
