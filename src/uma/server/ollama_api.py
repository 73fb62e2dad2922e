"""Ollama's API beside the OpenAI one, for tools that speak only Ollama: /api/generate,
/api/chat, /api/embed (and the older /api/embeddings), /api/tags, /api/ps, /api/show and
/api/version. Protocol only, no I/O: a request body becomes the OpenAI body the gateway
already checks (uma.server.openai_api), so both dialects accept and refuse the same things in
the same words; answers are Ollama's objects, streamed as NDJSON (one JSON object a line).

Where it differs from Ollama (docs/guide/http-api.md, "Ollama's API"): a model answers to its
catalogue or file name, with or without a tag (`smollm2`, `smollm2:latest`), and the others
of the model directory are listed and loaded on demand (uma.server.models_api, uma.host); a
request's `keep_alive` sets its model's (uma.host); the context is set when the model loads
(`--ctx`), so a request's `num_ctx` never reloads it: a prompt longer than the loaded context
is refused, as on the OpenAI endpoints. Images, `suffix`, `context` token arrays, `template`
and `think` are refused by name.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

from uma.errors import shown
from uma.handle import Result
from uma.model_dir import ModelFile
from uma.server.openai_api import ApiError, one_line
from uma.tools import ToolCall

VERSION = "0.12.0"  # the Ollama API version whose endpoints and fields this follows

# options that map onto the OpenAI body (the same sampling fields, two renamed)
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
             "frequency_penalty", "repeat_penalty", "stop")
_RENAMED = {"repeat_last_n": "penalty_last_n"}
# options that set up the model or the machine: fixed at load here, so accepted and left alone
_LOAD_TIME = frozenset({
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "numa", "num_keep",
    "penalize_newline", "tfs_z", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta"})
_MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Served:
    """The model as Ollama's requests may name it: its catalogue name where it came from the
    catalogue (`smollm2`), its file's name, either with or without a tag (`:latest`)."""

    model_id: str  # the OpenAI endpoints' id: the file's name without .gguf
    names: tuple[str, ...] = ()  # catalogue names of the same file

    @property
    def name(self) -> str:
        """The name Ollama's lists give it: the first of its names, with the default tag."""
        return f"{(self.names or (self.model_id,))[0]}:latest"

    def serves(self, model: str) -> bool:
        """Whether a request's `model` names this one."""
        return model.removesuffix(":latest") in (*self.names, self.model_id) \
            or model == f"{self.model_id}.gguf"

    def check(self, body: Mapping[str, Any]) -> None:
        """The body's `model` must be this one; 404 naming it otherwise, as Ollama answers
        for a model it does not have."""
        model = body.get("model")
        if model is None:
            raise ApiError(400, "model is required", param="model")
        if type(model) is not str or not self.serves(model):
            raise ApiError(404, f"model {shown(model)} not found; this server has "
                                f"{self.name!r}", param="model", code="model_not_found")


def named_model(body: object) -> object:
    """The model a body names: `model`, else the older `name` (/api/show)."""
    if type(body) is not dict:
        return None
    return body["model"] if body.get("model") is not None else body.get("name")


def _object(body: object) -> dict[str, Any]:
    if type(body) is not dict:
        raise ApiError(400, "the body must be a JSON object")
    return body


def _refused(body: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if body.get(name) not in (None, False, [], ""):
            raise ApiError(400, f"{name} is not supported", param=name)


def _options(body: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as OpenAI body fields: sampling passed on (num_predict as max_tokens, -1 and
    -2, Ollama's "no limit" and "fill the context", as the server's default), load-time
    options accepted and left alone, anything else refused by name."""
    options = body.get("options")
    if options is None:
        return {}
    if type(options) is not dict:
        raise ApiError(400, "options must be an object", param="options")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "num_predict":
            if value not in (-1, -2):
                out["max_tokens"] = value
        elif key in _SAMPLING:
            out[key] = value
        elif key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key not in _LOAD_TIME:
            raise ApiError(400, f"options.{shown(key)} is not a known option", param="options")
    return out


def _format(body: Mapping[str, Any]) -> dict[str, Any]:
    """`format`: "json" or a JSON schema, as OpenAI's response_format."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if type(fmt) is dict:
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "format", "schema": fmt}}}
    raise ApiError(400, f"format must be \"json\" or a JSON schema, not {shown(fmt)}",
                   param="format")


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if type(stream) is not bool:
        raise ApiError(400, f"stream must be true or false, not {shown(stream)}", param="stream")
    return stream


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_s(body: object) -> float | None | EllipsisType:
    """A request's `keep_alive`: how long its model stays loaded once idle, in seconds (None:
    until unloaded, as any negative duration means; 0: unloaded once the request ends; ...:
    not given, the daemon's setting). A duration as Go writes them ("5m", "1h30m", "-1m") or a
    number of seconds; anything else is a 400 naming it."""
    value = body.get("keep_alive") if isinstance(body, dict) else None
    if value is None:
        return ...
    seconds: float | None = None
    if type(value) in (int, float) and math.isfinite(value):
        seconds = float(value)
    elif type(value) is str:
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = sign * float(text)  # a number of seconds, as text
        except ValueError:
            parts = _DURATION.findall(text)
            if parts and "".join(n + u for n, u in parts) == text:
                seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds is None:
        raise ApiError(400, f"keep_alive must be a duration (\"5m\", \"-1m\") or seconds, not "
                            f"{shown(value)}", param="keep_alive")
    return None if seconds < 0 else seconds


def _keep_alive(body: Mapping[str, Any]) -> None:
    keep_alive_s(body)  # checked: the gateway applies it to the model (uma.host)


@dataclass(frozen=True)
class OllamaRequest:
    """An Ollama generation request as the OpenAI body the gateway checks, and how to answer."""

    openai: dict[str, Any]  # a chat or completion body (stream always true: chunks are ours)
    chat: bool  # messages (the chat template applies) rather than a raw prompt
    stream: bool  # NDJSON lines, else one object
    answer: str  # "generate" | "chat": which of Ollama's shapes to answer in
    empty: bool = False  # no prompt (or no messages): Ollama's way to load (or, with
    # keep_alive 0, unload) a model without generating


def parse_generate(body: object, served: Served) -> OllamaRequest:
    """POST /api/generate: `prompt` (and `system`) through the model's chat template, or as
    it is with `raw`."""
    body = _object(body)
    served.check(body)
    _refused(body, "images", "context", "think", "suffix")
    _keep_alive(body)
    prompt = body.get("prompt", "")
    if type(prompt) is not str:
        raise ApiError(400, f"prompt must be a string, not {shown(prompt)}", param="prompt")
    system = body.get("system")
    if system is not None and type(system) is not str:
        raise ApiError(400, f"system must be a string, not {shown(system)}", param="system")
    raw = body.get("raw", False)
    if type(raw) is not bool:
        raise ApiError(400, f"raw must be true or false, not {shown(raw)}", param="raw")
    if body.get("template"):
        raise ApiError(400, "template is not supported: the model's own chat template applies",
                       param="template")
    common = {"model": served.model_id, "stream": True, **_options(body), **_format(body)}
    empty = not prompt and not system
    if raw:
        return OllamaRequest({**common, "prompt": prompt}, False, _stream(body), "generate",
                             empty)
    messages = ([{"role": "system", "content": system}] if system else []) \
        + [{"role": "user", "content": prompt}]
    return OllamaRequest({**common, "messages": messages}, True, _stream(body), "generate",
                         empty)


def parse_chat(body: object, served: Served) -> OllamaRequest:
    """POST /api/chat: `messages` (with Ollama's tool calls and tool results), `tools`."""
    body = _object(body)
    served.check(body)
    _refused(body, "think")
    _keep_alive(body)
    messages = body.get("messages")
    if type(messages) is not list:
        raise ApiError(400, f"messages must be a list, not {shown(messages)}", param="messages")
    out: dict[str, Any] = {"model": served.model_id, "stream": True,
                           "messages": [_message(m, i) for i, m in enumerate(messages)],
                           **_options(body), **_format(body)}
    if body.get("tools"):
        out["tools"] = body["tools"]
    return OllamaRequest(out, True, _stream(body), "chat", not messages)


def _message(message: object, i: int) -> dict[str, Any]:
    """One Ollama message as an OpenAI one: tool calls get an id and their arguments as JSON
    text; a tool result's tool_name becomes its name."""
    where = f"messages[{i}]"
    if type(message) is not dict:
        raise ApiError(400, f"{where} must be an object", param="messages")
    role = message.get("role")
    if role not in _MESSAGE_ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(_MESSAGE_ROLES)}, not "
                            f"{shown(role)}", param="messages")
    if message.get("images"):
        raise ApiError(400, f"{where}.images is not supported: the model reads text only",
                       param="messages")
    content = message.get("content", "")
    out: dict[str, Any] = {"role": role, "content": "" if content is None else content}
    if role == "tool" and message.get("tool_name") is not None:
        out["name"] = message["tool_name"]
    calls = message.get("tool_calls")
    if calls:
        if type(calls) is not list:
            raise ApiError(400, f"{where}.tool_calls must be a list", param="messages")
        out["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{j}]", j)
                             for j, call in enumerate(calls)]
    return out


def _tool_call(call: object, where: str, j: int) -> dict[str, Any]:
    fn = call.get("function") if type(call) is dict else None
    if type(fn) is not dict or type(fn.get("name")) is not str:
        raise ApiError(400, f"{where} must be {{'function': {{'name': ..., 'arguments': "
                            "{...}}}", param="messages")
    arguments = fn.get("arguments", {})
    if type(arguments) is not str:
        arguments = json.dumps(arguments)
    return {"id": f"call_{j}", "type": "function",
            "function": {"name": fn["name"], "arguments": arguments}}


def now() -> str:
    """Ollama's created_at: UTC, RFC 3339."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def line(obj: Mapping[str, Any]) -> bytes:
    """One NDJSON line."""
    return one_line(json.dumps(obj, ensure_ascii=False)).encode() + b"\n"


class Answer:
    """Ollama's answer objects for one generation request: a chunk per piece of text, the
    last with the request's figures."""

    def __init__(self, req: OllamaRequest, served: Served) -> None:
        self.chat = req.answer == "chat"
        self.model = served.name

    def chunk(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"message": {"role": "assistant", "content": text}} \
            if self.chat else {"response": text}
        return {"model": self.model, "created_at": now(), **body, "done": False}

    def loaded(self, reason: str) -> dict[str, Any]:
        """The answer to a request with no prompt: its model was loaded ("load") or is to be
        unloaded ("unload"), nothing generated."""
        body: dict[str, Any] = {"message": {"role": "assistant", "content": ""}} \
            if self.chat else {"response": ""}
        return {"model": self.model, "created_at": now(), **body, "done_reason": reason,
                "done": True}

    def calls(self, calls: Sequence[ToolCall]) -> dict[str, Any]:
        """A chunk with the model's tool calls (chat only), their arguments as objects."""
        return {"model": self.model, "created_at": now(),
                "message": {"role": "assistant", "content": "",
                            "tool_calls": [tool_call(c) for c in calls]}, "done": False}

    def final(self, result: Result, text: str = "") -> dict[str, Any]:
        """The last object: with `text` (all of it, when not streamed), the reason it ended
        and its figures (nanoseconds)."""
        t, u = result.timings, result.usage
        prompt_ns = int(1e6 * max(t.ttft_ms - t.queue_ms, 0.0)) if t.ttft_ms == t.ttft_ms else 0
        eval_ns = int(1e6 * max(t.total_ms - t.ttft_ms, 0.0)) if t.ttft_ms == t.ttft_ms else 0
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if result.tool_calls and text is not None:
                message["tool_calls"] = [tool_call(c) for c in result.tool_calls]
            body: dict[str, Any] = {"message": message}
        else:
            body = {"response": text}
        return {"model": self.model, "created_at": now(), **body, "done": True,
                "done_reason": "stop" if result.finish_reason == "tool_calls"
                else result.finish_reason,
                "total_duration": int(1e6 * t.total_ms), "load_duration": 0,
                "prompt_eval_count": u.prompt_tokens, "prompt_eval_duration": prompt_ns,
                "eval_count": u.completion_tokens, "eval_duration": eval_ns}


def tool_call(call: ToolCall) -> dict[str, Any]:
    """A call as Ollama gives it: the arguments an object (text that is not one kept as is)."""
    try:
        arguments: Any = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    return {"function": {"name": call.name, "arguments": arguments}}


@dataclass(frozen=True)
class ModelFacts:
    """What Ollama's lists say of the loaded model."""

    served: Served
    size_bytes: int
    modified_at: str  # the file's mtime, RFC 3339
    architecture: str
    n_params: int
    quantization: str
    n_ctx_train: int
    n_embd: int
    context: int  # the context a request has here
    chat_template: str | None

    def details(self) -> dict[str, Any]:
        return _details(self.architecture, self.n_params, self.quantization)

    def listed(self) -> dict[str, Any]:
        """An entry of /api/tags."""
        return {"name": self.served.name, "model": self.served.name,
                "modified_at": self.modified_at, "size": self.size_bytes,
                "digest": "", "details": self.details()}

    def running(self, expires_at: float | None = None) -> dict[str, Any]:
        """An entry of /api/ps: loaded until expires_at (seconds since the epoch; None: until
        unloaded, which Ollama writes as year 1)."""
        return {**self.listed(), "expires_at": "0001-01-01T00:00:00Z" if expires_at is None
                else rfc3339(expires_at), "size_vram": 0, "context_length": self.context}

    def shown(self) -> dict[str, Any]:
        """/api/show's answer."""
        arch = self.architecture
        return {"modelfile": "", "parameters": "", "template": self.chat_template or "",
                "details": self.details(), "modified_at": self.modified_at,
                "model_info": {"general.architecture": arch,
                               "general.parameter_count": self.n_params,
                               f"{arch}.context_length": self.n_ctx_train,
                               f"{arch}.embedding_length": self.n_embd},
                "capabilities": ["completion", "embedding"]
                + (["tools"] if self.chat_template and "tool" in self.chat_template else [])}


def tags(facts: ModelFacts | Sequence[ModelFacts], others: Sequence[ModelFile]
         ) -> dict[str, Any]:
    """/api/tags: the loaded models, then the others available (usable files only), each
    marked `loaded`, a field of this server's."""
    loaded = [facts] if isinstance(facts, ModelFacts) else list(facts)
    return {"models": [*({**f.listed(), "loaded": True} for f in loaded),
                       *(_listed_file(m) for m in others if m.usable)]}


def _listed_file(m: ModelFile) -> dict[str, Any]:
    name = f"{m.name}:latest"
    return {"name": name, "model": name, "modified_at": rfc3339(m.modified), "size": m.size,
            "digest": "", "details": _details(m.architecture or "", m.n_params,
                                              m.quantization or ""),
            "loaded": False}


def _details(architecture: str, n_params: int | None, quantization: str) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": architecture,
            "families": [architecture],
            "parameter_size": "" if n_params is None else _params(n_params),
            "quantization_level": quantization}


def rfc3339(seconds: float) -> str:
    """A file time as Ollama's modified_at: UTC, RFC 3339, whole seconds."""
    when = datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc)
    return when.isoformat().replace("+00:00", "Z")


def _params(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def parse_show(body: object, served: Served) -> None:
    served.check({**_object(body), "model": named_model(body)})


def parse_embed(body: object, served: Served, legacy: bool = False
                ) -> tuple[list[str | list[int]], bool]:
    """POST /api/embed ({"input": a text or a list of texts}) or the older /api/embeddings
    ({"prompt": a text}): the inputs, and whether the answer is the older one. `truncate`
    false is honoured as OpenAI's endpoint does (an input over the context is refused)."""
    body = _object(body)
    served.check(body)
    _keep_alive(body)
    _options(body)
    if legacy:
        prompt = body.get("prompt")
        if type(prompt) is not str:
            raise ApiError(400, f"prompt must be a string, not {shown(prompt)}", param="prompt")
        return [prompt], True
    inputs = body.get("input")
    if type(inputs) is str:
        inputs = [inputs]
    if type(inputs) is not list or not inputs or any(type(x) is not str for x in inputs):
        raise ApiError(400, f"input must be a text or a list of texts, not {shown(inputs)}",
                       param="input")
    dims = body.get("dimensions")
    if dims is not None:
        raise ApiError(400, "dimensions is not supported: vectors are the model's own size",
                       param="dimensions")
    return inputs, False


def error_body(exc: ApiError) -> dict[str, str]:
    """Ollama's error object: just the message."""
    return {"error": exc.message}
