"""The one error tree of UMA Serve.

Every failure a user can see is a :class:`UmaError`. What the caller caused (a bad request, a
bad model file) also subclasses the matching built-in (``ValueError``, ``FileNotFoundError``),
so generic handlers keep working; internal faults do not. The daemon maps each class to the
wire code of its ``error`` events in one place, uma.wire.protocol.error_code_for.

A message is for people and in the project's own words: `kind_of` and `shown` name and quote
what a caller sent (a type as JSON and msgpack call it, never Python's ``NoneType``; a value
cut to a short prefix, never a 100 KB name echoed whole).
"""

from __future__ import annotations


class UmaError(Exception):
    """Base of every UMA Serve error."""


# --- what the caller caused ------------------------------------------------------------------


class InvalidRequestError(UmaError, ValueError):
    """A request, parameter or input that can never succeed as given."""


class InvalidTokenError(InvalidRequestError):
    """A token id outside the model's vocabulary."""


class BatchFullError(InvalidRequestError):
    """More tokens than the batch (or the context's n_batch) holds."""


class ContextOverflowError(InvalidRequestError):
    """A sequence would grow past the context window (a prompt longer than the context)."""


class EngineBusyError(UmaError):
    """Too many requests are already waiting; try again later."""


class ModelBusyError(UmaError):
    """A model with requests queued or running cannot be unloaded, nor pushed out to make
    room for another."""


class ModelsFullError(ModelBusyError):
    """No other model can be loaded now: as many as allowed are, and every one has
    requests."""


class NoChatTemplateError(InvalidRequestError):
    """The model has no chat template (and none was given), so chat messages cannot be
    rendered."""


class ModelLoadError(UmaError):
    """The model could not be loaded."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model path does not exist."""


class InvalidModelError(ModelLoadError, ValueError):
    """The file is not a GGUF llama.cpp can load (wrong magic, truncated, unsupported)."""


# --- runtime faults ------------------------------------------------------------------------


class DecodeError(UmaError):
    """llama_decode failed."""

    def __init__(self, message: str, rc: int = 0) -> None:
        super().__init__(message)
        self.rc = rc


class NoKVSlotError(DecodeError):
    """No room in the KV cache for the batch (rc 1). Recoverable: shrink the batch, or free or
    preempt a sequence, and decode again; the cache is as it was before the call."""


class DecodeAbortedError(DecodeError):
    """The decode was aborted by its abort callback (rc 2)."""


class InvalidBatchError(DecodeError, ValueError):
    """llama.cpp rejected the batch (rc -1): positions or sequence ids out of order."""


class LogitsInUseError(UmaError, BufferError):
    """A zero-copy logits view from the previous decode is still alive.

    The next decode overwrites that memory, so it refuses to run until the view is dropped (or
    copied with ``numpy.array(view)``)."""


class ClosedError(UmaError, RuntimeError):
    """The object was closed and can no longer be used."""


class EngineFailedError(UmaError):
    """The engine stopped for good (its compute thread was held by a ggml abort, as when an
    RPC worker is lost): nothing more is served until it is restarted."""


def decode_error(rc: int, detail: str = "") -> DecodeError:
    """Translates a llama_decode return code (llama.h) into the matching exception."""
    suffix = f": {detail}" if detail else ""
    if rc == 1:
        return NoKVSlotError(f"no KV cache slot for the batch{suffix}", rc)
    if rc == 2:
        return DecodeAbortedError(f"decode aborted{suffix}", rc)
    if rc == -1:
        return InvalidBatchError(f"llama.cpp rejected the batch{suffix}", rc)
    return DecodeError(f"llama_decode failed with code {rc}{suffix}", rc)


# --- the words of messages -----------------------------------------------------------------

SHOWN_CHARS = 64  # of a string a message quotes


def kind_of(value: object) -> str:
    """What a value is, in the words of JSON and msgpack: 'null', 'a string', 'a map', ..."""
    kind = _KINDS.get(type(value))
    return kind if kind is not None else f"a {type(value).__name__}"  # only from Python callers


def shown(value: object) -> str:
    """A value a caller sent, as a message quotes it: a string cut to SHOWN_CHARS characters
    (repr, so control characters and lone surrogates show as escapes), an integer of more than
    64 bits by its size, a container by its kind (its repr may be huge)."""
    kind = type(value)
    if kind in (str, bytes):
        return repr(value) if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS - 3]!r}..."
    if kind is int:
        return repr(value) if value.bit_length() <= 64 else \
            f"an integer of {value.bit_length()} bits"
    if kind is float:
        return repr(value)
    if value is None or kind is bool:
        return {None: "null", True: "true", False: "false"}[value]
    return kind_of(value)


_KINDS: dict[type, str] = {
    type(None): "null", bool: "a boolean", int: "an integer", float: "a number",
    str: "a string", bytes: "binary data", list: "a list", tuple: "a list", dict: "a map",
}
