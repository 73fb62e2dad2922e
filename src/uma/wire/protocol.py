"""The daemon's messages: requests a client sends, events the daemon answers with.

Data in, data out, no I/O. `parse_request` turns a decoded frame (uma.wire.framing) into a
frozen request, checking every field and naming the bad one; sampler options go through
uma.config.SamplingParams, so the socket accepts exactly what uma.Engine accepts. The
``*_event`` builders make the maps the daemon sends and `parse_event` is the client's check of
them. A client matches errors on their wire ``code``; the message is for people.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

from uma import embeddings as uma_embeddings
from uma import grammar as uma_grammar
from uma import templates
from uma import tools as uma_tools
from uma.app import app_name, app_weight
from uma.config import SamplingParams
from uma.embeddings import Embeddings
from uma.errors import (
    BatchFullError,
    ClosedError,
    ContextOverflowError,
    EngineBusyError,
    EngineFailedError,
    InvalidRequestError,
    ModelBusyError,
    ModelLoadError,
    NoChatTemplateError,
    UmaError,
    kind_of,
    shown,
)
from uma.handle import TopLogprobs
from uma.priority import Priority
from uma.tools import ToolCall

# --- wire error codes --------------------------------------------------------------------------

E_PROTO_001 = "E_PROTO_001"  # bad msgpack / invalid payload
E_PROTO_002 = "E_PROTO_002"  # bad frame length / frame too large / closed mid-frame
E_PROTO_003 = "E_PROTO_003"  # schema error: missing field, wrong type, unknown field or type
E_PROTO_004 = "E_PROTO_004"  # unknown or duplicate request id on this connection
E_LIMIT_001 = "E_LIMIT_001"  # prompt too large (bytes, or tokens longer than the context)
E_LIMIT_002 = "E_LIMIT_002"  # max_tokens above the server's cap
E_LIMIT_003 = "E_LIMIT_003"  # too many connections
E_LIMIT_004 = "E_LIMIT_004"  # too many requests in flight on this connection
E_MODEL_001 = "E_MODEL_001"  # model problem (no chat template, load failure)
E_RUNTIME_001 = "E_RUNTIME_001"  # decode failure / internal error
E_IO_001 = "E_IO_001"  # output buffer overflow (slow reader dropped) or socket error
E_BUSY_001 = "E_BUSY_001"  # server busy or shutting down
E_IDLE_001 = "E_IDLE_001"  # idle timeout, or a frame that took too long to arrive

MAX_ID_CHARS = 128  # request ids are client-chosen strings of 1..128 characters
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
_INT32_MAX = (1 << 31) - 1  # token ids and top_k end up in C ints


class ProtocolError(UmaError, ValueError):
    """A message broke the protocol.

    `code` is the wire error code (module constants). `request_id` is the message's id when it
    had a valid one, so the server answers that request with an error event and keeps the
    connection; without one the error concerns the connection.
    """

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# Checked in order: subclasses before their bases.
_ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (ContextOverflowError, E_LIMIT_001),
    # The batch or the queue was full this time; the same request may fit later.
    (BatchFullError, E_BUSY_001),
    (EngineBusyError, E_BUSY_001),
    (ClosedError, E_BUSY_001),  # the engine is shutting down
    (ModelBusyError, E_BUSY_001),  # a model with requests, or no room for another
    (EngineFailedError, E_MODEL_001),  # the model's devices are gone (an RPC worker lost)
    (NoChatTemplateError, E_MODEL_001),
    (InvalidRequestError, E_PROTO_003),  # a field's value was rejected
    (ModelLoadError, E_MODEL_001),
)


def error_code_for(exc: BaseException) -> str:
    """The wire code for an exception raised while serving a request. Anything unexpected is
    E_RUNTIME_001 (an internal error)."""
    if isinstance(exc, ProtocolError):
        return exc.code
    for cls, code in _ERROR_CODES:
        if isinstance(exc, cls):
            return code
    return E_RUNTIME_001


def error_message(exc: BaseException) -> str:
    """What a client is told of an exception raised while serving its request: the message of
    one of ours (a UmaError, in the project's words), else only that something failed inside.
    Python's own text ("int too large to convert to C long") names no field the client can
    fix; it is for the server's log."""
    if isinstance(exc, UmaError):
        return str(exc)
    return "internal error (the server's log has the details)"


def error_event_for(request_id: str | None, exc: BaseException) -> dict:
    """The error event answering a request that raised exc."""
    return error_event(request_id, error_code_for(exc), error_message(exc))


# --- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for. The server builds this from its config; setting
    max_prompt_tokens to the context size turns over-long token prompts away before they queue.
    Text prompts are measured in tokens only once tokenized, by the engine (ContextOverflowError,
    also E_LIMIT_001)."""

    max_prompt_bytes: int = 1 << 20  # UTF-8 bytes of "prompt", or of all messages' roles+contents
    max_prompt_tokens: int = 1 << 17  # length of a "tokens" prompt
    max_tokens: int = 4096  # cap on max_tokens: asking for more is E_LIMIT_002, never clamped
    default_max_tokens: int = 256  # max_tokens when a request names none (then capped)

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_prompt_tokens", "max_tokens", "default_max_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise InvalidRequestError(f"{name} must be an integer >= 1, not {value!r}")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """Generate text. Exactly one of prompt, messages and tokens is set."""

    id: str  # client-chosen; echoed in every event of this request
    params: SamplingParams  # sampler options, max_tokens, stop, logprobs, ignore_eos
    priority: Priority
    stream: bool = True  # False: no token events, the whole text in the eos event
    prompt: str | None = None  # raw text, tokenized as is
    messages: tuple[dict[str, Any], ...] | None = None  # chat, rendered with the model's template
    tokens: tuple[int, ...] | None = None  # token ids, fed as is
    app: str | None = None  # who sends it (None: the connection's)
    weight: float | None = None  # its app's weight (None: the app_weights setting's)
    tools: tuple[dict[str, Any], ...] | None = None  # OpenAI's, with messages (uma.tools)
    tool_choice: str | dict[str, Any] | None = None
    # what the output must match (uma.grammar): OpenAI's response_format, or GBNF
    response_format: dict[str, Any] | None = None
    grammar: str | None = None
    model: str | None = None  # a model of the daemon's directory (None: the one it started with)

    @property
    def engine_prompt(self) -> str | tuple[dict[str, Any], ...] | tuple[int, ...]:
        """The prompt in the form uma.Engine.submit takes."""
        if self.prompt is not None:
            return self.prompt
        if self.messages is not None:
            return self.messages
        assert self.tokens is not None  # parse_request sets exactly one
        return self.tokens

    @property
    def quick_to_submit(self) -> bool:
        """Whether submitting it (tokenising, templating) costs less than handing it to a
        worker thread and back, which must wait for the GIL on each side: a short prompt,
        submitted on the I/O thread itself. A long one would hold up every other connection
        there, so it still goes to a worker."""
        if self.response_format is not None or self.grammar is not None:
            return False  # compiling a grammar can take milliseconds
        if self.prompt is not None:
            return len(self.prompt) <= QUICK_PROMPT_CHARS
        if self.messages is not None:
            return self.tools is None and sum(
                len(m.get("content") or "") for m in self.messages) <= QUICK_PROMPT_CHARS
        return True  # token ids: only checked against the vocabulary


QUICK_PROMPT_CHARS = 2048  # tokenised in about a tenth of a millisecond: not worth a thread


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Stop a running request; it ends with an eos event whose reason is 'cancelled'."""

    id: str


@dataclass(frozen=True, slots=True)
class PriorityRequest:
    """Promote or demote a running request."""

    id: str
    priority: Priority


@dataclass(frozen=True, slots=True)
class ConfigureRequest:
    """Set this connection's defaults: generate requests that name no priority get its class
    (an app that only runs background jobs says so once, not on every request), and those
    that name no app its app name (else the connecting process's, e.g. 'python3:4242', or
    where the OS does not tell it the connection's own, e.g. 'conn3')."""

    priority: Priority | None = None
    app: str | None = None


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """Ask for a metrics snapshot."""

    id: str | None = None  # echoed in the answer when given


@dataclass(frozen=True, slots=True)
class ScorecardRequest:
    """Ask for the scorecard (docs/design/metrics.md, "Scorecard")."""

    id: str | None = None  # echoed in the answer when given


@dataclass(frozen=True, slots=True)
class HealthRequest:
    """Ask whether the server is up and what it serves."""

    id: str | None = None  # echoed in the answer when given


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """Text to token ids with the model's tokenizer; answered with a tokens event."""

    id: str
    text: str
    add_special: bool = True  # the BOS token the model adds to a prompt
    parse_special: bool = False  # special-token text (<|im_start|>) as those tokens
    model: str | None = None


@dataclass(frozen=True, slots=True)
class DetokenizeRequest:
    """Token ids to text; answered with a text event."""

    id: str
    tokens: tuple[int, ...]
    model: str | None = None


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Inputs pooled into one vector each (uma.embeddings); answered with an embeddings
    event."""

    id: str
    inputs: tuple[str | list[int], ...]  # texts and token lists
    normalize: bool = True  # unit-length vectors
    model: str | None = None


@dataclass(frozen=True, slots=True)
class StopRequest:
    """Stop the daemon gracefully, as SIGTERM does (`uma stop`); answered with a health event
    (status 'draining'). Only the socket's owner can connect, so only they can stop it."""

    id: str | None = None  # echoed in the answer when given


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """Load a model of the daemon's directory (at once where it is loaded); answered with
    progress events while it loads, then a loaded event. keep_alive_s: how long it stays idle
    before it is unloaded (None: until unloaded; ... the daemon's keep_alive setting)."""

    id: str
    model: str
    keep_alive_s: float | None | EllipsisType = ...


@dataclass(frozen=True, slots=True)
class UnloadRequest:
    """Unload a loaded model, refused (E_BUSY_001) while it has requests; answered with an
    unloaded event."""

    id: str
    model: str


@dataclass(frozen=True, slots=True)
class ModelsRequest:
    """Ask what is loaded (`uma ps`); answered with a models event."""

    id: str | None = None


Request = (GenerateRequest | CancelRequest | PriorityRequest | ConfigureRequest | MetricsRequest
           | ScorecardRequest | HealthRequest | StopRequest | TokenizeRequest | DetokenizeRequest
           | EmbedRequest | LoadRequest | UnloadRequest | ModelsRequest)

MAX_MODEL_CHARS = 256  # a model's name: a listing name, a file's name or a catalogue name

_SAMPLER_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "frequency_penalty",
    "presence_penalty", "penalty_last_n", "seed", "logit_bias",
)
_PROMPT_FIELDS = ("prompt", "messages", "tokens")
_FIELDS = {
    "generate": frozenset({
        "type", "id", *_PROMPT_FIELDS, *_SAMPLER_FIELDS, "max_tokens", "stop", "stream",
        "priority", "logprobs", "top_logprobs", "ignore_eos", "cache_prompt", "parse_special",
        "speculation", "app", "weight",
        "tools",
        "tool_choice", "response_format", "grammar", "model",
    }),
    "cancel": frozenset({"type", "id"}),
    "priority": frozenset({"type", "id", "priority"}),
    "configure": frozenset({"type", "priority", "app"}),
    "metrics": frozenset({"type", "id"}),
    "scorecard": frozenset({"type", "id"}),
    "health": frozenset({"type", "id"}),
    "stop": frozenset({"type", "id"}),
    "tokenize": frozenset({"type", "id", "text", "add_special", "parse_special", "model"}),
    "detokenize": frozenset({"type", "id", "tokens", "model"}),
    "embed": frozenset({"type", "id", "input", "normalize", "model"}),
    "load": frozenset({"type", "id", "model", "keep_alive"}),
    "unload": frozenset({"type", "id", "model"}),
    "ps": frozenset({"type", "id"}),
}


def parse_request(msg: dict, limits: RequestLimits,
                  default_priority: Priority | str = Priority.INTERACTIVE) -> Request:
    """Checks one decoded message and returns the request it makes.

    A field set to nil counts as absent. default_priority is the connection's, for generate
    requests that name none. Raises ProtocolError (E_PROTO_003 for schema errors, E_LIMIT_001
    and E_LIMIT_002 for limits) naming the offending field, with request_id set whenever the
    message had a valid id.
    """
    if not isinstance(msg, dict):
        raise ProtocolError(E_PROTO_001, f"a request must be a map, not {kind_of(msg)}")
    default_priority = Priority.parse(default_priority)  # a bad default is the server's bug
    request_id = _readable_id(msg)
    try:
        kind = msg.get("type")
        if kind is None:
            raise ProtocolError(E_PROTO_003, "missing field 'type'")
        if type(kind) is not str or kind not in _FIELDS:
            raise ProtocolError(E_PROTO_003, f"unknown request type {shown(kind)}; expected "
                                             f"one of {', '.join(_FIELDS)}")
        _check_fields(msg, kind)
        if kind == "generate":
            return _parse_generate(msg, limits, default_priority)
        if kind == "cancel":
            return CancelRequest(_id(msg, required=True))
        if kind == "priority":
            return PriorityRequest(_id(msg, required=True), _required_priority(msg))
        if kind == "configure":
            return _parse_configure(msg)
        if kind == "metrics":
            return MetricsRequest(_id(msg, required=False))
        if kind == "scorecard":
            return ScorecardRequest(_id(msg, required=False))
        if kind == "stop":
            return StopRequest(_id(msg, required=False))
        if kind == "tokenize":
            return _parse_tokenize(msg, limits)
        if kind == "embed":
            return _parse_embed(msg, limits)
        if kind == "detokenize":
            return DetokenizeRequest(_id(msg, required=True), _tokens(msg.get("tokens"), limits),
                                     _model(msg))
        if kind == "load":
            return LoadRequest(_id(msg, required=True), _model(msg, required=True),
                               _keep_alive(msg.get("keep_alive")))
        if kind == "unload":
            return UnloadRequest(_id(msg, required=True), _model(msg, required=True))
        if kind == "ps":
            return ModelsRequest(_id(msg, required=False))
        return HealthRequest(_id(msg, required=False))
    except ProtocolError as exc:
        exc.request_id = request_id
        raise
    except InvalidRequestError as exc:
        # SamplingParams and Priority name the field in their messages.
        raise ProtocolError(E_PROTO_003, str(exc), request_id) from None


def _parse_generate(msg: dict, limits: RequestLimits,
                    default_priority: Priority) -> GenerateRequest:
    request_id = _id(msg, required=True)
    prompt, messages, tokens = _prompt(msg, limits)
    options = {name: msg[name] for name in _SAMPLER_FIELDS if msg.get(name) is not None}
    for name in ("logprobs", "top_logprobs", "ignore_eos", "cache_prompt", "parse_special",
                 "speculation"):
        if msg.get(name) is not None:
            options[name] = msg[name]
    params = SamplingParams(max_tokens=_max_tokens(msg.get("max_tokens"), limits),
                            stop=_stop(msg.get("stop")), **options)
    stream = msg.get("stream")
    if stream is None:
        stream = True
    elif type(stream) is not bool:
        raise ProtocolError(E_PROTO_003, f"stream must be a boolean, not {kind_of(stream)}")
    priority = msg.get("priority")
    tools, choice = msg.get("tools"), msg.get("tool_choice")
    if (tools is not None or choice is not None) and messages is None:
        raise ProtocolError(E_PROTO_003, "tools and tool_choice go with messages")
    if tools is not None:
        tools = tuple(uma_tools.check_tools(tools))
        _check_bytes("tools", len(json.dumps(tools, ensure_ascii=False).encode(
            "utf-8", "surrogatepass")), limits)
    uma_tools.check_tool_choice(choice, tools)
    response_format, grammar = msg.get("response_format"), msg.get("grammar")
    uma_grammar.constraint_of(response_format, grammar)  # the shape; the engine compiles it
    if grammar is not None:
        _check_bytes("grammar", _utf8_len(grammar), limits)
    if response_format is not None:
        _check_bytes("response_format", len(json.dumps(response_format, ensure_ascii=False)
                                             .encode("utf-8", "surrogatepass")), limits)
    return GenerateRequest(
        id=request_id, params=params, stream=stream, prompt=prompt, messages=messages,
        tokens=tokens,
        priority=default_priority if priority is None else _priority(priority),
        app=None if msg.get("app") is None else app_name(msg["app"]),
        weight=None if msg.get("weight") is None else app_weight(msg["weight"]),
        tools=tools, tool_choice=choice, response_format=response_format, grammar=grammar,
        model=_model(msg))


def _parse_tokenize(msg: dict, limits: RequestLimits) -> TokenizeRequest:
    text = msg.get("text")
    if type(text) is not str:
        raise ProtocolError(E_PROTO_003, f"text must be a string, not {kind_of(text)}")
    _check_bytes("text", _utf8_len(text), limits)
    flags = {}
    for name in ("add_special", "parse_special"):
        if msg.get(name) is not None:
            if type(msg[name]) is not bool:
                raise ProtocolError(E_PROTO_003, f"{name} must be a boolean")
            flags[name] = msg[name]
    return TokenizeRequest(_id(msg, required=True), text, **flags, model=_model(msg))


def _parse_embed(msg: dict, limits: RequestLimits) -> EmbedRequest:
    request_id = _id(msg, required=True)
    if msg.get("input") is None:
        raise ProtocolError(E_PROTO_003, "missing field 'input'")
    inputs = uma_embeddings.inputs_of(msg["input"])
    one = type(msg["input"]) is str or not {str, list} & set(map(type, msg["input"]))
    for i, item in enumerate(inputs):
        where = "input" if one else f"input[{i}]"
        if isinstance(item, str):
            _check_bytes(where, _utf8_len(item), limits)
        else:
            _tokens(item, limits, where)
    normalize = msg.get("normalize")
    if normalize is not None and type(normalize) is not bool:
        raise ProtocolError(E_PROTO_003, "normalize must be a boolean")
    return EmbedRequest(request_id, tuple(inputs), True if normalize is None else normalize,
                        _model(msg))


def _model(msg: dict, *, required: bool = False) -> str | None:
    """The model a request names: a name of 1..256 characters (None: the daemon's first)."""
    value = msg.get("model")
    if value is None:
        if required:
            raise ProtocolError(E_PROTO_003, "missing field 'model'")
        return None
    if type(value) is not str or not value or len(value) > MAX_MODEL_CHARS:
        raise ProtocolError(E_PROTO_003, f"model must be a model's name (a string of 1 to "
                                         f"{MAX_MODEL_CHARS} characters), not {shown(value)}")
    return value


def _keep_alive(value: object) -> float | None | EllipsisType:
    """A load's keep_alive: seconds idle before the model is unloaded, a negative number for
    never (Ollama's), nil for the daemon's setting."""
    if value is None:
        return ...
    if type(value) not in (int, float) or value != value or value in (float("inf"), float("-inf")):
        raise ProtocolError(E_PROTO_003, f"keep_alive must be a number of seconds (negative: "
                                         f"until unloaded), not {shown(value)}")
    return None if value < 0 else float(value)


def _parse_configure(msg: dict) -> ConfigureRequest:
    priority, app = msg.get("priority"), msg.get("app")
    if priority is None and app is None:
        raise ProtocolError(E_PROTO_003, "a configure request needs priority, app or both")
    return ConfigureRequest(None if priority is None else _priority(priority),
                            None if app is None else app_name(app))


def _prompt(msg: dict, limits: RequestLimits) -> tuple[
        str | None, tuple[dict[str, str], ...] | None, tuple[int, ...] | None]:
    given = [name for name in _PROMPT_FIELDS if msg.get(name) is not None]
    if len(given) != 1:
        found = f"; got {' and '.join(given)}" if given else ""
        raise ProtocolError(
            E_PROTO_003, f"a generate request needs exactly one of prompt, messages and "
                         f"tokens{found}")
    if given[0] == "prompt":
        prompt = msg["prompt"]
        if type(prompt) is not str:
            raise ProtocolError(E_PROTO_003,
                                f"prompt must be a string, not {kind_of(prompt)}")
        _check_bytes("prompt", _utf8_len(prompt), limits)
        return prompt, None, None
    if given[0] == "messages":
        return None, _messages(msg["messages"], limits), None
    return None, None, _tokens(msg["tokens"], limits)


def _messages(value: object, limits: RequestLimits) -> tuple[dict[str, Any], ...]:
    if type(value) is not list:
        raise ProtocolError(E_PROTO_003, f"messages must be a list of {{role, content}} maps, "
                                         f"not {kind_of(value)}")
    messages = templates.checked_messages(value)  # InvalidRequestError: E_PROTO_003
    # Roles count too, or an endless "role" would slip past the limit.
    _check_bytes("messages", templates.message_bytes(messages), limits)
    return tuple(messages)


def _tokens(value: object, limits: RequestLimits, name: str = "tokens") -> tuple[int, ...]:
    """Token ids as every door takes them: each an integer a C int holds (the vocabulary is
    the engine's to check), at most max_prompt_tokens of them."""
    if type(value) is not list:
        raise ProtocolError(E_PROTO_003,
                            f"{name} must be a list of integers, not {kind_of(value)}")
    if len(value) > limits.max_prompt_tokens:
        raise ProtocolError(E_LIMIT_001, f"{name} has {len(value)} ids; this server takes at "
                                         f"most {limits.max_prompt_tokens}")
    # set(map(type, ...)) runs in C: prompts can hold 100k ids. `type is int` also rejects
    # booleans, which are ints to isinstance.
    if value and (set(map(type, value)) != {int} or min(value) < 0 or max(value) > _INT32_MAX):
        for i, token in enumerate(value):
            if type(token) is not int:
                raise ProtocolError(E_PROTO_003, f"{name}[{i}] must be an integer, "
                                                 f"not {kind_of(token)}")
            if not 0 <= token <= _INT32_MAX:
                raise ProtocolError(E_PROTO_003, f"{name}[{i}] must be a token id, in [0, "
                                                 f"{_INT32_MAX}], not {shown(token)}")
    return tuple(value)


def _max_tokens(value: object, limits: RequestLimits) -> int:
    if value is None:
        return min(limits.default_max_tokens, limits.max_tokens)
    if type(value) is not int:
        raise ProtocolError(E_PROTO_003,
                            f"max_tokens must be an integer, not {kind_of(value)}")
    if value > limits.max_tokens:
        raise ProtocolError(E_LIMIT_002, f"max_tokens is {shown(value)}; this server allows at "
                                         f"most {limits.max_tokens}")
    return value  # SamplingParams rejects values below 1


def _stop(value: object) -> tuple[object, ...]:
    if value is None:
        return ()
    if type(value) is str:
        strings = [value]
    elif type(value) is list:
        strings = value
    else:
        raise ProtocolError(E_PROTO_003, f"stop must be a string or a list of strings, "
                                         f"not {kind_of(value)}")
    if len(strings) > MAX_STOP_STRINGS:
        raise ProtocolError(E_PROTO_003, f"stop has {len(strings)} strings; at most "
                                         f"{MAX_STOP_STRINGS} are allowed")
    for i, s in enumerate(strings):
        if type(s) is str and len(s) > MAX_STOP_CHARS:
            raise ProtocolError(E_PROTO_003, f"stop[{i}] has {len(s)} characters; at most "
                                             f"{MAX_STOP_CHARS} are allowed")
    return tuple(strings)  # SamplingParams checks the element types and rejects ""


def _required_priority(msg: dict) -> Priority:
    priority = msg.get("priority")
    if priority is None:
        raise ProtocolError(E_PROTO_003, "missing field 'priority'")
    return _priority(priority)


def _priority(value: object) -> Priority:
    if type(value) is not str:
        raise ProtocolError(E_PROTO_003, f"priority must be 'interactive' or 'background', "
                                         f"not {kind_of(value)}")
    return Priority.parse(value)


def _readable_id(msg: dict) -> str | None:
    request_id = msg.get("id")
    if type(request_id) is str and 0 < len(request_id) <= MAX_ID_CHARS:
        return request_id
    return None


def _id(msg: dict, *, required: bool) -> str | None:
    # Ids are strings only: an int id would come back as a string (or need a type-preserving
    # echo), and a client matching events by id would then miss them.
    request_id = msg.get("id")
    if request_id is None:
        if required:
            raise ProtocolError(E_PROTO_003, "missing field 'id'")
        return None
    if type(request_id) is not str:
        raise ProtocolError(E_PROTO_003, f"id must be a string, not {kind_of(request_id)}")
    if not 0 < len(request_id) <= MAX_ID_CHARS:
        raise ProtocolError(E_PROTO_003, f"id must have 1 to {MAX_ID_CHARS} characters, not "
                                         f"{len(request_id)}")
    return request_id


def _check_fields(msg: dict, kind: str) -> None:
    allowed = _FIELDS[kind]
    for key in msg:
        if key not in allowed:
            hint = ""
            if type(key) is str:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ProtocolError(E_PROTO_003,
                                f"unknown field {shown(key)} in a {kind} request{hint}")


def _check_bytes(name: str, n_bytes: int, limits: RequestLimits) -> None:
    if n_bytes > limits.max_prompt_bytes:
        raise ProtocolError(E_LIMIT_001, f"{name} is {n_bytes} bytes of UTF-8; this server "
                                         f"takes at most {limits.max_prompt_bytes}")


def _utf8_len(text: str) -> int:
    # surrogatepass: no lone surrogate comes through a door (msgpack strings are UTF-8, and
    # HTTP refuses them in openai_api.body_of), but a caller in-process may hand one; here it
    # only needs measuring.
    return len(text.encode("utf-8", "surrogatepass"))


# --- events ------------------------------------------------------------------------------------
# Plain dicts, built once per token: no validation here, the server passes its own values.

EVENTS = frozenset({"token", "eos", "error", "metrics", "scorecard", "health", "tokens",
                    "text", "embeddings", "progress", "loaded", "unloaded", "models"})
_EVENT_FIELDS = {
    "token": ("id", "text", "token_ids"),
    "eos": ("id", "reason", "usage", "timings"),
    "error": ("id", "code", "message"),
    "metrics": ("id", "metrics"),
    "scorecard": ("id", "scorecard"),
    "health": ("id", "health"),
    "tokens": ("id", "tokens"),
    "text": ("id", "text"),
    "embeddings": ("id", "embeddings", "usage", "pooling"),
    "progress": ("id", "progress"),
    "loaded": ("id", "loaded"),
    "unloaded": ("id", "unloaded"),
    "models": ("id", "models"),
}


def token_event(request_id: str, text: str, token_ids: Sequence[int],
                logprobs: Sequence[float] | None = None,
                top_logprobs: Sequence[TopLogprobs] | None = None) -> dict:
    """New output of a streaming request: the tokens sampled since its last event and the text
    they completed ('' while a character or a possible stop string is pending); with
    logprobs, each token's log-probability, and with top_logprobs each step's most probable
    tokens as [[id, logprob], ...]."""
    event = {"event": "token", "id": request_id, "text": text, "token_ids": token_ids}
    if logprobs is not None:
        event["logprobs"] = logprobs
    if top_logprobs is not None:
        event["top_logprobs"] = top_logprobs
    return event


def eos_event(request_id: str, reason: str, usage: dict, timings: dict,
              text: str | None = None, tool_calls: Sequence[ToolCall] = (),
              content: str | None = None, token_ids: Sequence[int] | None = None,
              logprobs: Sequence[float] | None = None,
              top_logprobs: Sequence[TopLogprobs] | None = None) -> dict:
    """The end of a request: reason 'stop', 'length', 'tool_calls', 'cancelled' or 'error'.
    text (the whole output), token_ids and what was asked of logprobs and top_logprobs only
    for stream=false requests (a stream had them in its token events); with tool calls,
    tool_calls ([{id, name, arguments}]) and content (the text outside them)."""
    event = {"event": "eos", "id": request_id, "reason": reason, "usage": usage,
             "timings": timings}
    if text is not None:
        event["text"] = text
    if token_ids is not None:
        event["token_ids"] = token_ids
    if logprobs is not None:
        event["logprobs"] = logprobs
    if top_logprobs is not None:
        event["top_logprobs"] = top_logprobs
    if tool_calls:
        event["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                               for c in tool_calls]
        event["content"] = content
    return event


def error_event(request_id: str | None, code: str, message: str) -> dict:
    """A failure: of one request when request_id is set, of the connection when it is None."""
    return {"event": "error", "id": request_id, "code": code, "message": message}


def metrics_event(request_id: str | None, snapshot: dict) -> dict:
    """The answer to a metrics request."""
    return {"event": "metrics", "id": request_id, "metrics": snapshot}


def scorecard_event(request_id: str | None, card: dict) -> dict:
    """The answer to a scorecard request."""
    return {"event": "scorecard", "id": request_id, "scorecard": card}


def tokens_event(request_id: str, tokens: Sequence[int]) -> dict:
    """The answer to a tokenize request."""
    return {"event": "tokens", "id": request_id, "tokens": list(tokens)}


def text_event(request_id: str, text: str) -> dict:
    """The answer to a detokenize request."""
    return {"event": "text", "id": request_id, "text": text}


def embeddings_event(request_id: str, result: Embeddings) -> dict:
    """The answer to an embed request: one list of floats per input, in order."""
    return {"event": "embeddings", "id": request_id, "embeddings": result.vectors.tolist(),
            "usage": {"prompt_tokens": result.prompt_tokens}, "pooling": result.pooling}


def progress_event(request_id: str, fraction: float) -> dict:
    """How far a load request's model has loaded (0..1); its loaded event follows."""
    return {"event": "progress", "id": request_id, "progress": fraction}


def loaded_event(request_id: str, model: dict) -> dict:
    """The answer to a load request: the model as a models event lists it, and load_ms (0
    where it was loaded already)."""
    return {"event": "loaded", "id": request_id, "loaded": model}


def unloaded_event(request_id: str, name: str) -> dict:
    """The answer to an unload request: the model's name."""
    return {"event": "unloaded", "id": request_id, "unloaded": name}


def models_event(request_id: str | None, models: Sequence[dict]) -> dict:
    """The answer to a ps request: the loaded models, the most recently used first."""
    return {"event": "models", "id": request_id, "models": list(models)}


def health_event(request_id: str | None, info: dict) -> dict:
    """The answer to a health request."""
    return {"event": "health", "id": request_id, "health": info}


def parse_event(msg: dict) -> dict:
    """The client's check of a decoded event: a known "event" with its fields present.
    Returns msg itself; raises ProtocolError(E_PROTO_003) otherwise."""
    if not isinstance(msg, dict):
        raise ProtocolError(E_PROTO_001, f"an event must be a map, not {kind_of(msg)}")
    request_id = _readable_id(msg)
    kind = msg.get("event")
    fields = _EVENT_FIELDS.get(kind) if type(kind) is str else None
    if fields is None:
        if "event" not in msg:
            raise ProtocolError(E_PROTO_003, "missing field 'event'", request_id)
        raise ProtocolError(E_PROTO_003, f"unknown event {shown(msg['event'])}; expected one "
                                         f"of {', '.join(sorted(EVENTS))}", request_id)
    for name in fields:
        if name not in msg:
            raise ProtocolError(E_PROTO_003, f"missing field {name!r} in a {kind} event",
                                request_id)
    return msg
