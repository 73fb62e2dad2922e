"""RPC workers as the engine starts: each is given a few seconds to listen before it is
registered, because workers started beside the daemon (a script's `uma rpc-worker &` lines,
service units started together) race it, and llama.cpp's registration fails at once on a
port nobody listens on yet."""

from __future__ import annotations

import socket
import time

# how long a worker may take to listen before the start fails naming it
WAIT_S = 5.0
_RETRY_S = 0.1  # between attempts: a refused connection comes back at once


def wait_until_listening(endpoint: str, wait_s: float = WAIT_S) -> bool:
    """Whether the worker at endpoint ('host:port') accepts a TCP connection within wait_s.
    The probe connects and closes: a worker drops a client that says nothing and goes on
    accepting."""
    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(1.0, wait_s)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_RETRY_S)
