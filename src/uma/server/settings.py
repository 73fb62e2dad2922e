"""The daemon's settings: one table of every setting, read from a config file (TOML or YAML),
environment variables and flags, in that order of increasing precedence, checked and split
into an EngineConfig and a ServerConfig.

Every source uses the same names (the `uma run` options with underscores), e.g.::

    # uma.toml
    model = "~/models/qwen2.5-coder-7b-q8_0.gguf"
    ctx = 16384
    parallel = 8
    socket = "/run/user/1000/uma.sock"
    max_tokens = 2048

and a file may also give them in the design brief's nested sections (`kv: {ctx: 16384}`;
config_shape maps each dotted path to its setting, config_file reads either syntax).
The table (SETTINGS) is where `uma run --help`, `uma config`, the environment's parsing and the
errors get their names, types and defaults; docs/guide/configuration.md is checked against it.
An error names the setting as the user gave it: `--ctx`, `UMA_CTX`, `ctx in uma.toml` or
`kv.ctx in uma.yaml`. The scheduling policy's knobs (uma.knobs) are settings too, one each,
gathered into EngineConfig.slo (the file may also hold them in its [slo] table).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from uma.config import EngineConfig, ServerConfig, default_socket_path
from uma.errors import InvalidRequestError
from uma.knobs import KNOBS, Knob
from uma.sched.bound import BoundPolicy
from uma.sched.knob_defaults import knob_default
from uma.server import config_file, config_shape


@dataclass(frozen=True)
class Setting:
    name: str  # TOML key; UMA_<NAME> in the environment; --name (dashes) as a flag
    kind: type  # int, float, bool or str
    default: str  # as shown in --help, `uma config` and docs/guide/configuration.md
    help: str
    # "engine" or "server": the dataclass it fills; "slo": a scheduling-policy knob (a pair in
    # EngineConfig.slo); "" for the CLI's own
    config: str = ""
    field: str = ""  # that dataclass's field (default: the name)
    flag: bool = True  # has a `uma run` flag

    @property
    def env(self) -> str:
        return f"UMA_{self.name.upper()}"

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def fills(self) -> str:
        """The config dataclass the setting ends up in ("engine", "server" or "")."""
        return "engine" if self.config == "slo" else self.config


def _e(name, kind, default, help, field="", flag=True):
    return Setting(name, kind, default, help, "engine", field or name, flag)


def _s(name, kind, default, help, field="", flag=True):
    return Setting(name, kind, default, help, "server", field or name, flag)


def _knob(knob: Knob) -> Setting:
    """A scheduling-policy knob, shown with its policy's default; a flag only where the knob
    is one a user may need (the rest: the file, its [slo] table, or the environment)."""
    value = knob_default(knob)
    if isinstance(value, bool):
        shown = "on" if value else "off"  # as the switches above show theirs
    else:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
    return Setting(knob.name, knob.kind, shown, knob.help, "slo", knob.name, knob.flag)


SETTINGS: tuple[Setting, ...] = (
    _e("model", str, "the built-in demo model", "GGUF model file to serve", flag=False),
    _e("ctx", int, "4096", "KV cache positions in all", "n_ctx"),
    _e("parallel", int, "8", "requests decoded at once", "n_seq_max"),
    _e("batch", int, "2048", "most tokens per decode call", "n_batch"),
    _e("ubatch", int, "512 (at most batch)", "compute step size", "n_ubatch"),
    _e("threads", int, "the cores, at most 16", "CPU threads", "n_threads"),
    _e("threads_batch", int, "= threads", "CPU threads for prompt batches", "n_threads_batch",
       flag=False),
    _e("gpu_layers", int, "-1 (all)", "layers offloaded to the GPU", "n_gpu_layers"),
    _e("experts_used", int, "the model's", "MoE experts per token",
       "n_expert_used"),
    Setting("kv_type", str, "f16", "K and V cache type: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1 "
            "or q4_0"),
    _e("type_k", str, "f16", "K cache type (kv_type sets both)", flag=False),
    _e("type_v", str, "f16", "V cache type (kv_type sets both)", flag=False),
    _e("kv_unified", bool, "on", "all requests in one KV buffer"),
    _e("flash_attn", str, "auto", "flash attention: auto, on or off"),
    _e("device_sampling", str, "auto",
       "sample on the GPU (auto: CUDA)"),
    _e("overlap", str, "auto", "output while the GPU decodes"),
    _e("policy", str, "bound", "bound or baseline"),
    _e("tick_ms", float, "30", "baseline policy: tick time budget in ms", "tick_target_ms",
       flag=False),
    _e("latency_cap", float, "1.2", "the streams' gap p95 allowed beside other work, x "
       "theirs alone"),
    _e("tick_budget_ms", float, "none", "a fixed tick line in ms", flag=False),
    _e("bmt_budget", float, "probed on CPU, off on GPUs",
       "memory bandwidth for ticks in GB/s, e.g. 320GBps (0: off)", "bmt_budget_gbps"),
    _e("max_queue", int, "1024", "requests waiting beyond this are refused", flag=False),
    _e("prefix_cache", int, "8", "cached prompts (0: off)"),
    _e("prefix_cache_tokens", int, "half of ctx", "tokens it may hold"),
    _e("prefix_cache_ram_mb", int, "1024",
       "host memory for prompts that leave the KV cache, MiB (0: none)"),
    _e("prefix_cache_disk_mb", int, "4096 (the daemon; an embedded engine: 0)",
       "disk for prompts kept across restarts, MiB (0: none)", flag=False),
    _e("prefix_cache_dir", str, "$UMA_CACHE_DIR/prefix, else ~/.cache/uma-serve/prefix",
       "where prompts kept across restarts are saved", flag=False),
    _e("background_ctx", int, "0 (off)",
       "KV positions of a second context for background requests (long prompts)"),
    _e("background_seqs", int, "2", "background decoders at once"),
    _e("speculation", str, "off", "guessing ahead: off, ngram, draft"),
    _e("draft_model", str, "none", "same-vocabulary model that drafts"),
    _e("chat_template", str, "the model's, else chatml",
       "chatml, llama2, llama3 or a Jinja file"),
    _e("fair_share", bool, "on", "fair share between apps"),
    _e("preempt_at_token", bool, "on", "background requests give their sequences to "
       "interactive ones at a token boundary", flag=False),
    _e("app_weights", str, "every app 1", "apps' weights for fair share, as NAME=W,NAME=W"),
    _e("fair_quantum_ms", float, "half the largest recent request's cost",
       "fair share: tick ms an app may be served beyond one waiting for a sequence",
       flag=False),
    _e("app_latency_caps", str, "latency_cap",
       "apps' own latency caps, as NAME=CAP,NAME=CAP"),
    _e("embedding_ctx", int, "2048", "most tokens of an embeddings input"),
    _e("rpc", str, "none", "RPC workers: HOST:PORT,HOST:PORT"),
    _e("tensor_split", str, "by free memory", "layer shares, e.g. 1,1,2"),
    _e("pooling", str, "auto", "embeddings: auto, mean, cls, last",
       "embedding_pooling"),
    *(_knob(k) for k in KNOBS),
    _s("models_dir", str, "the model cache", "folder of GGUF models"),
    _s("max_loaded", int, "3", "models loaded at once"),
    _s("keep_alive", float, "300", "idle seconds before a model unloads",
       "keep_alive_s"),
    _s("max_loaded_mb", int, "0 (no cap)", "most MB the loaded models may take", flag=False),
    _s("socket", str, "$XDG_RUNTIME_DIR/uma.sock, else /tmp/uma-$UID.sock",
       "socket path"),
    _s("max_connections", int, "64", "socket connections at once"),
    _s("max_inflight", int, "16", "requests in flight per connection"),
    _s("max_prompt_bytes", int, "1048576", "UTF-8 bytes of a prompt"),
    _s("max_tokens", int, "4096", "cap on a request's max_tokens"),
    _s("default_max_tokens", int, "256", "max_tokens of requests that name none", flag=False),
    _s("idle_timeout", float, "300", "seconds an idle client is kept", "idle_timeout_s"),
    _s("max_frame_bytes", int, "2 x max_prompt_bytes + 64 KiB", "largest request frame"),
    _s("max_input_bytes", int, "33554432", "request bytes buffered in all"),
    _s("frame_timeout", float, "30", "seconds a request frame may take",
       "frame_timeout_s"),
    _s("max_outbuf_bytes", int, "8388608",
       "output a slow reader may fall behind before it is dropped", flag=False),
    _s("grace", float, "5", "seconds to finish requests on stop", "grace_s"),
    Setting("log_level", str, "warn", "none, error, warn, info or debug"),
    _s("scorecard_interval_s", float, "0 (off)", "log the scorecard every this many seconds",
       flag=False),
    _s("scorecard_csv", str, "none", "append each logged scorecard to this CSV file",
       flag=False),
    _s("http", str, "off", "OpenAI API on HOST:PORT (off: none)"),
    _s("api_key", str, "none", "require 'Bearer KEY' on /v1 (shows in ps: prefer a key file)"),
    Setting("api_key_file", str, "none", "API key from this file"),
    _s("allow_public", bool, "off", "public HTTP without a key"),
    _s("http_max_connections", int, "64", "HTTP connections at once"),
    _s("http_header_timeout", float, "10", "seconds headers may take",
       "http_header_timeout_s"),
    _s("http_body_timeout", float, "30", "seconds a body may take",
       "http_body_timeout_s"),
    _s("http_max_body_bytes", int, "2 x max_prompt_bytes + 64 KiB", "largest request body"),
)
BY_NAME = {s.name: s for s in SETTINGS}
DAEMON_PREFIX_DISK_MB = 4096
NAMES = frozenset(BY_NAME)
DEMO_MODEL = "<the built-in demo model>"  # stands for it until the settings are valid


@dataclass(frozen=True)
class Source:
    """Settings from one place. kind: 'file', 'env' or 'flag'; where: the file's path."""

    kind: str
    values: Mapping[str, object]
    where: str = ""
    # a file's keys as written, where not the setting's name ('kv.ctx' for ctx)
    given: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def label(self, name: str) -> str:
        """How the user wrote the setting here, for messages and `uma config`."""
        if self.kind == "file":
            return f"{self.given.get(name, name)} in {self.where}"
        if self.kind == "env":
            return BY_NAME[name].env
        return BY_NAME[name].option


DEFAULT = Source("default", {})


@dataclass(frozen=True)
class Settings:
    engine: EngineConfig
    server: ServerConfig
    log_level: str = "warn"
    origins: Mapping[str, Source] = dataclasses.field(default_factory=dict)  # per setting

    def table(self) -> list[tuple[str, object, str]]:
        """(setting, effective value, where it came from) for every setting."""
        rows = []
        # the knobs' effective values, as the bound policy reads them
        bound = BoundPolicy.from_config(self.engine)
        for s in SETTINGS:
            if s.name in ("kv_type", "api_key_file"):
                continue  # shown as type_k/type_v and api_key
            if s.config == "slo":
                value = getattr(bound, s.field)
            elif s.config:
                value = getattr(self.engine if s.config == "engine" else self.server, s.field)
            else:
                value = self.log_level
            if s.name == "api_key" and value is not None:
                value = "(set)"
            elif s.name == "ubatch":
                value = self.engine.ubatch  # the step llama.cpp is given, not "none"
            origin = self.origins.get(s.name, DEFAULT)
            where = "default" if origin.kind == "default" else origin.label(
                _given_as(s.name, origin))
            rows.append((s.name, value, where))
        return rows


def flags(values: Mapping[str, object]) -> Source:
    """`uma run`'s flags (None: not given)."""
    return Source("flag", {k: v for k, v in values.items() if k in NAMES and v is not None})


def read_file(path: str | os.PathLike) -> Source:
    """A settings file, TOML or YAML by its extension, its keys flat (`ctx`) or in the nested
    sections of config_shape (`kv.ctx`); unknown keys are errors that name the key."""
    where = os.fspath(path)
    values, given = config_shape.flatten(config_file.load(path), where, NAMES)
    source = Source("file", values, where, given)
    for name, value in values.items():
        _check_kind(name, value, source)
    return source


def from_environment(environ: Mapping[str, str] = os.environ) -> Source:
    """UMA_<NAME> variables (UMA_CTX=8192, UMA_SOCKET=...), each read as its setting's type."""
    source = Source("env", {})
    values = {}
    for s in SETTINGS:
        raw = environ.get(s.env)
        if raw is not None:
            values[s.name] = _parse(s, raw, source)
    return dataclasses.replace(source, values=values)


def resolve(sources: Iterable[Source | Mapping[str, object]],
            demo_model: str | None = DEMO_MODEL) -> Settings:
    """Merges sources (later ones win) into checked configs. A plain mapping counts as flags.
    Without a model, demo_model (None: 'no model given' is an error)."""
    merged: dict[str, object] = {}
    origins: dict[str, Source] = {}
    for source in sources:
        if not isinstance(source, Source):
            source = flags(source)
        for name, value in source.values.items():
            if value is not None:
                merged[name], origins[name] = value, source
    if "bmt_budget" in merged:
        merged["bmt_budget"] = _bandwidth(merged["bmt_budget"], "bmt_budget", origins)
    if str(merged.get("http", "")).strip().lower() == "off":
        del merged["http"]  # the design notes' `--http off`: the default
    if "kv_type" in merged:
        kv = merged.pop("kv_type")
        for name in ("type_k", "type_v"):
            if name not in merged:
                merged[name], origins[name] = kv, origins["kv_type"]
    if "model" not in merged:
        if demo_model is None:
            raise InvalidRequestError("no model given")
        merged["model"] = demo_model
    merged["model"] = os.path.expanduser(str(merged["model"]))
    if "draft_model" in merged:
        merged["draft_model"] = os.path.expanduser(str(merged["draft_model"]))
    merged.setdefault("socket", default_socket_path())
    # the daemon keeps its prefix cache across restarts (an embedded engine asks for it)
    merged.setdefault("prefix_cache_disk_mb", DAEMON_PREFIX_DISK_MB)
    merged["socket"] = os.path.expanduser(str(merged["socket"]))
    log_level = str(merged.pop("log_level", "warn"))
    if log_level not in ("none", "error", "warn", "info", "debug"):
        raise _named("log_level", origins, "must be none, error, warn, info or debug, "
                                           f"not {log_level!r}")
    if "api_key_file" in merged:
        if "api_key" in merged:
            raise InvalidRequestError(
                f"give {_label('api_key', origins)} or {_label('api_key_file', origins)}, "
                f"not both")
        merged["api_key"] = _read_key(str(merged.pop("api_key_file")), origins)
        origins["api_key"] = origins["api_key_file"]
    configs = {}
    for which, cls in (("engine", EngineConfig), ("server", ServerConfig)):
        fields = {s.field: merged[s.name] for s in SETTINGS
                  if s.config == which and s.name in merged}
        if which == "engine":  # only the knobs given: the policy keeps its defaults for the rest
            fields["slo"] = tuple((s.field, merged[s.name]) for s in SETTINGS
                                  if s.config == "slo" and s.name in merged)
        try:
            configs[which] = cls(**fields)
        except InvalidRequestError as exc:
            raise _rename(str(exc), which, origins) from None
    return Settings(configs["engine"], configs["server"], log_level, origins)


# --- helpers -------------------------------------------------------------------------------------


def _given_as(name: str, origin: Source) -> str:
    # type_k and type_v set through kv_type are shown as the user wrote them
    if name in ("type_k", "type_v") and "kv_type" in origin.values and name not in origin.values:
        return "kv_type"
    if name == "api_key" and "api_key_file" in origin.values:
        return "api_key_file"
    return name


def _label(name: str, origins: Mapping[str, Source]) -> str:
    origin = origins.get(name)
    return name if origin is None else origin.label(_given_as(name, origin))


def _named(name: str, origins: Mapping[str, Source], problem: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid {_label(name, origins)}: {problem}")


def _rename(message: str, which: str, origins: Mapping[str, Source]) -> InvalidRequestError:
    """A config dataclass's message ('n_ctx must be ...') in the user's words ('invalid --ctx:
    must be ...')."""
    word = message.split(" ", 1)[0]
    for s in SETTINGS:
        if s.fills == which and s.field == word:
            return _named(s.name, origins, message[len(word):].strip())
    return InvalidRequestError(message)


# a bandwidth with its unit, as the design notes write it (320GBps, 320 GB/s); a bare number
# is GB/s
_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*"
                        r"(gbps|gb/s|g|mbps|mb/s|tbps|tb/s)?\s*$", re.IGNORECASE)
_PER_GB = {"g": 1.0, "gbps": 1.0, "gb/s": 1.0, "mbps": 1e-3, "mb/s": 1e-3, "tbps": 1e3,
           "tb/s": 1e3}


def _bandwidth(value: object, name: str, origins: Mapping[str, Source]) -> object:
    """A bandwidth setting in GB/s: a number, or text with a unit (MB/s, GB/s, TB/s)."""
    if not isinstance(value, str):
        return value
    match = _BANDWIDTH.match(value)
    if match is None:
        raise _named(name, origins, f"must be a bandwidth such as 320GBps, 320 GB/s or 320 "
                                    f"(GB/s), not {value!r}")
    return float(match.group(1)) * _PER_GB[(match.group(2) or "g").lower()]


def _check_kind(name: str, value: object, source: Source) -> None:
    if name == "bmt_budget" and isinstance(value, str):
        return  # a bandwidth with its unit, read in resolve
    kind = BY_NAME[name].kind
    ok = (type(value) is kind) or (kind is float and type(value) is int)
    if not ok:
        expected = {int: "an integer", float: "a number", bool: "true or false",
                    str: "text"}[kind]
        raise InvalidRequestError(f"invalid {source.label(name)}: must be {expected}, not "
                                  f"{value!r}")


def _parse(setting: Setting, raw: str, source: Source) -> object:
    text = raw.strip()
    if setting.name == "bmt_budget":
        return raw  # a bandwidth with its unit, read in resolve
    try:
        if setting.kind is bool:
            lowered = text.lower()
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise ValueError
        if setting.kind is int:
            return int(text)
        if setting.kind is float:
            return float(text)
    except ValueError:
        expected = {int: "an integer", float: "a number", bool: "true or false"}[setting.kind]
        raise InvalidRequestError(f"invalid {source.label(setting.name)}: must be {expected}, "
                                  f"not {raw!r}") from None
    return raw


def _read_key(path: str, origins: Mapping[str, Source]) -> str:
    """The API key in a file (a key file keeps it out of `ps` and shell history); the trailing
    newline an editor adds is not part of it."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        raise _named("api_key_file", origins,
                     f"cannot read the API key file {path}: {exc.strerror}") from None
    if not key:
        raise _named("api_key_file", origins, f"the API key file {path} is empty")
    return key
