"""Scenario 2: decode scaling, UMA Serve vs llama-server, with the memory-bandwidth roofline.

For each stream count (1, 2, 4, 8, 16, 32) both servers get that many concurrent requests
(short prompt, --tokens each, greedy, ignore_eos) through the same HTTP/SSE client; the sides
alternate order every step. Reported: aggregate decode tokens/s over the window in which every
stream is decoding, per-stream inter-token p50/p95, and the roofline: the bytes a decode tick
must move (weights once, each stream's KV, activations: uma.sched.bmt) divided by the tick time,
as a fraction of the machine's measured bandwidth (CPU: large copies; GPU: a device copy with
CuPy where it is installed, else not reported).

    python benches/decode_scaling.py                              # 134m, 2 threads
    python benches/decode_scaling.py --model 1b --backend cuda --gpu-layers 99 --threads 8
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402
import report  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import Server, llama_server, uma_server  # noqa: E402
from streams import Stream, percentiles, sse_completion  # noqa: E402
from uma import _core, synth  # noqa: E402
from uma.sched.bmt import BmtModel, probe_bandwidth_gbps  # noqa: E402


def device_bandwidth_gbps(gpu: bool) -> float | None:
    """Read + write bandwidth of the memory the model lives in."""
    if not gpu:
        return probe_bandwidth_gbps()
    try:
        import cupy as cp
    except ImportError:
        return None
    src = cp.ones(1 << 28, dtype=cp.float32)  # 1 GiB
    dst = cp.empty_like(src)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(5):
        start.record()
        cp.copyto(dst, src)
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * src.nbytes / best / 1e9


def run_streams(servers: list[Server], n: int, tokens: int) -> list[Stream]:
    """n concurrent streams released together, stream i sent to servers[i % len(servers)]."""
    out: list[Stream] = []
    lock = threading.Lock()
    go = threading.Barrier(n)

    def one(i: int) -> None:
        server = servers[i % len(servers)]
        go.wait()
        s = sse_completion(server.port, {
            "prompt": f"Stream {i}: list the planets of the solar system.", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, **(server.extra or {})})
        with lock:
            out.append(s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summarise(streams: list[Stream]) -> dict:
    if not all(s.times for s in streams):
        empty = sum(1 for s in streams if not s.times)
        raise RuntimeError(f"{empty} of {len(streams)} streams got no tokens")
    lo = max(s.times[0] for s in streams)  # every stream is decoding from here ...
    hi = min(s.times[-1] for s in streams)  # ... to here
    in_window = sum(sum(1 for t in s.times if lo < t <= hi) for s in streams)
    itl = percentiles([g for s in streams for g in s.gaps_ms()])
    return {"tokens_per_s": in_window / (hi - lo) if hi > lo else float("nan"),
            "itl_p50_ms": itl["p50"], "itl_p95_ms": itl["p95"],
            "ttft_p50_ms": float(np.median([1e3 * s.ttft_s for s in streams]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8,16,32")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--kv-unified", action="store_true",
                    help="one KV buffer for all sequences on both sides (default: one per "
                         "sequence, llama-server's own default with --parallel)")
    ap.add_argument("--out", default="decode_scaling")
    ns = ap.parse_args()

    counts = [int(x) for x in ns.streams.split(",")]
    tools = ensure_tools(ns.backend)
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    with _core.Model(model, vocab_only=True) as vocab:
        prompt_tokens = len(vocab.tokenize("Stream 10: list the planets of the solar system."))
    with _core.Model(model, n_gpu_layers=0) as m:
        bmt = BmtModel.of(m)
    gbps = device_bandwidth_gbps(ns.gpu_layers != 0)
    top = max(counts)
    common = {"threads": ns.threads, "parallel": top, "gpu_layers": ns.gpu_layers,
              "ctx": top * (prompt_tokens + ns.tokens + 256)}
    meta = report.run_info(model, backend=ns.backend, tokens=ns.tokens, bandwidth_gbps=gbps,
                           kv_unified=ns.kv_unified,
                           **common)
    rows: list[dict] = []
    kv_uma = ("--kv-unified",) if ns.kv_unified else ("--no-kv-unified",)
    with uma_server(model, args=kv_uma, **common) as uma, \
            llama_server(tools["llama-server"], model, args=("-kvu",) if ns.kv_unified else (),
                         **common) as peer:
        sides = [uma, peer]
        for server in sides:  # warm-up
            run_streams([server], 2, 8)
        for k, n in enumerate(counts):
            for server in sides[k % 2:] + sides[:k % 2]:
                row = {"side": server.name.split()[0] if server.socket else server.name,
                       "streams": n}
                try:
                    row.update(summarise(run_streams([server], n, ns.tokens)))
                except RuntimeError as exc:  # reported in the table, not hidden
                    row["failed"] = str(exc)
                    rows.append(row)
                    print(f"{row['side']} {n} streams failed: {exc}", flush=True)
                    continue
                # decode tick: n tokens, each stream's KV at about half the generation
                tick_s = n / row["tokens_per_s"]
                kv = n * (prompt_tokens + ns.tokens // 2)
                row["bytes_per_tick"] = bmt.tick_bytes(n, kv)
                row["achieved_gbps"] = row["bytes_per_tick"] / tick_s / 1e9
                if gbps:
                    row["roofline_fraction"] = row["achieved_gbps"] / gbps
                rows.append(row)
                print(report.table(rows[-1:], COLUMNS).splitlines()[1], flush=True)
    report.add_ratios(rows, ("streams",))
    path = report.publish(ns.out, meta, rows, COLUMNS)
    png = plots.lines(path, "streams", [("tokens_per_s", "aggregate tokens/s"),
                                        ("itl_p95_ms", "inter-token p95 (ms)"),
                                        ("achieved_gbps", "bytes moved (GB/s)")],
                      by="side", suffix="plot", xlabel="concurrent streams", log_x=True)
    print(f"bandwidth {gbps and round(gbps, 1)} GB/s; wrote {path} and {png}")
    return 0


COLUMNS = [("side", "side", ""), ("streams", "streams", "d"), ("tokens_per_s", "tok/s", ".1f"),
           ("itl_p50_ms", "ITL p50", ".1f"), ("itl_p95_ms", "ITL p95", ".1f"),
           ("achieved_gbps", "GB/s", ".1f"), ("roofline_fraction", "of peak", ".2f"),
           ("vs_llama_server", "vs peer", ".2f")]


if __name__ == "__main__":
    raise SystemExit(main())
