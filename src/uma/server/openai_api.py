"""The OpenAI HTTP API's bodies: requests in, response and chunk objects out. No I/O.

A request body is checked for the OpenAI-only fields (n, stream, stream_options, logprobs, the
features UMA Serve does not have) and then rewritten as a socket-protocol generate message and
parsed by uma.wire.protocol.parse_request, so HTTP accepts exactly what the socket accepts:
the same prompt limits, the same max_tokens cap, and SamplingParams' own checks.

Not supported, and refused with 400 rather than silently ignored: n > 1, several prompts in one
request, echo, suffix and best_of > 1. Other fields that clients commonly send (user, metadata,
store, parallel_tool_calls, ...) are ignored.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from uma import tools as uma_tools
from uma.app import app_name
from uma.config import MAX_TOP_LOGPROBS
from uma.embeddings import Embeddings
from uma.errors import (
    SHOWN_CHARS,
    ClosedError,
    ContextOverflowError,
    EngineFailedError,
    InvalidRequestError,
    ModelBusyError,
    ModelLoadError,
    ModelNotFoundError,
    ModelsFullError,
    shown,
)
from uma.handle import Result, TokenEvent, TopLogprobs
from uma.priority import Priority
from uma.wire import protocol as P
from uma.wire.framing import MAX_DEPTH

# Sampler options passed through as they are. After OpenAI's own, uma's extensions (the names
# llama-server also takes), and priority: 'interactive' or 'background'.
_PASSED = (
    "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty",
    "top_k", "min_p", "repeat_penalty", "penalty_last_n", "ignore_eos", "cache_prompt",
    "parse_special", "priority", "logit_bias", "speculation",
)
# Leading words of protocol/SamplingParams messages that name a body field.
_PARAMS = frozenset({*_PASSED, "max_tokens", "stop", "prompt", "messages", "tokens", "tools",
                     "tool_choice", "response_format", "grammar", "top_logprobs", "input"})
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
# OpenAI's placeholder for a log-probability that is too small to show.
_TINY_LOGPROB = -9999.0
_SURROGATE = re.compile("[\ud800-\udfff]")


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_for(exc: BaseException) -> ApiError:
    """The HTTP answer to an exception from submitting or running a request; the status follows
    the socket's wire code (uma.wire.protocol.error_code_for)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ClosedError):
        return ApiError(503, "the server is shutting down", type="server_error",
                        code="shutting_down")
    if isinstance(exc, EngineFailedError):
        return ApiError(503, str(exc), type="server_error", code="engine_failed")
    if isinstance(exc, ModelBusyError):  # uma.host: no room, or unloading one in use
        return ApiError(503 if isinstance(exc, ModelsFullError) else 409, str(exc),
                        type="server_error", code="model_busy")
    if isinstance(exc, ModelNotFoundError):
        return ApiError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, ModelLoadError):
        return ApiError(500, str(exc), type="server_error", code="model_load_failed")
    code = P.error_code_for(exc)
    if code == P.E_BUSY_001:
        return ApiError(429, str(exc), type="rate_limit_error", code="server_busy")
    if code == P.E_RUNTIME_001:
        return ApiError(500, P.error_message(exc), type="server_error")
    if code == P.E_LIMIT_001 or isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    message = str(exc)
    return ApiError(400, message, param=_param_named_in(message))


@dataclass(frozen=True)
class ApiRequest:
    """One checked completion or chat request."""

    generate: P.GenerateRequest  # prompt, SamplingParams and priority, as the socket has them
    stream: bool  # answer with server-sent events
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts
    user: str | None = None  # OpenAI's end-user id: the app, for fair share (else X-App)
    return_tokens: bool = False  # llama-server's extension: each choice's token ids, "tokens"


def parse_completion(body: object, *, model_id: str, limits: P.RequestLimits,
                     default_priority: Priority) -> ApiRequest:
    """POST /v1/completions."""
    body = _object(body)
    if body.get("prompt") is None:
        raise ApiError(400, "prompt is required", param="prompt")
    if _field(body, "echo", bool):
        raise ApiError(400, "echo is not supported", param="echo")
    if _field(body, "suffix", str):
        raise ApiError(400, "suffix is not supported", param="suffix")
    if _field(body, "best_of", int) not in (None, 1):
        raise ApiError(400, "best_of must be 1", param="best_of")
    # logprobs: N, the N most probable tokens at each step beside the sampled one's
    logprobs = _field(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], not {logprobs}",
                       param="logprobs")
    fields = {**_prompt(body["prompt"]), "max_tokens": body.get("max_tokens"),
              "logprobs": logprobs is not None, "top_logprobs": logprobs or None}
    req = _parse(body, fields, model_id, limits, default_priority)
    # the generated token ids (llama-server's /completion field): a client that sends a
    # conversation back as token ids can send the very reply it got
    if _field(body, "return_tokens", bool):
        req = dataclasses.replace(req, return_tokens=True)
    return req


def parse_chat(body: object, *, model_id: str, limits: P.RequestLimits,
               default_priority: Priority) -> ApiRequest:
    """POST /v1/chat/completions."""
    body = _object(body)
    if body.get("messages") is None:
        raise ApiError(400, "messages is required", param="messages")
    tools, choice = body.get("tools"), body.get("tool_choice")
    try:
        if tools is not None:
            uma_tools.check_tools(tools)
        uma_tools.check_tool_choice(choice, tools)
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param="tools" if str(exc).startswith("tools")
                       else "tool_choice") from None
    logprobs = bool(_field(body, "logprobs", bool))
    top = _field(body, "top_logprobs", int)
    if top is not None and not logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], not {top}",
                       param="top_logprobs")
    # max_completion_tokens is the newer name; OpenAI clients send one or the other.
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    fields = {"messages": _messages(body["messages"]), "max_tokens": max_tokens,
              "logprobs": logprobs, "top_logprobs": top or None, "tools": tools,
              "tool_choice": choice}
    return _parse(body, fields, model_id, limits, default_priority)


def _parse(body: dict, fields: dict, model_id: str, limits: P.RequestLimits,
           default_priority: Priority) -> ApiRequest:
    _check_model(body, model_id)
    if _field(body, "n", int) not in (None, 1):
        raise ApiError(400, "n must be 1: send one request per completion", param="n")
    user = _field(body, "user", str)
    if user is not None:
        try:
            user = app_name(user, "user")
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param="user") from None
    stream = bool(_field(body, "stream", bool))
    options = _field(body, "stream_options", dict) or {}
    include_usage = bool(_field(options, "include_usage", bool, "stream_options.include_usage"))
    msg = {"type": "generate", "id": "http", "stream": stream, "stop": body.get("stop"),
           **{name: body.get(name) for name in _PASSED}, **fields}
    # what the output must match (uma.grammar): OpenAI's response_format on either endpoint,
    # or a GBNF grammar, as llama-server takes it
    msg["response_format"], msg["grammar"] = body.get("response_format"), body.get("grammar")
    req = parse_as_socket(msg, limits, default_priority)
    assert isinstance(req, P.GenerateRequest)  # the message above is a generate request
    return ApiRequest(req, stream, include_usage, user)


def parse_as_socket(msg: dict, limits: P.RequestLimits,
                    default_priority: Priority = Priority.INTERACTIVE) -> P.Request:
    """A body rewritten as a socket message, parsed as the socket parses it: HTTP accepts and
    refuses what the socket does, in the same words. ApiError(400) naming the field."""
    try:
        return P.parse_request(msg, limits, default_priority)
    except P.ProtocolError as exc:
        code = "context_length_exceeded" if exc.code == P.E_LIMIT_001 else None
        raise ApiError(400, exc.message, param=_param_named_in(exc.message), code=code) from None


@dataclass(frozen=True)
class TokenizeBody:
    text: str
    add_special: bool = True
    parse_special: bool = False
    with_pieces: bool = False


def parse_tokenize(body: object, limits: P.RequestLimits) -> TokenizeBody:
    """POST /tokenize, as llama-server takes it: content, add_special, parse_special,
    with_pieces."""
    body = _object(body)
    text = _field(body, "content", str)
    if text is None:
        raise ApiError(400, "content is required", param="content")
    if len(text.encode("utf-8", "surrogatepass")) > limits.max_prompt_bytes:
        raise ApiError(400, f"content is over {limits.max_prompt_bytes} bytes of UTF-8",
                       param="content", code="context_length_exceeded")
    flags = {name: bool(_field(body, name, bool)) for name in ("parse_special", "with_pieces")}
    add = _field(body, "add_special", bool)
    return TokenizeBody(text, True if add is None else add, **flags)


def parse_detokenize(body: object, limits: P.RequestLimits) -> tuple[int, ...]:
    """POST /detokenize: {"tokens": [id, ...]}, checked as the socket's detokenize is."""
    body = _object(body)
    req = parse_as_socket({"type": "detokenize", "id": "http", "tokens": body.get("tokens")},
                          limits)
    assert isinstance(req, P.DetokenizeRequest)
    return req.tokens


@dataclass(frozen=True)
class EmbeddingsBody:
    inputs: list  # texts and token lists (uma.embeddings.inputs_of)
    base64: bool  # encoding_format: base64 (little-endian float32) rather than float
    user: str | None = None


def parse_embeddings(body: object, *, model_id: str, limits: P.RequestLimits,
                     dimensions: int) -> EmbeddingsBody:
    """POST /v1/embeddings: input (a text, token ids, or a list of either), model,
    encoding_format (float or base64), dimensions (only the model's own), user."""
    body = _object(body)
    if body.get("input") is None:
        raise ApiError(400, "input is required", param="input")
    _check_model(body, model_id)
    # the socket's embed checks: the forms, each text's bytes, each token id's range
    req = parse_as_socket({"type": "embed", "id": "http", "input": body["input"]}, limits)
    assert isinstance(req, P.EmbedRequest)
    encoding = _field(body, "encoding_format", str) or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(400, f"encoding_format must be 'float' or 'base64', not {shown(encoding)}",
                       param="encoding_format")
    wanted = _field(body, "dimensions", int)
    if wanted is not None and wanted != dimensions:
        raise ApiError(400, f"dimensions must be the model's own, {dimensions}: vectors are "
                            f"not shortened", param="dimensions")
    return EmbeddingsBody(list(req.inputs), encoding == "base64", _field(body, "user", str))


def embeddings_response(result: Embeddings, model_id: str, base64_floats: bool) -> dict:
    """OpenAI's list of embedding objects, one per input in order."""
    def vector(row: np.ndarray) -> list[float] | str:
        if base64_floats:
            return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
        return row.tolist()

    data = [{"object": "embedding", "index": i, "embedding": vector(row)}
            for i, row in enumerate(result.vectors)]
    return {"object": "list", "data": data, "model": model_id,
            "usage": {"prompt_tokens": result.prompt_tokens,
                      "total_tokens": result.prompt_tokens}}


def body_of(raw: bytes) -> object:
    """A request body: JSON in UTF-8 (RFC 8259; a byte order mark is let pass), checked as the
    socket checks a frame (uma.wire.framing): nested at most MAX_DEPTH deep, every string
    and key valid Unicode. JSON can spell half of a UTF-16 surrogate pair ("\\ud800"), which
    no UTF-8 can carry and no tokenizer takes: it is refused, naming the field, not replaced,
    so that what runs is what was sent. ApiError(400) naming what is wrong."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None
    except RecursionError:
        raise ApiError(400, f"the body is nested more than {MAX_DEPTH} deep") from None
    except ValueError:  # an integer of more digits than Python reads (4300)
        raise ApiError(400, "the body holds a number with too many digits") from None
    _check_tree(body)
    return body


def _check_tree(body: object) -> None:
    # One pass over the containers, as framing._check_shape makes over a frame's; a list of
    # token ids holds no text, and its element types are looked at in C. A body that is no
    # container is refused later, as the wrong kind.
    stack = [(body, "", 1)] if type(body) in (dict, list) else []
    while stack:
        node, path, depth = stack.pop()
        if type(node) is dict:
            for key in node:
                if _SURROGATE.search(key):
                    _lone_surrogate(f"a key in {path or 'the body'}", key)
            items = node.items()
        elif not {str, list, dict} & set(map(type, node)):
            continue
        else:
            items = enumerate(node)
        for key, value in items:
            kind = type(value)
            if kind is str:
                if _SURROGATE.search(value):
                    _lone_surrogate(_path(path, key), value)
            elif kind in (dict, list):
                if depth >= MAX_DEPTH:
                    raise ApiError(400, f"the body is nested more than {MAX_DEPTH} deep",
                                   param=_cut(_path(path, key)))
                stack.append((value, _path(path, key), depth + 1))


def _path(path: str, key: str | int) -> str:
    if type(key) is int:
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _cut(path: str) -> str:
    # made of the body's keys, which may be 100 KB long
    return path if len(path) <= SHOWN_CHARS else f"{path[:SHOWN_CHARS - 3]}..."


def _lone_surrogate(where: str, text: str) -> None:
    found = _SURROGATE.search(text)
    assert found is not None
    where = _cut(where)
    raise ApiError(400, f"{where} is not valid Unicode: it holds half of a UTF-16 surrogate "
                        f"pair (U+{ord(found.group()):04X}) at character {found.start()}",
                   param=where if not where.startswith("a key") else None)


def _object(body: object) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, not {_json_type(body)}")
    return body


def serves(model_id: str, model: str) -> bool:
    """Whether a request's `model` names the served one: its id, or its file's name."""
    return model in (model_id, f"{model_id}.gguf")


def _check_model(body: dict, model_id: str) -> None:
    # the gateway answers a model it does not serve from its listing first
    # (uma.server.models_api); this is the last line for callers without one
    model = _field(body, "model", str)
    if model is not None and not serves(model_id, model):
        raise ApiError(404, f"model {shown(model)} not found; this server has {model_id!r}",
                       param="model", code="model_not_found")


def _field(obj: dict, name: str, kind: type, label: str | None = None):
    """obj[name] if it is of `kind` (null counts as absent); 400 naming it otherwise."""
    value = obj.get(name)
    # type() rather than isinstance(): JSON true is not an integer here.
    if value is not None and type(value) is not kind:
        raise ApiError(400, f"{label or name} must be {_json_name(kind)}, not "
                            f"{_json_type(value)}", param=label or name)
    return value


def _prompt(prompt: object) -> dict:
    """OpenAI's prompt forms: text, token ids, or a list of one of those."""
    if type(prompt) is str:
        return {"prompt": prompt}
    if type(prompt) is list:
        if prompt and all(type(t) is int for t in prompt):
            return {"tokens": prompt}
        if len(prompt) == 1 and type(prompt[0]) in (str, list):
            return _prompt(prompt[0])
        if len(prompt) > 1 and all(type(p) in (str, list) for p in prompt):
            raise ApiError(400, "one prompt per request: several prompts in one request are "
                                "not supported", param="prompt")
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
    raise ApiError(400, f"prompt must be a string or a list of token ids, not "
                        f"{_json_type(prompt)}", param="prompt")


def _messages(messages: object) -> object:
    """OpenAI messages as the socket takes them: text content parts are joined; an assistant
    turn's tool calls, a tool result's call id and names are kept, other fields dropped.
    Anything that is not a list of objects is passed on for the protocol to name the problem."""
    if type(messages) is not list:
        return messages
    out = []
    for i, message in enumerate(messages):
        if type(message) is not dict:
            return messages
        kept = {key: message[key] for key in _MESSAGE_FIELDS if key in message}
        if "content" in kept and kept["content"] is None and not kept.get("tool_calls"):
            kept["content"] = ""  # an empty turn
        elif type(kept.get("content")) is list:
            kept["content"] = _text_parts(kept["content"], f"messages[{i}].content")
        out.append(kept)
    return out


def _text_parts(parts: list, label: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) \
                is not str:
            raise ApiError(400, f"{label}[{j}]: only text content parts are supported",
                           param=label)
        texts.append(part["text"])
    return "\n".join(texts)


def _param_named_in(message: str) -> str | None:
    """The body field a protocol or SamplingParams message starts with ('max_tokens must ...')."""
    word = message.split(" ", 1)[0]
    if word.startswith("response_format."):
        return "response_format"
    if word.startswith("input["):
        return "input"
    return word if word in _PARAMS or word.startswith(("messages[", "tokens[", "stop[",
                                                        "logit_bias[")) \
        else None


def _json_name(kind: type) -> str:
    return {bool: "a boolean", int: "an integer", str: "a string", list: "an array",
            dict: "an object"}[kind]


def _json_type(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object", type(None): "null"}.get(type(value), "unknown")


# --- responses -----------------------------------------------------------------------------------


# Characters JSON leaves raw that line readers split on: clients that read a stream with
# str.splitlines (httpx's iter_lines among them) would cut an event in two at a token holding
# one. Written escaped, every other character stays raw UTF-8.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def one_line(dumped: str) -> str:
    """JSON text with the line breaks only str.splitlines knows escaped."""
    return dumped if dumped.isascii() else dumped.translate(_LINE_BREAKS)


def sse(obj: dict) -> bytes:
    """obj as one server-sent event."""
    return b"data: " + one_line(json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
                                ).encode() + b"\n\n"


# a text no other field of a delta holds (an id, a model name, a number), whose JSON marks where
# the delta's text goes in its template
_MARK = "\x00uma:text\x00"
_MARK_JSON = json.dumps(_MARK, ensure_ascii=False).encode()


class _Format:
    """Builds one request's response objects. piece(token) gives a token's bytes (for
    logprobs); finish reasons other than 'stop' and 'length' never reach here."""

    object_name = ""
    chunk_name = ""
    done_marker = True  # a stream ends with "data: [DONE]"
    return_tokens = False  # each choice carries its token ids (ApiRequest.return_tokens)

    def __init__(self, model_id: str, piece: Callable[[int], bytes], prefix: str) -> None:
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model_id = model_id
        self._piece = piece
        self._template: tuple[bytes, bytes] | None = None  # delta_sse's, made at its first

    def delta(self, event: TokenEvent) -> dict:
        raise NotImplementedError

    def delta_sse(self, event: TokenEvent) -> bytes:
        """sse(delta(event)). A streamed token is the gateway's most frequent write: without
        log-probabilities its bytes come from a template made at the first, only the text
        encoded (the same bytes; tests/server/test_openai_api.py compares them)."""
        if event.logprobs is not None or self.return_tokens:
            return sse(self.delta(event))
        if self._template is None:
            head, tail = sse(self.delta(TokenEvent(_MARK, ()))).split(_MARK_JSON)
            self._template = (head, tail)
        head, tail = self._template
        return head + one_line(json.dumps(event.text, ensure_ascii=False)).encode() + tail

    def _envelope(self, name: str, choices: list) -> dict:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model_id,
                "choices": choices}

    def usage_chunk(self, result: Result) -> dict:
        """The last chunk of a stream with stream_options.include_usage: no choices."""
        return {**self._envelope(self.chunk_name, []), "usage": usage(result)}

    def _text(self, token: int) -> str:
        return self._piece(token).decode("utf-8", "replace")

    def _entry(self, token: int, logprob: float) -> dict:
        """A chat logprobs entry's token fields: its text, log-probability and bytes."""
        piece = self._piece(token)
        return {"token": piece.decode("utf-8", "replace"), "logprob": _finite(logprob),
                "bytes": list(piece)}


class CompletionFormat(_Format):
    """text_completion objects. logprobs: tokens, token_logprobs and text_offset of the
    sampled tokens, and top_logprobs (each step's most probable tokens, text -> logprob) when
    logprobs: N > 0 asked for them (else null)."""

    object_name = chunk_name = "text_completion"

    def __init__(self, model_id: str, piece: Callable[[int], bytes]) -> None:
        super().__init__(model_id, piece, "cmpl")
        self._offset = 0  # characters of text sent so far, for text_offset

    def full(self, result: Result) -> dict:
        return {**self._envelope(self.object_name, [self._choice(
            result.text, result.token_ids, result.logprobs, result.top_logprobs,
            result.finish_reason)]), "usage": usage(result)}

    def delta(self, event: TokenEvent) -> dict:
        return self._envelope(self.chunk_name, [self._choice(
            event.text, event.token_ids, event.logprobs, event.top_logprobs, None)])

    def closing(self, result: Result) -> dict:
        return self._envelope(self.chunk_name, [self._choice("", (), None, None,
                                                             result.finish_reason)])

    def _choice(self, text: str, token_ids: Sequence[int], logprobs: Sequence[float] | None,
                top: Sequence[TopLogprobs] | None, finish_reason: str | None) -> dict:
        lp = None
        if logprobs is not None:
            tokens = [self._text(t) for t in token_ids]
            offsets = []
            for t in tokens:
                offsets.append(self._offset)
                self._offset += len(t)
            lp = {"tokens": tokens, "token_logprobs": [_finite(x) for x in logprobs],
                  "top_logprobs": None if top is None else [
                      {self._text(t): _finite(x) for t, x in step} for step in top],
                  "text_offset": offsets}
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        if self.return_tokens:
            choice["tokens"] = list(token_ids)
        return choice


class ChatFormat(_Format):
    """chat.completion objects. logprobs: content entries for the sampled tokens, each with
    its step's most probable tokens in top_logprobs (empty unless asked for)."""

    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def __init__(self, model_id: str, piece: Callable[[int], bytes]) -> None:
        super().__init__(model_id, piece, "chatcmpl")

    def full(self, result: Result) -> dict:
        message: dict = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            message = {"role": "assistant", "content": result.content or None,
                       "tool_calls": [c.openai() for c in result.tool_calls]}
        choice = {"index": 0, "message": message,
                  "logprobs": self._logprobs(result.token_ids, result.logprobs,
                                             result.top_logprobs),
                  "finish_reason": result.finish_reason}
        return {**self._envelope(self.object_name, [choice]), "usage": usage(result)}

    def opening(self) -> dict:
        """The first chunk: the assistant's role, before any token (clients expect it)."""
        return self._envelope(self.chunk_name, [{
            "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}])

    def delta(self, event: TokenEvent) -> dict:
        return self._envelope(self.chunk_name, [{
            "index": 0, "delta": {"content": event.text},
            "logprobs": self._logprobs(event.token_ids, event.logprobs, event.top_logprobs),
            "finish_reason": None}])

    def tool_calls(self, result: Result) -> dict:
        """The calls of a streamed answer, each whole in one delta, after its content."""
        calls = [{"index": i, **c.openai()} for i, c in enumerate(result.tool_calls)]
        return self._envelope(self.chunk_name, [{
            "index": 0, "delta": {"tool_calls": calls}, "logprobs": None,
            "finish_reason": None}])

    def closing(self, result: Result) -> dict:
        return self._envelope(self.chunk_name, [{
            "index": 0, "delta": {}, "logprobs": None, "finish_reason": result.finish_reason}])

    def _logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float] | None,
                  top: Sequence[TopLogprobs] | None) -> dict | None:
        if logprobs is None:
            return None
        steps = top if top is not None else [()] * len(token_ids)
        content = [{**self._entry(t, lp), "top_logprobs": [self._entry(*e) for e in step]}
                   for t, lp, step in zip(token_ids, logprobs, steps, strict=False)]
        return {"content": content, "refusal": None}


def usage(result: Result) -> dict:
    u = result.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _finite(logprob: float) -> float:
    # JSON has no -Infinity; OpenAI shows what is too small to print as -9999.
    return logprob if math.isfinite(logprob) else _TINY_LOGPROB
