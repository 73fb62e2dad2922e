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
