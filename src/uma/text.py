"""Token ids to text, one token at a time, without ever emitting half a character.

A token's bytes may end in the middle of a UTF-8 sequence (byte-fallback tokens, CJK, emoji).
The stream holds those bytes back until the character completes, using the standard library's
incremental UTF-8 decoder, so every piece it returns is valid text.
"""

from __future__ import annotations

import codecs
from typing import Protocol


class _HasPieces(Protocol):
    def token_to_piece(self, token: int, *, special: bool = False) -> bytes: ...


class TextStream:
    """Incremental detokenizer for one sequence."""

    __slots__ = ("_decoder", "_piece", "_special")

    def __init__(self, model: _HasPieces, *, special: bool = False) -> None:
        self._piece = model.token_to_piece
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        """The text that became complete with this token ('' while a character is pending)."""
        return self._decoder.decode(self._piece(token, special=self._special))

    def flush(self) -> str:
        """Ends the stream: bytes of an unfinished character become U+FFFD."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text, across token boundaries, and never lets any part of
    one out: text that could still become a stop string is held back until it cannot."""

    __slots__ = ("_held", "_longest", "_stops")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._longest = max((len(s) for s in stops), default=0)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached). After a stop, the
        text before it is returned and everything after is dropped."""
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = self._pending_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held text, released when the stream ends without reaching a stop string."""
        held, self._held = self._held, ""
        return held

    def _pending_suffix(self, buf: str) -> int:
        # The longest end of buf that is the start of some stop string.
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
