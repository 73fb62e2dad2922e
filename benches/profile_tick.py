"""Where a decode tick's time goes: the bare core loop against the engine, decode-only ticks.

    python benches/profile_tick.py --model 1b --streams 1,8,32 --gpu-layers 99 --threads 8

The core loop is what uma._core alone achieves: decode and sample with no Python scheduling,
sampling on the host (native greedy) or on the device (an arg-max in the graph). The engine
figures time each step of its tick (uma.engine.scheduler: schedule, build, run, update) on
decode-only ticks, with run split into the decode call, the wait for the device (a GPU decode
returns once queued), and sampling; "between" is the time from one tick's end to the next one's
start (the compute thread's loop and waits for the GIL). Medians in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

import uma
from uma import _core, synth


def core_loop(model: _core.Model, streams: int, pp: int, tg: int, threads: int,
              sample: str, kv_unified: bool, sampler_threads: int = 0
              ) -> tuple[float, float, np.ndarray]:
    """Tokens/s of decode steps over `streams` sequences, the share of them that reused the
    graph before, and a step's median ms in building the batch, the decode call, the wait for
    the device and sampling; sample: "none" (only wait for the logits, as llama-batched-bench
    does), "read" (read every logit once, on this thread), "host" (the host Sampler, on
    sampler_threads threads; 0: its default) or "device"."""
    ctx = _core.Context(model, n_ctx=streams * (pp + tg) + 64, n_batch=2048, n_ubatch=512,
                        n_seq_max=streams, n_threads=threads, kv_unified=kv_unified)
    batch = _core.Batch(2048)
    rng = np.random.default_rng(0)
    for s in range(streams):  # prompts in batches of at most n_batch tokens
        if batch.n_tokens + pp > batch.capacity:
            ctx.decode(batch)
            batch.clear()
        batch.add_sequence(rng.integers(100, 30000, pp).astype(np.int32), 0, s)
    ctx.decode(batch)
    sampler = _core.Sampler(streams, model.n_vocab, sampler_threads)
    rows = np.arange(streams, dtype=np.int32)
    if sample == "device":
        for s in range(streams):
            ctx.set_sampler(s)
    reused = ctx.graphs_reused
    steps = np.empty((tg, 4))  # per step: batch, decode call, wait for the device, sample
    t0 = time.perf_counter()
    for i in range(tg):
        t = time.perf_counter()
        batch.clear()
        batch.add_rows(rng.integers(100, 30000, streams).astype(np.int32),
                       np.full(streams, pp + i, np.int32), rows)
        t1 = time.perf_counter()
        ctx.decode(batch)
        t2 = time.perf_counter()
        ctx.synchronize()  # the GPU and the logits copy, like the peer's llama_synchronize
        t3 = time.perf_counter()
        if sample == "host":
            sampler.sample(ctx, rows, ctx.output_seqs)
        elif sample == "device":
            ctx.sampled_tokens()
        elif sample == "read":
            ctx.logits().max(axis=1)
        steps[i] = (t1 - t, t2 - t1, t3 - t2, time.perf_counter() - t3)
    dt = time.perf_counter() - t0
    reused = (ctx.graphs_reused - reused) / tg
    sampler.close()
    ctx.close()
    return streams * tg / dt, reused, 1e3 * np.median(steps, axis=0)


class TickClock:
    """Times the scheduler's steps by wrapping its methods on the instance (nothing in
    uma.engine.scheduler changes, nor costs anything when not profiled)."""

    STEPS = ("schedule", "build", "run", "update")

    def __init__(self, scheduler) -> None:
        self.ticks: list[dict[str, float]] = []
        self._cur: dict[str, float] = {}
        self._end = 0.0
        for name in self.STEPS:
            setattr(scheduler, name, self._timed(name, getattr(scheduler, name)))
        sample = scheduler._sample
        ctx = scheduler.ctx

        def timed_sample(*args, **kwargs):
            t0 = time.perf_counter()
            ctx.synchronize()  # the wait for the device, apart from sampling itself
            t1 = time.perf_counter()
            out = sample(*args, **kwargs)
            self._cur["wait"] = t1 - t0
            self._cur["sample"] = time.perf_counter() - t1
            return out

        scheduler._sample = timed_sample

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if name == "schedule":
                self._cur = {"between": t0 - self._end if self._end else float("nan")}
            out = fn(*args, **kwargs)
            t1 = time.perf_counter()
            self._cur[name] = t1 - t0
            if name == "schedule" and not out.items:
                self._end = 0.0
            if name == "update":
                self._end = t1
                self.ticks.append(self._cur)
            return out
        return timed

    def summary(self, ticks: list[dict[str, float]]) -> dict[str, float]:
        med = {k: 1e3 * statistics.median(t.get(k, 0.0) for t in ticks)
               for k in ("between", *self.STEPS, "wait", "sample")}
        med["decode_call"] = med["run"] - med["wait"] - med["sample"]
        total = [t["between"] + sum(t[k] for k in self.STEPS) for t in ticks
                 if t["between"] == t["between"]]
        med["tick"] = 1e3 * statistics.median(total)
        return med


def engine_ticks(path: Path, streams: int, pp: int, tg: int, threads: int, gpu_layers: int,
                 kv_unified: bool, device_sampling: str) -> dict:
    engine = uma.Engine(path, n_ctx=streams * (pp + tg) + 64, n_seq_max=streams, n_batch=2048,
                        n_ubatch=512, n_threads=threads, n_gpu_layers=gpu_layers,
                        kv_unified=kv_unified, device_sampling=device_sampling)
    engine.generate("warm up", max_tokens=4)
    reused = engine._scheduler.ctx.graphs_reused
    clock = TickClock(engine._scheduler)
    engine._scheduler.trace = trace = []
    rng = np.random.default_rng(1)
    handles = [engine.submit(rng.integers(100, 30000, pp).astype(np.int32), max_tokens=tg,
                             ignore_eos=True) for _ in range(streams)]
    for h in handles:
        h.result()
    reused = engine._scheduler.ctx.graphs_reused - reused
    engine.close()
    full = [i for i, t in enumerate(trace) if t[0] == 0 and t[1] == streams]
    med = clock.summary([clock.ticks[i] for i in full[1:]])
    return {"ticks": len(trace), "graphs_reused": reused, "decode_only_full": len(full), **med,
            "tok_s": streams / (med["tick"] / 1e3)}


def on_own_thread(fn, *args):
    """fn(*args) on a thread that ends with it. ggml's CPU backend runs its graphs in OpenMP
    teams, one per calling thread, and a team outlives its graph; once more threads are in
    teams than there are CPUs, libgomp's workers stop spinning between barriers, and a
    2-core CPU then decoded 45 % slower on the engine's compute thread after a core loop on
    the main thread. A thread of its own takes its team with it."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(fn(*args)))
    worker.start()
    worker.join()
    return out[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="134m")
    ap.add_argument("--streams", default="8", help="stream counts, comma-separated")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--kv-unified", action="store_true")
    ap.add_argument("--core", default="none,host,device",
                    help="the core loop's sampling, comma-separated: none, read, host, device; "
                         "host:N samples on N threads")
    ap.add_argument("--sampling", default="host,device",
                    help="where the engine samples, comma-separated: host, device")
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    for streams in (int(x) for x in ns.streams.split(",")):
        model = _core.Model(path, n_gpu_layers=ns.gpu_layers)
        args = (model, streams, ns.pp, ns.tg, ns.threads)
        for sample in ns.core.split(","):
            where, _, n = sample.partition(":")
            tok_s, reused, ms = on_own_thread(core_loop, *args, where, ns.kv_unified,
                                              int(n or 0))
            print(f"streams {streams:3d}  core loop, sampling {sample:8s}: {tok_s:9.1f} tok/s, "
                  f"graphs reused {reused:.0%}, ms batch {ms[0]:.3f} decode call {ms[1]:.3f} "
                  f"wait {ms[2]:.3f} sample {ms[3]:.3f}", flush=True)
        model.close()
        for where in ns.sampling.split(","):
            ticks = engine_ticks(path, streams, ns.pp, ns.tg, ns.threads, ns.gpu_layers,
                                 ns.kv_unified, "on" if where == "device" else "off")
            shown = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in ticks.items())
            print(f"streams {streams:3d}  engine, {where} sampling, decode-only ticks: {shown}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
