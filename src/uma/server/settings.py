"""The daemon's settings from a TOML file, environment variables and flags, in that order of
increasing precedence, checked and split into an EngineConfig and a ServerConfig.

Every source uses the same names (the `uma run` options with underscores), e.g.::

    # uma.toml
    model = "~/models/qwen2.5-coder-7b-q8_0.gguf"
    ctx = 16384
    parallel = 8
    socket = "/run/user/1000/uma.sock"
    max_tokens = 2048
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from uma.client import default_socket_path
from uma.config import EngineConfig, ServerConfig
from uma.errors import InvalidRequestError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# setting name -> (which config, its field)
_ENGINE = {
    "model": "model", "ctx": "n_ctx", "parallel": "n_seq_max", "batch": "n_batch",
    "ubatch": "n_ubatch", "threads": "n_threads", "threads_batch": "n_threads_batch",
    "gpu_layers": "n_gpu_layers", "kv_unified": "kv_unified", "type_k": "type_k",
    "type_v": "type_v", "flash_attn": "flash_attn", "policy": "policy",
    "tick_ms": "tick_target_ms", "max_queue": "max_queue", "latency_cap": "latency_cap",
    "tick_budget_ms": "tick_budget_ms", "bmt_budget": "bmt_budget_gbps",
}
_SERVER = {
    "socket": "socket", "max_connections": "max_connections", "max_inflight": "max_inflight",
    "max_prompt_bytes": "max_prompt_bytes", "max_tokens": "max_tokens",
    "default_max_tokens": "default_max_tokens", "idle_timeout": "idle_timeout_s",
    "max_frame_bytes": "max_frame_bytes", "max_outbuf_bytes": "max_outbuf_bytes",
    "grace": "grace_s", "http": "http", "api_key": "api_key", "allow_public": "allow_public",
    "max_input_bytes": "max_input_bytes", "frame_timeout": "frame_timeout_s",
    "http_max_connections": "http_max_connections",
    "http_header_timeout": "http_header_timeout_s", "http_body_timeout": "http_body_timeout_s",
    "http_max_body_bytes": "http_max_body_bytes",
}
# kv_type sets type_k and type_v; log_level is the CLI's; api_key_file is read into api_key.
_OTHER = {"kv_type", "log_level", "api_key_file"}
# Kept as given in the environment: an API key or address of digits is still text.
_TEXT = {"api_key", "api_key_file", "http"}
NAMES = frozenset(_ENGINE) | frozenset(_SERVER) | _OTHER


@dataclasses.dataclass(frozen=True)
class Settings:
    engine: EngineConfig
    server: ServerConfig
    log_level: str = "warn"


def read_file(path: str | os.PathLike) -> dict[str, object]:
    """A TOML settings file as a dict; unknown keys are errors that name the key."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidRequestError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequestError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - NAMES)
    if unknown:
        raise InvalidRequestError(
            f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(NAMES))}")
    return data


def resolve(sources: list[Mapping[str, object]], demo_model: str | None = None) -> Settings:
    """Merges sources (later ones win; None values are 'not given') into checked configs."""
    merged: dict[str, object] = {}
    for source in sources:
        merged.update({k: v for k, v in source.items() if v is not None})
    if "kv_type" in merged:
        kv = merged.pop("kv_type")
        merged.setdefault("type_k", kv)
        merged.setdefault("type_v", kv)
    if "model" not in merged and demo_model is not None:
        merged["model"] = demo_model
    if "model" not in merged:
        raise InvalidRequestError("no model given")
    merged["model"] = os.path.expanduser(str(merged["model"]))
    merged.setdefault("socket", default_socket_path())
    merged["socket"] = os.path.expanduser(str(merged["socket"]))
    log_level = str(merged.pop("log_level", "warn"))
    if "api_key_file" in merged:
        if "api_key" in merged:
            raise InvalidRequestError("give api_key or api_key_file, not both")
        merged["api_key"] = _read_key(str(merged.pop("api_key_file")))
    engine = EngineConfig(**{_ENGINE[k]: v for k, v in merged.items() if k in _ENGINE})
    server = ServerConfig(**{_SERVER[k]: v for k, v in merged.items() if k in _SERVER})
    return Settings(engine, server, log_level)


def from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, object]:
    """UMA_<NAME> variables (UMA_CTX=8192, UMA_SOCKET=...), converted like the file's values:
    integers, floats, true/false, or text."""
    out: dict[str, object] = {}
    for name in NAMES:
        raw = environ.get(f"UMA_{name.upper()}")
        if raw is not None:
            out[name] = raw if name in _TEXT else _parse_scalar(raw)
    return out


def _read_key(path: str) -> str:
    """The API key in a file (a key file keeps it out of `ps` and shell history); the trailing
    newline an editor adds is not part of it."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            key = f.read().strip()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read the API key file {path}: {exc.strerror}") from None
    if not key:
        raise InvalidRequestError(f"the API key file {path} is empty")
    return key


def _parse_scalar(raw: str) -> object:
    lowered = raw.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw
