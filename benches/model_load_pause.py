"""The longest pause of a stream on one model while another model loads beside it.

A stream decodes on model A (an engine of its own, as the daemon's model host keeps one per
model); one second into it model B is loaded through the daemon's own host
(uma.server.hosting), on another thread, as a request naming B would load it. Reported per
run: A's inter-token p95 while nothing loads, its worst gap while B loads, their ratio
(target: at most 2x), and B's load time (the file read through the page cache, the context
made).

    python benches/model_load_pause.py --model-a 134m --model-b small --runs 3 --out F.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_cycles import model_path  # noqa: E402
from uma import Engine  # noqa: E402
from uma.config import ServerConfig  # noqa: E402
from uma.host import ModelHost  # noqa: E402
from uma.model_dir import list_models  # noqa: E402
from uma.server.hosting import host_for  # noqa: E402

PROMPT = "The history of the printing press begins"


def run_once(a: Path, b: Path, threads: int, tokens: int, delay_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b.gguf").symlink_to(b)
        config = ServerConfig(socket=f"{tmp}/unused.sock", models_dir=tmp)
        # B by its listing name (a fetched catalogue model is listed by that name)
        name = next(m.name for m in list_models(tmp, (a,)) if m.path.resolve() == b.resolve())
        engine = Engine(a, n_ctx=1024, n_seq_max=2, n_threads=threads)
        host, _ = host_for(engine, config)  # as the daemon loads a model a request names
        try:
            return measured(host, engine, name, tokens, delay_s)
        finally:
            host.close(keep=engine)
            engine.close()


def measured(host: ModelHost, engine: Engine, name: str, tokens: int, delay_s: float) -> dict:
    engine.generate(PROMPT, max_tokens=8)  # warm
    load: dict[str, float] = {}

    def load_b() -> None:
        load["start"] = time.perf_counter()
        host.load(name).engine.wait_ready()  # type: ignore[attr-defined]
        load["end"] = time.perf_counter()

    loader = threading.Timer(delay_s, load_b)
    times: list[float] = []
    handle = engine.submit(PROMPT, max_tokens=tokens, ignore_eos=True)
    loader.start()
    for _ in handle:
        times.append(time.perf_counter())
    loader.join()
    gaps = [(t1, 1e3 * (t1 - t0)) for t0, t1 in zip(times[:-1], times[1:], strict=True)]
    during = [g for t, g in gaps if load["start"] <= t <= load["end"] + 0.05]
    before = [g for t, g in gaps if t < load["start"]]
    p95 = statistics.quantiles(before, n=20)[-1] if len(before) >= 20 else float("nan")
    worst = max(during, default=0.0)
    return {"p95_alone_ms": p95, "worst_during_load_ms": worst,
            "ratio": worst / p95 if p95 == p95 and p95 > 0 else float("nan"),
            "gaps_during_load": len(during), "load_s": load["end"] - load["start"],
            "stream_ended_after_load": times[-1] > load["end"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-a", default="134m", help="a synth preset or a GGUF path")
    ap.add_argument("--model-b", default="small", help="the model loaded meanwhile")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=400, help="the stream's length")
    ap.add_argument("--delay-s", type=float, default=1.0, help="when B's load begins")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", help="also write the runs to this JSON file")
    ns = ap.parse_args()
    a, b = model_path(ns.model_a), model_path(ns.model_b)
    runs = []
    for i in range(ns.runs):
        r = run_once(a, b, ns.threads, ns.tokens, ns.delay_s)
        runs.append(r)
        print(f"run {i + 1}: p95 alone {r['p95_alone_ms']:.1f} ms, worst gap while B loads "
              f"{r['worst_during_load_ms']:.1f} ms ({r['ratio']:.2f}x; target <= 2x), "
              f"{r['gaps_during_load']} gaps in the load, B loaded in {r['load_s']:.2f} s"
              + ("" if r["stream_ended_after_load"] else " (the stream ended first)"))
    if ns.out:
        Path(ns.out).write_text(json.dumps({"model_a": str(a), "model_b": str(b),
                                            "threads": ns.threads, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
