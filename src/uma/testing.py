"""Helpers that tests, benchmarks and users share: a daemon in a subprocess, on a temporary
socket, started from a (synthetic) model and stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from uma import fake_core, synth

__all__ = ["DaemonProcess", "fake_core", "run_daemon", "short_socket_path", "synth"]


def short_socket_path() -> str:
    """A socket path in a fresh directory under /tmp: Unix socket paths must stay under ~100
    bytes, which pytest's tmp_path often is not. The directory is left for the OS to clean."""
    return os.path.join(tempfile.mkdtemp(prefix="uma-", dir="/tmp"), "uma.sock")


@dataclass
class DaemonProcess:
    proc: subprocess.Popen
    socket: str
    stderr: list[str] = field(default_factory=list)  # lines so far (a reader thread appends)
    ready_line: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def http_url(self) -> str | None:
        """The HTTP gateway's base URL, as the ready line gives it (with --http)."""
        match = re.search(r" and (http://\S+) ", self.ready_line)
        return match.group(1) if match else None

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code (SIGKILL if it does not exit within timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@contextlib.contextmanager
def run_daemon(model: str | os.PathLike | None = None, *args: str, socket: str | None = None,
               ready_timeout: float = 120.0, env: dict[str, str] | None = None
               ) -> Iterator[DaemonProcess]:
    """Starts `uma run MODEL --socket SOCKET ARGS...` and yields once it prints its ready line;
    stops it on exit. Without a socket path, one in a fresh directory under /tmp is used
    (Unix socket paths must stay short)."""
    tmpdir = None
    if socket is None:
        socket = short_socket_path()
        tmpdir = os.path.dirname(socket)
    cmd = [sys.executable, "-m", "uma", "run"]
    if model is not None:
        cmd.append(os.fspath(model))
    cmd += ["--socket", socket, *args]
    # a daemon started for a test keeps no prompts across restarts unless env asks: one test's
    # saved prompts would be read back by the next daemon on the same model
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, "UMA_PREFIX_CACHE_DISK_MB": "0", **(env or {})})
    daemon = DaemonProcess(proc, socket)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stderr:
            daemon.stderr.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"uma run not ready after {ready_timeout} s: "
                                   f"{''.join(daemon.stderr)[-2000:]}") from None
            if line is None:
                raise RuntimeError(f"uma run exited with {proc.wait()}: "
                                   f"{''.join(daemon.stderr)[-2000:]}")
            if line.startswith("uma: serving"):
                daemon.ready_line = line
                break
        yield daemon
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.terminate()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
