"""One app's streams, timed as they arrive: the client process of benches/served_pace.py.

It imports nothing of UMA Serve for HTTP: httpx (or the official openai client) reads the
server-sent events, as an app would (so it repeats, on purpose, the few lines of event reading
that benches/streams.py has for the project's own benchmarks). Over the Unix socket it uses
uma.AsyncClient, the only client that speaks the socket's protocol.

    python benches/pace_client.py < job.json

stdin: one JSON line, the job: {"client": "httpx" | "openai" | "socket", "url" (HTTP) or
"socket" (path), "streams": K, "body": {...the completion request...}}; then one line "go"
when every app's process is ready (so that their streams start together). stdout: one JSON
line, a list of K streams, each {"sent": s, "times": [s, ...], "tokens": n, "events": m}:
perf_counter seconds (CLOCK_MONOTONIC on Linux, one clock for every process of the machine) of
the request and of each event that carried text, and the completion's token count from the
usage (an event may carry two tokens, a token held back arriving with the next).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def httpx_stream(client, url: str, body: dict) -> dict:
    sent = time.perf_counter()
    times: list[float] = []
    usage: dict = {}
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/completions", json=payload) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{url} answered {resp.status_code}: {await resp.aread()!r}")
        # lines end at "\n" as the event-stream format has them (aiter_lines would also split
        # at U+2028 and the like, which JSON may hold raw)
        buf = b""
        async for part in resp.aiter_bytes():
            buf += part
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                choices = chunk.get("choices")
                if choices and choices[0].get("finish_reason") is None and \
                        choices[0].get("text"):
                    times.append(time.perf_counter())
                usage = chunk.get("usage") or usage
    return {"sent": sent, "times": times, "tokens": usage.get("completion_tokens", len(times)),
            "events": len(times)}


async def openai_stream(client, body: dict) -> dict:
    sent = time.perf_counter()
    times: list[float] = []
    tokens = 0
    extra = {k: v for k, v in body.items() if k not in ("prompt", "max_tokens", "model")}
    stream = await client.completions.create(
        model=body.get("model", "default"), prompt=body["prompt"], max_tokens=body["max_tokens"],
        stream=True, stream_options={"include_usage": True}, extra_body=extra)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason is None and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return {"sent": sent, "times": times, "tokens": tokens or len(times), "events": len(times)}


async def socket_stream(client, body: dict) -> dict:
    sent = time.perf_counter()
    times: list[float] = []
    events = await client.submit(body["prompt"], max_tokens=body["max_tokens"],
                                 ignore_eos=body.get("ignore_eos", False))
    async for event in events:
        if event.token_ids:
            times.append(time.perf_counter())
    result = await events.result()
    return {"sent": sent, "times": times, "tokens": result.usage.completion_tokens,
            "events": len(times)}


async def run(job: dict) -> list[dict]:
    k, body, kind = job["streams"], job["body"], job["client"]
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=k + 1, max_keepalive_connections=k + 1)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await ready()
            return await asyncio.gather(*(httpx_stream(client, job["url"], body)
                                          for _ in range(k)))
    if kind == "openai":
        import openai

        client = openai.AsyncOpenAI(base_url=f"{job['url']}/v1", api_key="none", timeout=600,
                                    max_retries=0)
        await ready()
        return await asyncio.gather(*(openai_stream(client, body) for _ in range(k)))
    if kind == "socket":  # one connection an app, its streams multiplexed on it
        from uma.client import AsyncClient

        async with AsyncClient(job["socket"]) as client:
            await ready()
            return await asyncio.gather(*(socket_stream(client, body) for _ in range(k)))
    raise SystemExit(f"unknown client {kind!r}")


async def ready() -> None:
    """Says so on stderr, then waits for the parent's 'go'."""
    print("ready", file=sys.stderr, flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go', got {line!r}")


def main() -> None:
    job = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(run(job))), flush=True)


if __name__ == "__main__":
    main()
