"""Prefix reuse: a multi-turn chat and a shared system prompt, UMA Serve against llama-server
with its default prompt cache, through the same HTTP/SSE client and token-id prompts (so both
servers do the same work).

    python benches/prefix_reuse.py --model 134m --threads 2
    python benches/prefix_reuse.py --model 1b --backend cuda --gpu-layers 99 --threads 8

chat: --conversations conversations at once, --turns turns each; a turn sends the history, 200
new user tokens, and asks for 32 tokens; the history then grows by the user tokens and a fixed
32-token reply (not the server's: as a chat UI re-tokenising text, the cache can match the
history up to the last prompt). TTFT by turn, median over the conversations.
system: --apps requests one after the other, each a 1,500-token system prompt and its own
40-token question. TTFT of each. Both servers get 4 slots and one KV buffer for all of them;
the sides run one after the other, each on a fresh server, --repeat times in alternating order.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import (  # noqa: E402
    Server,
    add_server_args,
    alternating,
    llama_server,
    model_and_server,
    uma_server,
)
from streams import sse_completion  # noqa: E402

USER, REPLY = 200, 32
SYSTEM, QUESTION = 1500, 40


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1000, 20000, n).tolist()


def ask(server: Server, prompt: list[int], max_tokens: int) -> float:
    """One streamed completion; its TTFT in ms."""
    s = sse_completion(server.port, {"prompt": prompt, "max_tokens": max_tokens,
                                     "temperature": 0, "ignore_eos": True,
                                     **(server.extra or {})})
    if s.completion_tokens != max_tokens:
        raise RuntimeError(f"{server.name}: {s.completion_tokens} of {max_tokens} tokens")
    return 1e3 * s.ttft_s


def chat(server: Server, conversations: int, turns: int, seed: int) -> list[float]:
    ttft = [[0.0] * turns for _ in range(conversations)]

    def one(c: int) -> None:
        rng = np.random.default_rng(seed + c)
        history: list[int] = []
        for t in range(turns):
            user = tokens(rng, USER)
            ttft[c][t] = ask(server, history + user, REPLY)
            history += user + tokens(rng, REPLY)

    threads = [threading.Thread(target=one, args=(c,)) for c in range(conversations)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [statistics.median(ttft[c][t] for c in range(conversations)) for t in range(turns)]


def system_prompt(server: Server, apps: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    system = tokens(rng, SYSTEM)
    return [ask(server, system + tokens(rng, QUESTION), 8) for _ in range(apps)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap)
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--apps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1, help="runs a side, alternating order")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    path, tool = model_and_server(ns)
    ctx = 4 * (ns.turns * (USER + REPLY) + 256)
    common = {"threads": ns.threads, "ctx": ctx, "parallel": 4, "gpu_layers": ns.gpu_layers}
    report: dict = {"model": str(path), "ctx": ctx, "threads": ns.threads}
    sides = {
        "uma": lambda: uma_server(path, **common),
        "llama-server": lambda: llama_server(tool, path, prompt_cache=True,
                                             args=("-kvu",), **common),
    }
    runs: dict[str, dict[str, list[list[float]]]] = {
        name: {"chat_ttft_ms": [], "system_ttft_ms": []} for name in sides}
    for r, name in alternating(list(sides), ns.repeat):
        with sides[name]() as server:
            ask(server, tokens(np.random.default_rng(99), 16), 4)  # warm-up
            # seeds far apart: one generator's draws must not reappear in another's prompt
            runs[name]["chat_ttft_ms"].append(chat(server, ns.conversations, ns.turns,
                                                   seed=1000 + r))
            runs[name]["system_ttft_ms"].append(system_prompt(server, ns.apps, seed=2000 + r))
        for key, label in (("chat_ttft_ms", "chat TTFT by turn"),
                           ("system_ttft_ms", "system prompt TTFT")):
            print(f"run {r} {name:13s} {label}: "
                  + ", ".join(f"{v:.0f}" for v in runs[name][key][-1]), flush=True)
    for name, row in runs.items():
        report[name] = {**row, **{f"{key}_median": [statistics.median(col) for col in
                                                     zip(*row[key], strict=True)]
                                  for key in ("chat_ttft_ms", "system_ttft_ms")}}
        late = [statistics.median(run[2:]) for run in row["chat_ttft_ms"]]
        report[name]["chat_from_turn_3_median_ms"] = late
        print(f"{name:13s} median of runs, chat by turn: "
              + ", ".join(f"{v:.0f}" for v in report[name]["chat_ttft_ms_median"])
              + f"; from turn 3 on, each run: {', '.join(f'{v:.0f}' for v in late)}; "
              + "system: " + ", ".join(f"{v:.0f}" for v in report[name]["system_ttft_ms_median"]),
              flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
