"""Tool calling, as OpenAI clients send it: `tools` and `tool_choice` checked, rendered into the
chat template (or, for a template that takes no tools, into a system message), and the
model's tool calls parsed back out of its text. No I/O.

Models write calls in their own formats; the template says which (`format_of`):

* hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen 2.5/3, Hermes 2/3)
* llama3: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>` (Llama 3.x)
* mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`, or `[TOOL_CALLS]name[ARGS]{...}`
* generic: the whole answer is a JSON call, a list of them, or {"tool_calls": [...]}, maybe
  in a ```json fence (what the system message asks a template without tools for)

`ToolStream` decides, delta by delta, what text can go to the client as content at once and
what must wait until the answer ends because it may be a call.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uma.errors import InvalidRequestError, shown

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
FORMATS = ("hermes", "llama3", "mistral", "generic")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: its function's name and arguments (a JSON object's text)."""

    name: str
    arguments: str
    id: str = ""

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


# --- requests ---------------------------------------------------------------------------------

def check_tools(tools: object) -> list[dict[str, Any]]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}} (empty: none, as some clients send); InvalidRequestError
    naming the first bad field otherwise."""
    if type(tools) is not list:
        raise InvalidRequestError("tools must be a list")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"tools may hold at most {MAX_TOOLS} functions")
    seen = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if type(tool) is not dict or tool.get("type") != "function":
            raise InvalidRequestError(f"{where} must be {{'type': 'function', 'function': ...}}")
        fn = tool.get("function")
        if type(fn) is not dict:
            raise InvalidRequestError(f"{where}.function must be an object")
        name = fn.get("name")
        if type(name) is not str or not _NAME.fullmatch(name):
            raise InvalidRequestError(f"{where}.function.name must be 1-64 letters, digits, "
                                      f"_ . or -, not {shown(name)}")
        if name in seen:
            raise InvalidRequestError(f"{where}.function.name {name!r} is given twice")
        seen.add(name)
        if fn.get("description") is not None and type(fn["description"]) is not str:
            raise InvalidRequestError(f"{where}.function.description must be a string")
        if fn.get("parameters") is not None and type(fn["parameters"]) is not dict:
            raise InvalidRequestError(f"{where}.function.parameters must be a JSON schema object")
    return tools


def check_tool_choice(choice: object, tools: Sequence[Mapping[str, Any]] | None) -> str | None:
    """OpenAI's `tool_choice`: 'none', 'auto' or 'required', or {"type": "function",
    "function": {"name": ...}} naming one of `tools`. Returns 'none', 'auto', 'required' or
    the function's name (None: not given)."""
    if choice is None:
        return None
    names = [t["function"]["name"] for t in tools or ()]
    if choice in ("none", "auto", "required"):
        if choice == "required" and not names:
            raise InvalidRequestError("tool_choice 'required' needs tools")
        return str(choice)
    fn = choice.get("function") if type(choice) is dict and choice.get("type") == "function" \
        else None
    name = fn.get("name") if type(fn) is dict else None
    if type(name) is not str:
        raise InvalidRequestError("tool_choice must be 'none', 'auto', 'required' or "
                                  "{'type': 'function', 'function': {'name': ...}}")
    if name not in names:
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools")
    return name


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: an assistant's tool calls with their arguments
    as objects (OpenAI sends them as JSON text; templates write them with tojson)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if not calls:
            out.append(dict(m))
            continue
        fixed = []
        for call in calls:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                with contextlib.suppress(ValueError):  # else the template gets the text
                    fn["arguments"] = json.loads(fn["arguments"])
            fixed.append({**call, "function": fn})
        out.append({**m, "tool_calls": fixed})
    return out


def system_prompt(tools: Sequence[Mapping[str, Any]], choice: str | None) -> str:
    """For a template that takes no tools: the tools and how to call them, as a system message
    (the generic format)."""
    specs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    must = "You must call one of them." if choice == "required" else \
        f"You must call {choice}." if choice not in (None, "auto", "required") else \
        "Call one only when it helps; otherwise answer in plain text."
    return ("You can call these functions:\n" + specs + "\n\n" + must + " To call a function, "
            'answer with only a JSON object: {"name": <function name>, "arguments": '
            "<an object of its arguments>}.")


def as_plain_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template that knows no tools: an assistant's calls as the JSON text the system
    message asks for, and a tool's result as a user turn saying whose result it is."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": c["function"].get("arguments", {})} for c in m["tool_calls"]]
            text = "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)
            m = {"role": m["role"], "content": (m.get("content") or "") + text}
        elif m.get("role") == "tool":
            m = {"role": "user", "content": json.dumps(
                {"tool_response": {"tool_call_id": m.get("tool_call_id"),
                                   "content": m.get("content")}}, ensure_ascii=False)}
        out.append(m)
    return out


def with_system_prompt(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` at the head of the system message (one is added where there is none)."""
    if messages and messages[0].get("role") == "system" and isinstance(
            messages[0].get("content"), str):
        return [{**messages[0], "content": text + "\n\n" + messages[0]["content"]},
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def format_of(template_source: str) -> str:
    """The tool-call format a chat template's model writes (see the module docstring)."""
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or (
            "<|start_header_id|>" in template_source and "tools" in template_source):
        return "llama3"
    return "generic"


def takes_tools(template_source: str) -> bool:
    """Whether the template writes the tools itself (else they go in a system message)."""
    return re.search(r"\btools\b", template_source) is not None


# --- answers ----------------------------------------------------------------------------------

def parse(text: str, fmt: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a finished answer. Text that does not parse as a call in `fmt`
    stays content: a model may always answer in plain text."""
    if fmt == "hermes":
        calls, rest = [], text
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S):
            call = _call(_json(m.group(1)))
            if call is None:
                return text, []
            calls.append(call)
        if calls:
            rest = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.S)
        return rest.strip(), calls
    if fmt == "mistral":
        head, marker, tail = text.partition("[TOOL_CALLS]")
        if not marker:
            return text, []
        calls = _calls(_json(tail.strip()))
        if not calls:  # the newer form: [TOOL_CALLS]name[ARGS]{...}, repeated
            for part in tail.split("[TOOL_CALLS]"):
                name, sep, args = part.partition("[ARGS]")
                call = _call({"name": name.strip(), "arguments": _json(args.strip())}) \
                    if sep else None
                if call is None:
                    return text, []
                calls.append(call)
        return (head.strip(), calls) if calls else (text, [])
    body = text.strip()
    if fmt == "llama3":
        body = body.removeprefix("<|python_tag|>").strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    if fence:
        body = fence.group(1)
    if fmt == "llama3" and ";" in body and not body.startswith("["):
        parts = [_json(p) for p in body.split(";") if p.strip()]
        calls = [c for c in (_call(p) for p in parts) if c is not None]
        return ("", calls) if calls and len(calls) == len(parts) else (text, [])
    calls = _calls(_json(body))
    return ("", calls) if calls else (text, [])


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _calls(value: Any) -> list[ToolCall]:
    """A call, a list of calls, or {"tool_calls": [...]}; [] unless every one is a call."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    calls = [_call(v) for v in items]
    return [c for c in calls if c is not None] if calls and None not in calls else []


def _call(value: Any) -> ToolCall | None:
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]  # an OpenAI-shaped call
    if not isinstance(value, dict) or type(value.get("name")) is not str:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        args = _json(args)
    if not isinstance(args, dict):
        return None
    return ToolCall(value["name"], json.dumps(args, ensure_ascii=False),
                    "call_" + secrets.token_hex(12))


# --- streaming --------------------------------------------------------------------------------

_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}


class ToolStream:
    """What of a streamed answer can go out as content now. For formats with a marker, text
    before it goes at once (less a tail that could be the marker's start); from the marker on,
    everything waits. For the JSON formats, an answer starting like JSON waits whole."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.text = ""  # the answer so far
        self.sent = 0  # of it, characters sent as content
        self.held = False  # a call has begun: nothing more goes out until the end

    def feed(self, delta: str) -> str:
        """The content to send now, after `delta`."""
        self.text += delta
        if self.held:
            return ""
        marker = _MARKERS.get(self.fmt)
        if marker is None:
            start = self.text.lstrip()
            if not start:
                return ""
            if start[0] in "{[`" or start.startswith("<|python_tag|>"[:len(start)]):
                self.held = True
                return ""
            return self._send(len(self.text))
        at = self.text.find(marker, self.sent)
        if at >= 0:
            self.held = True
            return self._send(at)
        # keep back a tail that may be the start of the marker
        keep = next((k for k in range(min(len(marker) - 1, len(self.text)), 0, -1)
                     if marker.startswith(self.text[-k:])), 0)
        return self._send(len(self.text) - keep)

    def finish(self, content: str | None) -> str:
        """At the end: the content not sent yet. `content` is the result's text outside its
        tool calls (None: no calls were found, and all the text is content)."""
        if content is None:
            return self.text[self.sent:]
        sent = self.text[:self.sent].strip()  # the content's start, before the first call
        return content[len(sent):] if content.startswith(sent) else ""

    def _send(self, upto: int) -> str:
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out
