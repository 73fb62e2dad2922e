"""The scenario matrix's workloads beyond mixed_load.py's own (1: continuous streams and a long
background prompt; 5: an agent chain). Each builds a Phase (mixed_load.Phase): threads that
each play a role, released together, against one server; `storms` are the background prompts
(none: the interactive side alone, the reference the loaded phase is compared with).

2. churn: short interactive requests that come and go (think time between), and a long
   background prompt arriving after --arrive-s;
3. burst: --burst interactive requests arriving together while the background prompts run
   (time to first token);
4. poisson: background prompts of mixed length (1/4, 1/2 and all of --storm-tokens) arriving
   at Poisson times under continuous interactive streams;
6. chat: an interactive chat whose prompt grows each turn to --chat-ctx tokens (a conversation
   resent whole, as chat clients do), beside the background prompts.

Sleeps here are the workload's own timing (arrivals, think time), never synchronisation.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from streams import long_prompt


def background_roles(phase, ns, storms: list[str], done: threading.Event,
                     arrivals: list[float] | None = None) -> None:
    """One role per background prompt, arriving at --arrive-s (+0.25 s each) or at the given
    times; `done` is set once every one has finished (failed or not)."""
    remaining = [len(storms)]
    arrivals = arrivals or [ns.arrive_s + 0.25 * j for j in range(len(storms))]

    def background(j: int) -> None:
        time.sleep(arrivals[j])
        try:  # a scheduler may take minutes to a background first token: wait an hour
            phase.request("background", f"bg{j}", storms[j], ns.bg_tokens, timeout=3600)
        finally:
            with phase._lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

    for j in range(len(storms)):
        phase.role(background, j)
    if not storms:  # alone: the interactive side runs for --alone-s
        def clock() -> None:
            time.sleep(ns.stagger_s * (ns.streams - 1) + ns.alone_s)
            done.set()

        phase.role(clock)


def stream_roles(phase, ns, done: threading.Event, label: str, tokens: int,
                 think_s: float = 0.0) -> None:
    """K interactive streams, started --stagger-s apart, each sending requests of `tokens`
    one after another (with an exponential think time of mean think_s between them, if any)
    until `done` and at least --rounds each."""
    def stream(i: int) -> None:
        rng = random.Random(i)
        time.sleep(i * ns.stagger_s)
        n = 0
        while n < ns.rounds or not done.is_set():
            phase.request("interactive", f"{label}{i}", f"App {i}, request {n}: what does "
                          f"this do?", tokens)
            n += 1
            if think_s:
                time.sleep(rng.expovariate(1.0 / think_s))

    for i in range(ns.streams):
        phase.role(stream, i)


def churn_phase(phase, ns, storms: list[str]):
    """Scenario 2: K apps each send short requests (--churn-tokens) with an exponential think
    time (mean --think-s) between them, until the background work is done."""
    done = threading.Event()
    background_roles(phase, ns, storms, done)

    stream_roles(phase, ns, done, "c", ns.churn_tokens, think_s=ns.think_s)
    phase.run()
    return phase


def burst_phase(phase, ns, storms: list[str]):
    """Scenario 3: the background prompts start at once; --arrive-s later --burst short
    interactive requests arrive together. What counts is their time to first token."""
    done = threading.Event()
    background_roles(phase, ns, storms, done, arrivals=[0.0] * len(storms))
    if not storms:
        done.set()

    def arrival(i: int) -> None:
        time.sleep(ns.arrive_s)
        phase.request("interactive", f"b{i}", f"User {i} asks: explain this function.",
                      ns.churn_tokens)

    for i in range(ns.burst):
        phase.role(arrival, i)
    phase.run()
    return phase


def poisson_prompts(model: Path, ns) -> tuple[list[str], list[float]]:
    """Scenario 4's background prompts (lengths cycling through 1/4, 1/2 and all of
    --storm-tokens) and their Poisson arrival times (mean gap --poisson-s), seeded."""
    rng = random.Random(4)
    lengths = [max(16, ns.storm_tokens * f // 4) for f in (1, 2, 4)]
    prompts, arrivals, t = [], [], ns.arrive_s
    for j in range(ns.poisson_n):
        prompts.append(long_prompt(model, lengths[j % 3], salt=100 + j))
        arrivals.append(t)
        t += rng.expovariate(1.0 / ns.poisson_s)
    return prompts, arrivals


def poisson_phase(phase, ns, storms: list[str], arrivals: list[float]):
    """Scenario 4: continuous interactive streams while the background prompts arrive at
    Poisson times, until every one has finished."""
    done = threading.Event()
    background_roles(phase, ns, storms, done, arrivals=arrivals if storms else None)

    stream_roles(phase, ns, done, "i", ns.tokens)
    phase.run()
    return phase


def chat_phase(phase, ns, storms: list[str], model: Path):
    """Scenario 6: one chat whose whole conversation is sent each turn, growing by
    --chat-step tokens a turn up to --chat-ctx, beside the background prompts (which arrive at
    --arrive-s, as in scenario 1)."""
    done = threading.Event()
    background_roles(phase, ns, storms, done)
    # The conversation stays under chat_ctx with the turn labels and the answer on top (a
    # server whose context is chat_ctx refuses a prompt that leaves no room to answer).
    turns = max(1, (ns.chat_ctx - ns.tokens - 64 * (ns.chat_ctx // ns.chat_step)) // ns.chat_step)
    blocks = [long_prompt(model, ns.chat_step, salt=200 + t) for t in range(turns)]

    def chat() -> None:
        history = ""
        for t, block in enumerate(blocks):
            history += f"\nUser turn {t}: {block}\nAssistant:"
            phase.request("interactive", "chat", history, ns.tokens)
        if not storms:
            done.set()

    phase.role(chat)
    phase.run()
    return phase
