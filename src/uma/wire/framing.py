"""Length-prefixed msgpack frames: ``uint32 little-endian length | msgpack map``, both ways.

Pure: no sockets, no clocks. The poller only moves bytes; `FrameDecoder.feed` turns whatever
arrived into whole messages and `encode` turns a message into bytes to send (the split asyncpg
makes in ``protocol/coreproto.pyx::_read_server_messages``). What the maps mean is
uma.wire.protocol's business.

A frame that breaks the format breaks the stream: after a bad length there is no way to find the
next frame boundary, so the decoder refuses all further input and the server drops the
connection with the error's code.
"""

from __future__ import annotations

import struct
import threading

import msgpack

from uma.errors import kind_of
from uma.wire.protocol import E_PROTO_001, E_PROTO_002, ProtocolError

DEFAULT_MAX_FRAME = 16 << 20  # bytes of msgpack in one frame; ample for a 1 MiB prompt
MAX_DEPTH = 32  # nested maps/arrays in one message; ours need 3 (request > messages > message)
_MAX_LENGTH = 0xFFFF_FFFF  # what the uint32 length prefix can say

_HEADER = struct.Struct("<I")
_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list})


class FrameError(ProtocolError):
    """The byte stream is not a valid sequence of frames (code E_PROTO_001 or E_PROTO_002).

    Fatal for the connection. `messages` holds the messages that were complete before the bad
    frame in the same feed() call, so the server may still act on them (a cancel, say)."""

    def __init__(self, code: str, message: str, messages: list[dict] | None = None) -> None:
        super().__init__(code, message)
        self.messages = messages if messages is not None else []


class FrameDecoder:
    """Splits a byte stream into messages. feed() whatever arrived, in pieces of any size."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if type(max_frame) is not int or not 0 < max_frame <= _MAX_LENGTH:
            raise ValueError(
                f"max_frame must be an integer in [1, {_MAX_LENGTH}], not {max_frame!r}")
        self.max_frame = max_frame
        # Unconsumed bytes are buf[pos:]. Consuming only moves pos; the consumed prefix is cut
        # off once it is at least half the buffer, so each byte is copied O(1) times however
        # small the feeds are.
        self._buf = bytearray()
        self._pos = 0
        self._failure: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a returned message."""
        return len(self._buf) - self._pos

    @property
    def pending(self) -> int:
        """What the buffer will hold once the frame in progress is complete: its length
        prefix and body, or the bytes buffered while the prefix is still incomplete (0 between
        frames). A server budgets memory by this before the body arrives."""
        buffered = len(self._buf) - self._pos
        if buffered < 4:
            return buffered
        return max(buffered, 4 + _HEADER.unpack_from(self._buf, self._pos)[0])

    def feed(self, data: bytes | bytearray | memoryview) -> list[dict]:
        """Takes the next bytes of the stream and returns every message they complete.

        Raises FrameError (and only FrameError, whatever the bytes) when the stream breaks the
        format; from then on every call raises it again.
        """
        if self._failure is not None:
            raise FrameError(
                self._failure.code, f"the stream is unusable after an earlier error: "
                f"{self._failure.message}")
        buf = self._buf
        buf += data
        messages: list[dict] = []
        pos, end = self._pos, len(buf)
        try:
            with memoryview(buf) as view:
                while end - pos >= 4:
                    (size,) = _HEADER.unpack_from(buf, pos)
                    # Checked before waiting for the body: a client must not make us buffer up
                    # to 4 GiB on the strength of four bytes.
                    if not 0 < size <= self.max_frame:
                        raise FrameError(E_PROTO_002, f"frame length {size} is outside "
                                                      f"[1, {self.max_frame}]")
                    if end - pos - 4 < size:
                        break
                    start, pos = pos + 4, pos + 4 + size
                    messages.append(decode_body(view[start:pos]))
        except FrameError as exc:
            exc.messages = messages
            self._failure = exc
            # Drop the buffer (a traceback may still hold a view of it) and its memory.
            self._buf, self._pos = bytearray(), 0
            raise
        if pos == end:
            buf.clear()
            pos = 0
        elif pos * 2 >= end:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return messages


def decode_body(body: bytes | bytearray | memoryview) -> dict:
    """Decodes one frame's body (without its length prefix) into a message map.

    Raises FrameError(E_PROTO_001) unless the body is exactly one msgpack map whose keys are
    all strings, nested at most MAX_DEPTH deep, holding only nil, booleans, numbers, strings,
    binary, arrays and maps (no ext types).
    """
    size = len(body)
    try:
        # The max_*_len limits stop a 5-byte array header from claiming 4 billion elements;
        # nothing in a frame can be longer than the frame itself.
        message = msgpack.unpackb(
            body, raw=False, strict_map_key=True, max_str_len=size, max_bin_len=size,
            max_array_len=size, max_map_len=size // 2, max_ext_len=size)
    except Exception as exc:
        # unpackb raises ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError
        # and, its docstring says, "other exceptions"; none of them may escape as anything but
        # a FrameError. `from None` so the error holds no reference to the buffer.
        raise FrameError(E_PROTO_001, f"invalid msgpack: {_explain(exc)}") from None
    _check_shape(message)
    return message


def _explain(exc: Exception) -> str:
    if isinstance(exc, msgpack.ExtraData):
        return "bytes left over after the msgpack object"
    if isinstance(exc, (msgpack.StackError, RecursionError)):
        return "nested too deep"
    if isinstance(exc, msgpack.FormatError):
        return "not msgpack"
    if isinstance(exc, UnicodeDecodeError):
        return "a string is not valid UTF-8"
    if "map key" in str(exc):  # strict_map_key's ValueError: "int is not allowed for map key"
        return "map keys must be strings"
    if "incomplete input" in str(exc):
        return "the frame ends inside a msgpack object"
    if "exceeds max_" in str(exc):  # "4294967295 exceeds max_array_len(5)"
        return "a string or array claims more bytes than the frame holds"
    return "not msgpack"  # unpackb's "other exceptions": its words are not for clients


def _check_shape(message: object) -> None:
    # msgpack's own guard (a C stack of 1024 containers) lets through messages deep enough to
    # make repr() raise RecursionError, so depth is bounded here, along with key and value
    # types, in one pass over the containers.
    if type(message) is not dict:
        raise FrameError(E_PROTO_001, f"a frame must hold a msgpack map, "
                                      f"not {kind_of(message)}")
    stack: list[tuple[dict | list, int]] = [(message, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            for key in node:
                if type(key) is not str:
                    raise FrameError(E_PROTO_001, f"map keys must be strings, not "
                                                  f"{kind_of(key)}")
            values = node.values()
        else:
            values = node
        for value in values:
            kind = type(value)
            if kind in _CONTAINERS:
                if depth >= MAX_DEPTH:
                    raise FrameError(E_PROTO_001, f"nested more than {MAX_DEPTH} deep")
                stack.append((value, depth + 1))
            elif kind not in _SCALARS:
                raise FrameError(E_PROTO_001, "msgpack extension types are not supported")


_local = threading.local()


def encode(message: dict) -> bytes:
    """The frame carrying message: its msgpack length, then the msgpack map.

    Raises TypeError for a value msgpack cannot pack and ValueError for a message too big for
    the length prefix. Safe to call from any thread.
    """
    if not isinstance(message, dict):
        raise TypeError(f"a message must be a dict, not {type(message).__name__}")
    # One Packer per thread: reusing it skips buffer setup on every token event, and a Packer
    # is not safe to share between threads.
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    body = packer.pack(message)
    if len(body) > _MAX_LENGTH:
        raise ValueError(f"message is {len(body)} bytes; a frame holds at most {_MAX_LENGTH}")
    return _HEADER.pack(len(body)) + body
