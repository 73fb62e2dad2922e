"""Two backlogged apps with different request sizes: how evenly the daemon shares its ticks
between them, against first come, first served and llama-server.

    python benches/app_share.py --model 134m --threads 2 --repeat 3
    python benches/app_share.py --model 1b --backend cuda --gpu-layers 99 --threads 8

App "long" keeps --clients requests in flight, each a --long-prompt-token prompt (new text
every time: no prefix to reuse) for --long-tokens tokens; app "short" keeps as many in flight,
each a short question for --short-tokens tokens. Together they ask for twice the 4 slots, so
both stay backlogged for --seconds. Reported per side: each app's share of the tokens it put
through the model (prompt and generated) and of the generated ones; for UMA Serve, each app's
service as its ledger counts it (`app_service_ms_total`: tick time shared out as the cost
model prices the app's rows), sampled every --sample-s, and the spread of the difference
between the two apps' service over every window of the run (max - min of S_long - S_short
after both are backlogged), set against the cost of the largest request (each app's service
per request ended). llama-server exposes no per-app service: only its token shares are
reported. Each side runs on a fresh server, --repeat times, in alternating order.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import (  # noqa: E402
    Server,
    add_fair_sides_arg,
    add_server_args,
    fair_sides,
    medians,
    run_sides,
)
from streams import long_prompt, sse_completion  # noqa: E402
from uma import synth  # noqa: E402
from uma.client import Client  # noqa: E402

SLOTS = 4
APPS = ("long", "short")


class Load:
    """Both apps' clients, each sending its next request as soon as the last ends, until
    the deadline; the tokens each app put through (prompt + generated) and generated."""

    def __init__(self, server: Server, ns: argparse.Namespace, prompts: list[str]) -> None:
        self.server, self.ns, self.prompts = server, ns, prompts
        self.lock = threading.Lock()
        self.processed = dict.fromkeys(APPS, 0)
        self.generated = dict.fromkeys(APPS, 0)
        self.requests = dict.fromkeys(APPS, 0)
        self.next_prompt = 0
        self.deadline = 0.0

    def client(self, app: str) -> None:
        while time.perf_counter() < self.deadline:
            if app == "long":
                with self.lock:
                    prompt = self.prompts[self.next_prompt % len(self.prompts)]
                    self.next_prompt += 1
                tokens = self.ns.long_tokens
            else:
                prompt, tokens = "What is a lighthouse? Say it briefly.", self.ns.short_tokens
            body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "user": app, **(self.server.extra or {})}
            s = sse_completion(self.server.port, body, label=app)
            if s.completion_tokens != tokens:
                raise RuntimeError(f"{self.server.name}: {s.completion_tokens} of {tokens}")
            with self.lock:
                self.processed[app] += s.prompt_tokens + s.completion_tokens
                self.generated[app] += s.completion_tokens
                self.requests[app] += 1

    def run(self) -> dict:
        """Runs the load; samples the UMA ledger's per-app service meanwhile. Rates count the
        requests that ended, over --seconds (the last ones end a little after)."""
        self.deadline = time.perf_counter() + self.ns.seconds
        threads = [threading.Thread(target=self.client, args=(app,))
                   for app in APPS for _ in range(self.ns.clients)]
        for th in threads:
            th.start()
        samples: list[dict[str, float]] = []
        if self.server.socket is not None:
            with Client(self.server.socket) as client:
                while any(th.is_alive() for th in threads):
                    service = client.metrics().get("app_service_ms_total", {})
                    samples.append({app: float(service.get(app, 0.0)) for app in APPS})
                    time.sleep(self.ns.sample_s)  # the sampling period, a bench parameter
                final = client.metrics()
                requests, parked = final["app_requests_total"], final["fair_parked_total"]
        for th in threads:
            th.join()
        row = {f"{app} processed share": self.processed[app] / sum(self.processed.values())
               for app in APPS}
        row |= {f"{app} generated share": self.generated[app] / sum(self.generated.values())
                for app in APPS}
        row |= {f"{app} requests": float(self.requests[app]) for app in APPS}
        row["generated tok/s"] = sum(self.generated.values()) / self.ns.seconds
        row["processed tok/s"] = sum(self.processed.values()) / self.ns.seconds
        if samples:
            row |= service_spread(samples, requests, self.ns.warmup_s / self.ns.sample_s)
            row["parked"] = float(parked)
        return row


def service_spread(samples: list[dict[str, float]], requests: dict, skip: float) -> dict:
    """From the ledger's samples: each app's share of the service, and the largest
    difference in service the two apps received over any window (once both are backlogged)
    against the largest request's cost (each app's service per request ended)."""
    steady = samples[int(skip):]
    diff = [s["long"] - s["short"] for s in steady]
    last = samples[-1]
    cost = {app: last[app] / max(1, requests.get(app, 0)) for app in APPS}
    largest = max(cost.values())
    return {"long service share": last["long"] / max(1e-9, last["long"] + last["short"]),
            "service spread ms": max(diff) - min(diff),
            "long request ms": cost["long"], "short request ms": cost["short"],
            "spread / largest request": (max(diff) - min(diff)) / max(largest, 1e-9)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--clients", type=int, default=4, help="requests in flight per app")
    ap.add_argument("--long-prompt-tokens", type=int, default=384)
    ap.add_argument("--long-tokens", type=int, default=32)
    ap.add_argument("--short-tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=40.0, help="how long both apps send")
    ap.add_argument("--warmup-s", type=float, default=3.0,
                    help="samples left out of the spread while both apps fill the slots")
    ap.add_argument("--sample-s", type=float, default=0.25)
    ap.add_argument("--quantum-ms", type=float, default=None, help="UMA's fair_quantum_ms")
    add_fair_sides_arg(ap)
    ap.add_argument("--repeat", type=int, default=1, help="runs a side, alternating order")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    path = Path(ns.model) if Path(ns.model).exists() else synth.cached_model(ns.model)
    prompts = [long_prompt(path, ns.long_prompt_tokens, salt=k) for k in range(64)]
    quantum = {} if ns.quantum_ms is None else {"UMA_FAIR_QUANTUM_MS": str(ns.quantum_ms)}
    runs = run_sides(fair_sides(ns, path, SLOTS, quantum), ns.repeat,
                     lambda server: Load(server, ns, prompts).run())
    report: dict = {"model": str(path), "threads": ns.threads, "args": vars(ns) | {
        "model": str(ns.model), "out": str(ns.out)}, "runs": runs}
    for name, med in medians(runs).items():
        report[f"{name} median"] = med
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
