"""Client side of every scenario: the prompts it sends and one streamed completion, timed
token by token. Both servers are read by the same stdlib HTTP/SSE client (http.client, one JSON
parse per event); the UMA socket by uma.Client (one msgpack frame per event)."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from uma import _core
from uma.client import Client


def long_prompt(model: Path, n_tokens: int, salt: int = 0) -> str:
    """Text that tokenises to about n_tokens with the model's own tokenizer."""
    with _core.Model(model, vocab_only=True) as vocab:
        words = [f"item{i + 7919 * salt} is filed under section {i % 97}."
                 for i in range(n_tokens)]
        lo, hi = 1, len(words)
        while lo < hi:  # the shortest prefix reaching n_tokens
            mid = (lo + hi) // 2
            if len(vocab.tokenize(" ".join(words[:mid]))) >= n_tokens:
                hi = mid
            else:
                lo = mid + 1
    return " ".join(words[:lo])


@dataclass
class Stream:
    """One request as the client saw it: when it was sent and when each token arrived
    (time.perf_counter seconds), and the server's own counts."""
    sent: float
    times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those the server reused (its prompt cache)
    label: str = ""
    server_ttft_ms: float = float("nan")  # the daemon's own (arrival to first token), socket
    text: list[str] = field(default_factory=list)  # each chunk's text (HTTP)
    token_ids: list[int] = field(default_factory=list)  # where the body asked for them
    timings: dict = field(default_factory=dict)  # the server's own, where it sends them

    @property
    def ttft_s(self) -> float:
        return self.times[0] - self.sent if self.times else float("nan")

    def gaps_ms(self) -> list[float]:
        return list(np.diff(self.times) * 1e3)


def sse_completion(port: int, body: dict, *, timeout: float = 300.0, label: str = "") -> Stream:
    """POST /v1/completions with stream=True and usage. Each chunk with finish_reason null is
    counted as a token's arrival. Nearly always one token a chunk; a token held back (half a
    character, a possible stop string) arrives with the next, so a random model's byte
    tokens give a few chunks fewer than tokens: the count of tokens is the usage's."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.connect()
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    s = Stream(time.perf_counter(), label=label)
    conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"port {port} answered {resp.status}: {resp.read()[:500]!r}")
    usage = {}
    for line in iter(resp.readline, b""):
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("choices") and chunk["choices"][0].get("finish_reason") is None:
            s.times.append(time.perf_counter())
            choice = chunk["choices"][0]
            s.text.append(choice.get("text") or "")
            # the ids: UMA's return_tokens, or llama-server's log-probability entries
            s.token_ids += choice.get("tokens") or [
                e["id"] for e in ((choice.get("logprobs") or {}).get("content") or ())]
        usage = chunk.get("usage") or usage
        s.timings = chunk.get("timings") or s.timings
    conn.close()
    s.completion_tokens = usage.get("completion_tokens", len(s.times))
    s.prompt_tokens = usage.get("prompt_tokens", 0)
    s.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return s


def socket_completion(path: str, prompt: str, *, label: str = "", **params) -> Stream:
    with Client(path) as client:
        s = Stream(time.perf_counter(), label=label)
        events = client.submit(prompt, **params)
        for event in events:
            if event.token_ids:
                s.times.append(time.perf_counter())
        result = events.result()
    usage = result.usage
    s.completion_tokens, s.prompt_tokens = usage.completion_tokens, usage.prompt_tokens
    s.server_ttft_ms = result.timings.ttft_ms
    return s


def percentiles(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "max": float("nan")}
    p50, p95, p99 = np.percentile(values_ms, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(max(values_ms))}
