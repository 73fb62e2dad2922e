"""The prefix cache across a restart: a shared system prompt and a chat's next turn, before
and after the server restarts, UMA Serve (its disk tier on) against llama-server (its prompt
cache on), through the same HTTP/SSE client and token-id prompts.

    python benches/prefix_restart.py --model 134m --threads 2 --repeat 3

Each run, on each side: a fresh server answers --apps requests that share a 1,500-token system
prompt (each with its own 40-token question) and a chat of --turns turns (200 new user tokens a
turn, a fixed 32-token reply added to the history); the server stops gracefully and starts
again; then --apps more requests with the same system prompt and the chat's next turn. TTFT of
each. UMA's snapshots go to a fresh folder each run (nothing from an earlier run is read).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefix_reuse import QUESTION, REPLY, SYSTEM, USER, ask, tokens  # noqa: E402
from servers import (  # noqa: E402
    add_server_args,
    alternating,
    llama_server,
    model_and_server,
    uma_server,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--apps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="runs a side, alternating order")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    path, tool = model_and_server(ns)
    ctx = 4 * (SYSTEM + QUESTION + (ns.turns + 1) * (USER + REPLY) + 256)
    common = {"threads": ns.threads, "ctx": ctx, "parallel": 4, "gpu_layers": ns.gpu_layers}
    rows: dict[str, list[dict]] = {"uma": [], "llama-server": []}
    for r, name in alternating(list(rows), ns.repeat):
        with tempfile.TemporaryDirectory() as folder:
            env = {"UMA_PREFIX_CACHE_DISK_MB": "4096", "UMA_PREFIX_CACHE_DIR": folder}

            def server(name=name, env=env):
                if name == "uma":
                    return uma_server(path, env=env, **common)
                return llama_server(tool, path, prompt_cache=True, args=("-kvu",), **common)

            rng = np.random.default_rng(3000 + r)
            system = tokens(rng, SYSTEM)
            questions = [tokens(rng, QUESTION) for _ in range(2 * ns.apps)]
            users = [tokens(rng, USER) for _ in range(ns.turns + 1)]
            reply = tokens(rng, REPLY)
            history: list[int] = []
            row: dict[str, list[float]] = {"system_before": [], "chat_before": []}
            with server() as s:
                ask(s, tokens(np.random.default_rng(99), 16), 4)  # warm-up
                for q in questions[:ns.apps]:
                    row["system_before"].append(ask(s, system + q, 8))
                for t in range(ns.turns):
                    row["chat_before"].append(ask(s, history + users[t], 8))
                    history += users[t] + reply
            with server() as s:  # the same server, started again
                ask(s, tokens(np.random.default_rng(98), 16), 4)
                row["system_after"] = [ask(s, system + q, 8) for q in questions[ns.apps:]]
                row["chat_after"] = [ask(s, history + users[ns.turns], 8)]
        rows[name].append(row)
        print(f"run {r} {name:13s} " + "; ".join(
            f"{k} {', '.join(f'{v:.0f}' for v in vals)}" for k, vals in row.items()), flush=True)
    report = {"model": str(path), "threads": ns.threads, "runs": rows}
    for name, runs in rows.items():
        first_after = [run["system_after"][0] for run in runs]
        later_before = [statistics.median(run["system_before"][1:]) for run in runs]
        chat_after = [run["chat_after"][0] for run in runs]
        print(f"{name:13s} system prompt after the restart, first app: {_ms(first_after)} "
              f"(later apps before it: {_ms(later_before)}); chat turn after it: "
              f"{_ms(chat_after)}", flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values) + " ms"


if __name__ == "__main__":
    sys.exit(main())
