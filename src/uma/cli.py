"""The `uma` command line (typer)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import typer

from uma import synth

app = typer.Typer(
    help="UMA Serve: one llama.cpp model, many local apps.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(help="Inspect models and write synthetic ones.", no_args_is_help=True)
app.add_typer(model_app, name="model")


DEMO_PRESET = "small"


@app.command()
def run(
    model: str | None = typer.Argument(
        None, help="GGUF model to serve (default: a small built-in demo model)"),
    socket: str | None = typer.Option(None, help="Unix socket path [env UMA_SOCKET]"),
    config: Path | None = typer.Option(None, "--config", "-c", help="TOML settings file"),
    ctx: int | None = typer.Option(None, help="KV cache size in tokens [4096]"),
    parallel: int | None = typer.Option(None, help="requests decoded at once [8]"),
    batch: int | None = typer.Option(None, help="most tokens per decode call [512]"),
    ubatch: int | None = typer.Option(None, help="most tokens per compute step [= batch]"),
    threads: int | None = typer.Option(None, help="CPU threads [the cores available]"),
    gpu_layers: int | None = typer.Option(None, help="layers offloaded to the GPU [-1: all]"),
    kv_type: str | None = typer.Option(None, help="KV cache type: f16, q8_0, q4_0, ... [f16]"),
    kv_unified: bool | None = typer.Option(
        None, "--kv-unified/--no-kv-unified", help="one KV buffer for all requests [on]"),
    flash_attn: str | None = typer.Option(None, help="auto, on or off [auto]"),
    tick_ms: float | None = typer.Option(None, help="baseline policy: tick time budget in ms "
                                                    "[30]"),
    policy: str | None = typer.Option(None, help="scheduling policy: slo or baseline "
                                                 "[slo]"),
    latency_cap: float | None = typer.Option(
        None, help="slo: interactive tick time allowed relative to their own [1.2]"),
    tick_budget_ms: float | None = typer.Option(
        None, help="slo: a fixed tick budget in ms instead of the cap"),
    bmt_budget: float | None = typer.Option(
        None, help="slo: memory bandwidth for ticks in GB/s [probed on CPU; 0: off]"),
    max_connections: int | None = typer.Option(None, help="[64]"),
    max_inflight: int | None = typer.Option(None, help="requests in flight per connection [16]"),
    max_prompt_bytes: int | None = typer.Option(None, help="[1 MiB]"),
    max_tokens: int | None = typer.Option(None, help="cap on a request's max_tokens [4096]"),
    idle_timeout: float | None = typer.Option(None, help="seconds before an idle client is "
                                                         "closed [300]"),
    max_frame_bytes: int | None = typer.Option(
        None, help="largest request frame [2 x max-prompt-bytes + 64 KiB]"),
    max_input_bytes: int | None = typer.Option(
        None, help="request bytes buffered across all connections [32 MiB]"),
    frame_timeout: float | None = typer.Option(
        None, help="seconds a request frame may take to arrive whole [30]"),
    grace: float | None = typer.Option(None, help="seconds in-flight requests get on "
                                                  "SIGTERM [5]"),
    log_level: str | None = typer.Option(None, help="none, error, warn, info or debug [warn]"),
    http: str | None = typer.Option(
        None, help="also serve the OpenAI-compatible HTTP API on HOST:PORT, e.g. "
                   "127.0.0.1:8080 (off by default)"),
    api_key: str | None = typer.Option(
        None, help="require 'Authorization: Bearer KEY' on /v1 (visible in ps: prefer "
                   "--api-key-file or UMA_API_KEY)"),
    api_key_file: str | None = typer.Option(None, help="read the API key from this file"),
    allow_public: bool = typer.Option(
        False, "--allow-public", help="allow --http beyond loopback without an API key"),
    http_max_connections: int | None = typer.Option(
        None, help="HTTP connections at once; more are answered 503 [64]"),
    http_header_timeout: float | None = typer.Option(
        None, help="seconds a request's headers may take to arrive [10]"),
    http_body_timeout: float | None = typer.Option(
        None, help="seconds a request's body may take to arrive [30]"),
    http_max_body_bytes: int | None = typer.Option(
        None, help="largest request body [2 x max-prompt-bytes + 64 KiB]"),
) -> None:
    """Serve a model to every app on this machine over a Unix socket (and HTTP, with --http)."""
    from uma.errors import UmaError
    from uma.server import settings

    flags = {k: v for k, v in locals().items() if k in settings.NAMES}
    flags["allow_public"] = allow_public or None  # an absent flag leaves file and env to decide
    try:
        sources = [settings.read_file(config)] if config else []
        sources += [settings.from_environment(), flags]
        demo = None
        if not any(s.get("model") for s in sources):
            demo = str(synth.cached_model(DEMO_PRESET))
            typer.echo("uma: no model given; serving the built-in demo model. It has random "
                       "weights: its text is gibberish. Serve a real one with "
                       "`uma run path/to/model.gguf`.", err=True)
        conf = settings.resolve(sources, demo_model=demo)
    except UmaError as exc:
        typer.echo(f"uma: {exc}", err=True)
        raise typer.Exit(1) from exc
    raise typer.Exit(_serve(conf))


def _serve(conf) -> int:
    """Loads the model (with a progress bar), serves until a signal, returns the exit code."""
    import logging
    import signal

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from uma import _core
    from uma.engine import Engine
    from uma.errors import UmaError
    from uma.server.daemon import Daemon

    level = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
             "error": logging.ERROR, "none": logging.CRITICAL}.get(conf.log_level)
    if level is None:
        typer.echo(f"uma: unknown log level {conf.log_level!r}", err=True)
        return 1
    logging.basicConfig(level=level, format="uma: %(levelname)s %(name)s: %(message)s")
    _core.set_log_level(conf.log_level if conf.log_level != "warn" else "error")
    name = Path(conf.engine.model).name
    try:
        with Progress(TextColumn(f"loading {name}"), BarColumn(), TimeElapsedColumn(),
                      transient=True, console=_stderr_console()) as bar:
            task = bar.add_task("load", total=1.0)
            engine = Engine.from_config(
                conf.engine, progress=lambda f: bar.update(task, completed=f))
    except UmaError as exc:
        typer.echo(f"uma: {exc}", err=True)
        return 1
    daemon = Daemon(engine, conf.server)
    gateway = None
    if conf.server.http:
        from uma.server.http import HttpGateway  # starlette and uvicorn load only when used

        gateway = HttpGateway(engine, conf.server)
    try:
        if gateway is not None:
            gateway.start()
        daemon.bind()
    except (UmaError, OSError) as exc:
        if gateway is not None:
            gateway.stop()
        engine.close()
        typer.echo(f"uma: {exc}", err=True)
        return 1

    def stop(*_) -> None:
        # Both doors drain at once, each with the grace period.
        daemon.stop()
        if gateway is not None:
            gateway.stop_soon()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    where = conf.server.socket + (f" and {gateway.url}" if gateway is not None else "")
    typer.echo(f"uma: serving {name} on {where} (ctx {engine.ctx.n_ctx}, "
               f"parallel {conf.engine.n_seq_max}, backends {','.join(_core.backends())}, "
               f"pid {os.getpid()})", err=True)
    try:
        daemon.serve_forever()
    finally:
        if gateway is not None:
            try:
                gateway.stop()
            except TimeoutError as exc:
                typer.echo(f"uma: {exc}; closing anyway", err=True)
        engine.close()
    typer.echo("uma: stopped", err=True)
    return 0


# Exit codes of the client commands (the seed tracker's): a request the server refused or that
# failed there, and a daemon that cannot be reached or broke the protocol.
EXIT_SERVER_ERROR = 2
EXIT_CONNECTION_ERROR = 3


@contextlib.contextmanager
def _client_errors():
    """Turns a client command's failures into a message and its exit code."""
    from uma.client import ConnectionLost, ServerError
    from uma.errors import InvalidRequestError

    try:
        yield
    except (ServerError, InvalidRequestError) as exc:
        typer.echo(f"uma: {exc}", err=True)
        raise typer.Exit(EXIT_SERVER_ERROR) from exc
    except ConnectionLost as exc:
        typer.echo(f"uma: {exc}", err=True)
        raise typer.Exit(EXIT_CONNECTION_ERROR) from exc


@app.command()
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="the prompt text"),
    max_tokens: int = typer.Option(256, help="most tokens to generate"),
    temp: float = typer.Option(0.0, "--temp", help="temperature (0: greedy)"),
    top_p: float = typer.Option(1.0, help="nucleus sampling mass"),
    top_k: int = typer.Option(0, help="keep only the k most likely tokens (0: off)"),
    seed: int = typer.Option(0, help="sampling seed"),
    stop: list[str] | None = typer.Option(None, help="stop string (repeatable)"),
    priority: str = typer.Option("interactive", help="interactive or background"),
    no_stream: bool = typer.Option(False, "--no-stream", help="print the text when done"),
    socket: str | None = typer.Option(None, help="daemon socket [env UMA_SOCKET]"),
) -> None:
    """Generate text with the running daemon, streaming it to stdout."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        stream = client.submit(prompt, max_tokens=max_tokens, temperature=temp, top_p=top_p,
                               top_k=top_k, seed=seed, stop=stop or (), priority=priority,
                               stream=not no_stream)
        for event in stream:
            typer.echo(event.text, nl=False)
        result = stream.result()
        if no_stream:
            typer.echo(result.text, nl=False)
        typer.echo()


@app.command()
def metrics(
    as_json: bool = typer.Option(False, "--json", help="print the raw snapshot as JSON"),
    socket: str | None = typer.Option(None, help="daemon socket [env UMA_SOCKET]"),
) -> None:
    """Print the daemon's metrics."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        snap = client.metrics()
    if as_json:
        typer.echo(json.dumps(snap, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", "value", title=f"uma metrics: {snap.get('model', '')}")
    for name, value in sorted(snap.items()):
        if isinstance(value, dict):
            if value.get("count"):
                value = (f"n={value['count']} p50={value['p50']:.2f} p95={value['p95']:.2f} "
                         f"p99={value['p99']:.2f} max={value['max']:.2f}")
            else:
                continue
        elif isinstance(value, float):
            value = f"{value:.4g}"
        table.add_row(name, str(value))
    Console().print(table)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


@app.command()
def info() -> None:
    """The backends compiled into this build and llama.cpp's view of the machine."""
    from uma import _core

    typer.echo(json.dumps({"backends": _core.backends(), "system": _core.system_info()}, indent=2))


@model_app.command("synth")
def model_synth(
    preset: str = typer.Argument("tiny", help=f"One of: {', '.join(synth.PRESETS)}"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Where to write it (default: the model cache)"
    ),
    seed: int | None = typer.Option(None, help="Seed of the random weights"),
    dtype: str | None = typer.Option(None, help="Weight type: f32, f16 or q8_0"),
) -> None:
    """Write a synthetic GGUF model: a real architecture and tokenizer with seeded random
    weights. It runs at the speed of a real model of its shape; its text is gibberish."""
    if preset not in synth.PRESETS:
        choices = ", ".join(synth.PRESETS)
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {choices}")
    changes = {k: v for k, v in (("seed", seed), ("dtype", dtype)) if v is not None}
    try:
        spec = dataclasses.replace(synth.PRESETS[preset], **changes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    path = synth.write_model(output, spec) if output else synth.cached_model(spec)
    typer.echo(str(path))


@model_app.command("info")
def model_info(path: Path = typer.Argument(..., help="A GGUF file")) -> None:
    """Print a model's metadata as JSON."""
    from uma import _core
    from uma.errors import ModelLoadError

    try:
        with _core.Model(path) as model:
            typer.echo(json.dumps(model.info(), indent=2))
    except ModelLoadError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def main() -> None:
    app()


if __name__ == "__main__":
    main()
