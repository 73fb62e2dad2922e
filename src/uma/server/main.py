"""`uma run`: the daemon's life from checked settings to exit.

The order is what makes the ready line true: the socket (and the HTTP port) are bound first, so
a second daemon or a taken port fails in a moment rather than after a minute of loading; then
the model loads and the engine times the device, each with progress on stderr; only then is
`uma: serving ...` printed (and systemd told READY=1), and the first request is answered at
warm speed. SIGINT and SIGTERM are honoured at every step: while loading (the load is
cancelled), while timing (the decode in flight is aborted) and while serving (in-flight
requests get the grace period).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from uma import _core, heap
from uma.config import cache_root
from uma.errors import UmaError
from uma.server.settings import Settings

log = logging.getLogger("uma.main")

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
               "error": logging.ERROR, "none": logging.CRITICAL}


DAEMON_SWITCH_INTERVAL_S = 0.0005


def serve(conf: Settings, say=None) -> int:
    """Runs the daemon until a signal; returns the exit code (0 after a clean stop, also when
    stopped before it was ready; 1 when it could not start). say(text) writes a line to the
    user (stderr)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from uma.engine import Engine
    from uma.server.daemon import Daemon, bind_socket

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    heap.limit_arenas()  # models come and go for the daemon's life (uma.heap)
    # The compute thread takes the interpreter back after every llama.cpp call; while the
    # HTTP, socket and output threads write tokens, it waits up to the switch interval for it
    # (5 ms by default, longer than a GPU's whole tick). A shorter interval bounds what the
    # other threads' bursts add to a tick (docs/results/served-pace.md).
    sys.setswitchinterval(DAEMON_SWITCH_INTERVAL_S)
    logging.basicConfig(level=_LOG_LEVELS[conf.log_level],
                        format="uma: %(levelname)s %(name)s: %(message)s")
    _core.set_log_level(conf.log_level if conf.log_level != "warn" else "error")
    stopping = threading.Event()
    engine = None

    def on_signal(*_) -> None:
        stopping.set()
        if engine is not None:
            _core.set_log_level("none")  # llama.cpp logs the aborted decode as an error
            engine.ctx.abort()  # a calibration decode in flight ends now
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    # 1. The doors, before anything slow: a taken socket or port fails at once.
    try:
        listener = bind_socket(conf.server.socket)
    except (UmaError, OSError) as exc:
        say(f"uma: {_sentence(exc)}")
        return 1
    http_sock = None
    if conf.server.http:
        from uma.server.http import bind_http

        try:
            http_sock = bind_http(conf.server.http)
        except OSError as exc:
            _close_listener(listener, conf.server.socket)
            say(f"uma: cannot serve HTTP on {conf.server.http}: {exc.strerror or exc}")
            return 1

    # The scorecard's CSV file too: a path that cannot be written fails here, not after the load.
    scorecards = None
    if conf.server.scorecard_interval_s:
        from uma.server.scorecard_log import ScorecardLog

        try:
            scorecards = ScorecardLog(conf.server.scorecard_interval_s, conf.server.scorecard_csv)
        except OSError as exc:
            if http_sock is not None:
                http_sock.close()
            _close_listener(listener, conf.server.socket)
            say(f"uma: cannot write the scorecard to {conf.server.scorecard_csv}: "
                f"{exc.strerror or exc}")
            return 1
        # asked for, so shown at every log level but none
        logging.getLogger("uma.scorecard").setLevel(
            logging.CRITICAL if conf.log_level == "none" else logging.INFO)

    def abandon(code: int) -> int:
        if http_sock is not None:
            http_sock.close()
        _close_listener(listener, conf.server.socket)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if code == 0:
            say("uma: stopped before it was ready")
        return code

    # 2. The model and the device's timing, with progress: bars on a terminal, a line each
    # in a log.
    name = Path(conf.engine.model).name
    console = Console(stderr=True)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      transient=True, console=console, disable=not console.is_terminal) as bar:
            if not console.is_terminal:
                say(f"uma: loading {name}")
            load = bar.add_task(f"loading {name}", total=1.0)

            def loading(fraction: float) -> bool:
                bar.update(load, completed=fraction)
                return not stopping.is_set()  # False cancels the load
            # llama.cpp's own lines about a file it cannot load would repeat the one-line
            # reason the error below gives (still shown at --log-level info or debug)
            if conf.log_level in ("warn", "error"):
                _core.set_log_level("none")
            try:
                engine = Engine.from_config(conf.engine, progress=loading,
                                            timing_dir=cache_root() / "timing")
            finally:
                _core.set_log_level(conf.log_level if conf.log_level != "warn" else "error")
            if stopping.is_set():
                engine.ctx.abort()
            if not console.is_terminal:
                say("uma: timing the device")
            timing = bar.add_task("timing the device", total=1.0)
            while not engine.wait_ready(0.1):
                done, total = engine.calibration
                bar.update(timing, completed=done / max(total, 1))
    except UmaError as exc:
        if stopping.is_set():
            return abandon(0)
        say(f"uma: {exc}")
        return abandon(1)
    if stopping.is_set():
        engine.close()
        return abandon(0)

    # 3. Serving. One model host behind both doors: the first model, and those of the model
    # directory loaded on demand (each load and unload told on stderr).
    from uma.server.hosting import host_for

    try:
        host = host_for(engine, conf.server, say=lambda line: say(f"uma: {line}"))
    except (UmaError, OSError) as exc:
        engine.close()
        say(f"uma: {_sentence(exc)}")
        return abandon(1)
    daemon = Daemon(engine, conf.server, listener=listener, host=host)
    gateway = None
    try:
        if http_sock is not None:
            from uma.server.http import HttpGateway

            gateway = HttpGateway(engine, conf.server, sock=http_sock, host=host)
            gateway.start()
            daemon.on_stop = gateway.stop_soon  # `uma stop` drains HTTP too
        daemon.bind()
    except (UmaError, OSError) as exc:
        engine.close()
        say(f"uma: {_sentence(exc)}")
        return abandon(1)

    def stop(*_) -> None:
        daemon.stop()  # both doors drain at once, each with the grace period (on_stop)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if stopping.is_set():  # a signal between the last check and here
        stop()
    # Everything start-up made (modules, the model's metadata, the HTTP stack) lives as long
    # as the daemon. Frozen out of the collector's sight, a full collection walks only what
    # serving allocates, not the ~41,000 start-up objects (a pause of about 10 ms on a small
    # CPU, taken on whichever thread allocates, the compute thread's included).
    gc.collect()
    gc.freeze()
    where = conf.server.socket + (f" and {gateway.url}" if gateway is not None else "")
    say(f"uma: serving {name} on {where} (ctx {engine.ctx.n_ctx}, "
        f"parallel {conf.engine.n_seq_max}, backends {','.join(_core.backends())}, "
        f"pid {os.getpid()})")
    notify_systemd("READY=1")
    if scorecards is not None:
        scorecards.start(engine)
    host[0].start_expiry()
    try:
        daemon.serve_forever()
    finally:
        notify_systemd("STOPPING=1")
        if scorecards is not None:
            scorecards.stop()
        if gateway is not None:
            try:
                gateway.stop()
            except TimeoutError as exc:
                say(f"uma: {exc}; closing anyway")
        host[0].close(keep=engine)  # the models loaded on demand
        engine.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if engine.failure is not None:
        # A thread is held inside llama.cpp (a lost RPC worker): the interpreter's own exit
        # would wait on it for ever. Exit at once, as failed, for a service manager to
        # restart the daemon.
        say(f"uma: stopped after a failure: {engine.failure}")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    say("uma: stopped")
    return 0


def _sentence(exc: Exception) -> str:
    """What the user is told: our errors are sentences; an OS error's "[Errno 2] No such file
    or directory: 'x'" becomes "cannot start: No such file or directory (x)"."""
    if isinstance(exc, OSError) and not isinstance(exc, UmaError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"cannot start: {exc.strerror or exc}{where}"
    return str(exc)


def _close_listener(listener: socket.socket, path: str) -> None:
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def notify_systemd(state: str) -> None:
    """Tells systemd (Type=notify units, uma service install) what the daemon is doing; a no-op
    elsewhere. The protocol is one datagram to $NOTIFY_SOCKET (sd_notify(3))."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):  # an abstract socket
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(path)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not notify systemd (%s): %s", state, exc)
