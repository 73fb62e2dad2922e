"""Models loaded and unloaded on a live daemon: resident memory across load/unload cycles, the
cost of switching between two loaded models, and a model's cold start against llama-server's.

Three measurements, each on a daemon of its own (`uma run A` with model B in its model
directory, talking over the Unix socket as `uma load` does):

  cycles   B loaded (`load`), 8 tokens generated on it, unloaded, N times; the daemon's RSS
           after each unload and each load. Target: the last cycle's within 5 % of the
           first's.
  switch   with A and B loaded, short requests one after another: A only, then A and B in
           turn. Target: A's time to first token the same in both (switching is free).
  cold     the time from starting the process to serving B: `uma run B` (to its `uma:
           serving` line; also when its `timing the device` line came, which is the load done)
           against `llama-server -m B` (to its /health answering 200), the sides alternated;
           and `uma load B` on the live daemon. Target: UMA's load no slower than
           llama-server's start. The file is read once first, so both read it through the page
           cache (a cold disk is the same for both).

    python benches/model_cycles.py --model-a smollm2 --model-b gemma3-270m --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import llama_server, memory_kb  # noqa: E402
from uma import catalog, synth, testing  # noqa: E402
from uma.client import Client  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def model_path(name: str) -> Path:
    """A GGUF path as given, a catalogue model by its name (fetched on first use), else a
    synthetic preset (written on first use)."""
    if name.endswith(".gguf"):
        return Path(name)
    if name in catalog.CATALOG:
        return Path(catalog.resolve(name))
    return Path(synth.cached_model(name))


def rss_bytes(pid: int) -> int:
    return memory_kb(pid)["rss"] * 1024


def daemon(a: Path, b: Path, threads: int, folder: Path):
    """`uma run A` with B in its model directory (named "b"), no catalogue models listed."""
    models = folder / "models"
    models.mkdir(exist_ok=True)
    link = models / "b.gguf"
    if not link.exists():
        link.symlink_to(b)
    return testing.run_daemon(a, "--models-dir", str(models), "--threads", str(threads),
                              "--ctx", "2048", "--parallel", "2", "--max-loaded", "2",
                              env={"UMA_CACHE_DIR": str(folder / "cache"),
                                   "UMA_THREADS_BATCH": str(threads)})


def cycles(a: Path, b: Path, threads: int, n: int, folder: Path) -> dict:
    with daemon(a, b, threads, folder) as d, Client(d.socket) as c:
        c.generate("Hello", max_tokens=4)
        start = rss_bytes(d.pid)
        rows = []
        for i in range(n):
            m = c.load("b")
            loaded = rss_bytes(d.pid)
            c.generate("The capital of France is", model="b", max_tokens=8)
            c.unload("b")
            rows.append({"cycle": i + 1, "load_ms": m["load_ms"], "rss_loaded": loaded,
                         "rss_unloaded": rss_bytes(d.pid)})
            print(f"  cycle {i + 1:2d}: load {m['load_ms']:7.1f} ms, RSS loaded "
                  f"{loaded / 1e6:6.1f} MB, unloaded {rows[-1]['rss_unloaded'] / 1e6:6.1f} MB",
                  flush=True)
    first, last = rows[0]["rss_unloaded"], rows[-1]["rss_unloaded"]
    return {"rss_before": start, "rows": rows, "growth": last / first - 1.0}


def first_token_ms(c: Client, model: str | None) -> float:
    began = time.perf_counter()
    stream = c.submit("Write one sentence about the sea.", max_tokens=4, model=model)
    next(iter(stream))
    ms = (time.perf_counter() - began) * 1e3
    stream.result()
    return ms


def switch(a: Path, b: Path, threads: int, n: int, folder: Path) -> dict:
    with daemon(a, b, threads, folder) as d, Client(d.socket) as c:
        c.load("b", keep_alive=-1)
        for model in (None, "b"):  # warm both
            first_token_ms(c, model)
        alone = [first_token_ms(c, None) for _ in range(n)]
        turns = [(first_token_ms(c, None), first_token_ms(c, "b")) for _ in range(n)]
    in_turn = [x for x, _ in turns]
    return {"a_alone_ms": alone, "a_in_turn_ms": in_turn, "b_in_turn_ms": [y for _, y in turns],
            "ratio": statistics.median(in_turn) / statistics.median(alone)}


def uma_start(b: Path, threads: int, folder: Path) -> dict:
    """Seconds from starting `uma run B` to its load done and to serving."""
    env = {**os.environ, "UMA_CACHE_DIR": str(folder / "cache"), "UMA_PREFIX_CACHE_DISK_MB": "0"}
    sock = testing.short_socket_path()
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "uma", "run", str(b), "--socket", sock,
                             "--threads", str(threads), "--ctx", "2048", "--parallel", "2"],
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
    seen: dict[str, float] = {}
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            now = time.perf_counter() - began
            if line.startswith("uma: timing the device"):
                seen["loaded_s"] = now
            if line.startswith("uma: serving"):
                seen["ready_s"] = now
                break
    finally:
        proc.terminate()
        proc.wait(60)
        os.rmdir(os.path.dirname(sock))
    return seen


def llama_start(tool: Path, b: Path, threads: int) -> dict:
    began = time.perf_counter()
    with llama_server(tool, b, threads=threads, ctx=2048, parallel=2):
        return {"ready_s": time.perf_counter() - began}


def cold(a: Path, b: Path, threads: int, repeat: int, folder: Path, tool: Path | None) -> dict:
    b.read_bytes()  # in the page cache for both sides
    out: dict[str, list] = {"uma_run": [], "llama_server": [], "uma_load_ms": []}
    for i in range(repeat):
        sides = ["uma_run", "llama_server"] if i % 2 == 0 else ["llama_server", "uma_run"]
        for side in sides:
            if side == "uma_run":
                out[side].append(uma_start(b, threads, folder))
            elif tool is not None:
                out[side].append(llama_start(tool, b, threads))
            print(f"  {side}: {out[side][-1] if out[side] else 'no llama-server'}", flush=True)
    with daemon(a, b, threads, folder) as d, Client(d.socket) as c:
        for _ in range(repeat):
            out["uma_load_ms"].append(c.load("b")["load_ms"])
            c.unload("b")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-a", default="smollm2", help="a catalogue name, synth preset or path")
    ap.add_argument("--model-b", default="gemma3-270m", help="the model loaded and unloaded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side of the cold start")
    ap.add_argument("--switches", type=int, default=15)
    ap.add_argument("--only", default="cycles,switch,cold")
    ap.add_argument("--no-llama", action="store_true", help="skip llama-server")
    ap.add_argument("--out", help="write the results to this JSON file")
    ns = ap.parse_args()
    a, b = model_path(ns.model_a), model_path(ns.model_b)
    tool = None
    if not ns.no_llama and "cold" in ns.only:
        from llama_tools import ensure_tools

        tool = ensure_tools("cpu")["llama-server"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    result: dict = {"info": {"model_a": str(a), "model_b": str(b), "threads": ns.threads,
                             "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                             "date": time.strftime("%Y-%m-%d"), "commit": commit,
                             "command": " ".join(sys.argv)}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "cycles" in ns.only:
            print("cycles:")
            r = result["cycles"] = cycles(a, b, ns.threads, ns.cycles, folder)
            print(f"  RSS after the last unload {100 * r['growth']:+.1f} % against the first "
                  f"(target within 5 %)")
        if "switch" in ns.only:
            r = result["switch"] = switch(a, b, ns.threads, ns.switches, folder)
            print(f"switch: A's first token {statistics.median(r['a_alone_ms']):.1f} ms alone, "
                  f"{statistics.median(r['a_in_turn_ms']):.1f} ms in turn with B "
                  f"({r['ratio']:.2f}x; target 1x); B's {statistics.median(r['b_in_turn_ms']):.1f}"
                  f" ms")
        if "cold" in ns.only:
            print("cold start:")
            r = result["cold"] = cold(a, b, ns.threads, ns.repeat, folder, tool)
            print(f"  uma load on a live daemon: {r['uma_load_ms']} ms")
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
