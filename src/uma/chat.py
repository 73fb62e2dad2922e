"""`uma chat`: a streaming conversation with the daemon's model in the terminal.

The whole history is sent each turn as chat messages, which the daemon renders with the model's
chat template. Lines come from any text stream (a terminal, with readline's editing and
history when it is one; a pipe, for scripts and tests).
"""

from __future__ import annotations

import contextlib
from typing import TextIO

from uma.client import Client

HELP = "commands: /reset forgets the conversation, /exit (or Ctrl-D) leaves, Ctrl-C stops an answer"


class ChatSession:
    """One conversation: its messages and how answers are sampled."""

    def __init__(self, client: Client, *, system: str | None = None, **sampling) -> None:
        self.client = client
        self.system = system
        self.sampling = sampling
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def ask(self, text: str, out: TextIO) -> str:
        """Sends one user turn, streams the answer to `out`, keeps both in the history. Ctrl-C
        stops the answer (what came so far is kept)."""
        self.messages.append({"role": "user", "content": text})
        stream = self.client.submit(list(self.messages), **self.sampling)
        parts = []
        try:
            for event in stream:
                parts.append(event.text)
                out.write(event.text)
                out.flush()
        except KeyboardInterrupt:
            stream.cancel()
            with contextlib.suppress(Exception):
                stream.result()
        out.write("\n")
        answer = "".join(parts)
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def repl(self, lines: TextIO, out: TextIO) -> int:
        """Reads turns until /exit or the end of input; returns the exit code."""
        interactive = lines.isatty()
        if interactive:
            with contextlib.suppress(ImportError):
                import readline  # noqa: F401 - line editing and history for input()
            model = self.client.health().get("model", "the model")
            out.write(f"chatting with {model}; {HELP}\n")
        while True:
            try:
                line = input("you> ") if interactive else (lines.readline() or None)
            except EOFError:  # Ctrl-D
                line = None
            except KeyboardInterrupt:
                out.write("\n")
                continue
            if line is None:  # the end of input
                if interactive:
                    out.write("\n")
                return 0
            text = line.strip()
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                self.reset()
                out.write("(conversation reset)\n")
            elif text in ("/help", "/?"):
                out.write(HELP + "\n")
            elif text:
                if interactive:
                    out.write("uma> ")
                self.ask(text, out)
