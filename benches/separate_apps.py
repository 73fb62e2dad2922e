"""Scenario 5: each app with its own server vs one UMA daemon serving them all.

For each N (1, 2, 4), N apps each stream --tokens tokens at once. "Separate": N llama-server
processes, one per app, each loading the model with the same threads (what each app would do
on its own) and, for N > 1, again with the threads split between them (kinder to them than any
app would be). "Daemon": one UMA Serve daemon with N slots and N clients. Reported: aggregate
decode tokens/s while every stream decodes, per-stream inter-token p95, and memory summed over
the processes: RSS (pages resident in each process, counting shared pages once per process) and
PSS (each shared page split between the processes mapping it). The weights are mmapped on CPU,
so N llama-server processes share one copy in the page cache: RSS overstates what they cost,
PSS is the honest total; each process still holds its own KV cache and compute buffers. Ratios
are against the faster of the two separate setups.

    python benches/separate_apps.py                   # 134m, 2 threads each, N = 1, 2, 4
    python benches/separate_apps.py --apps 1,2,4,8 --tokens 128
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots  # noqa: E402
import report  # noqa: E402
from decode_scaling import run_streams, summarise  # noqa: E402
from llama_tools import ensure_tools  # noqa: E402
from servers import Server, llama_server, memory_kb, uma_server  # noqa: E402
from uma import synth  # noqa: E402

# Prompt, generation and headroom of one app's context.
CTX_PER_APP = 512


def measure(servers: list[Server], n: int, tokens: int) -> dict:
    run_streams(servers, n, 8)  # warm-up: first requests allocate and fault pages in
    row = summarise(run_streams(servers, n, tokens))
    mem = [memory_kb(s.pid) for s in servers]
    row["rss_mb"] = sum(m["rss"] for m in mem) / 1024
    row["pss_mb"] = sum(m["pss"] for m in mem) / 1024
    row["processes"] = len(servers)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="threads of each server process")
    ap.add_argument("--apps", default="1,2,4")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default="separate_apps")
    ns = ap.parse_args()

    counts = [int(x) for x in ns.apps.split(",")]
    tools = ensure_tools(ns.backend)
    model = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    meta = report.run_info(model, backend=ns.backend, tokens=ns.tokens, threads=ns.threads,
                           gpu_layers=ns.gpu_layers, ctx_per_app=CTX_PER_APP)
    rows: list[dict] = []

    def daemon(n: int) -> dict:
        with uma_server(model, threads=ns.threads, ctx=n * CTX_PER_APP, parallel=n,
                        gpu_layers=ns.gpu_layers) as uma:
            return {"side": "uma daemon", **measure([uma], n, ns.tokens)}

    def separate(n: int, threads: int = ns.threads, side: str = "llama-server each") -> dict:
        with ExitStack() as stack:
            peers = [stack.enter_context(llama_server(
                tools["llama-server"], model, threads=threads, ctx=CTX_PER_APP,
                gpu_layers=ns.gpu_layers)) for _ in range(n)]
            return {"side": side, **measure(peers, n, ns.tokens)}

    def separate_split(n: int) -> dict:
        # The kindest case for separate servers: the cores shared out between them, so their
        # threads do not fight (no app does this on its own).
        return separate(n, max(1, ns.threads // n), "llama-server split")

    for k, n in enumerate(counts):
        sides = [daemon, separate] + ([separate_split] if n > 1 and ns.threads > 1 else [])
        for side in sides[k % len(sides):] + sides[:k % len(sides)]:
            rows.append({"apps": n, **side(n)})
            print(report.table(rows[-1:], COLUMNS).splitlines()[1], flush=True)
    for n in counts:
        u = next(r for r in rows if r["apps"] == n and r["side"] == "uma daemon")
        peers = [r for r in rows if r["apps"] == n and r["side"].startswith("llama-server")]
        best = max(peers, key=lambda r: r["tokens_per_s"])  # the ratio against the better one
        u["tokens_vs_separate"] = u["tokens_per_s"] / best["tokens_per_s"]
        u["pss_vs_separate"] = u["pss_mb"] / best["pss_mb"]
    path = report.publish(ns.out, meta, rows, COLUMNS)
    png = plots.lines(path, "apps", [("tokens_per_s", "aggregate tokens/s"),
                                     ("itl_p95_ms", "inter-token p95 (ms)"),
                                     ("pss_mb", "memory, PSS summed (MB)")],
                      by="side", suffix="plot", xlabel="apps", log_x=True)
    print(f"wrote {path} and {png}")
    return 0


COLUMNS = [("side", "side", ""), ("apps", "apps", "d"), ("tokens_per_s", "tok/s", ".1f"),
           ("itl_p95_ms", "ITL p95", ".1f"), ("rss_mb", "RSS MB", ".0f"),
           ("pss_mb", "PSS MB", ".0f"), ("tokens_vs_separate", "tok/s ratio", ".2f"),
           ("pss_vs_separate", "PSS ratio", ".2f")]


if __name__ == "__main__":
    raise SystemExit(main())
