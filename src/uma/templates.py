"""Chat templates as models ship them: the GGUF's Jinja template (`tokenizer.chat_template`),
rendered by jinja2's sandbox the way Hugging Face's tokenizers render it (blocks trimmed,
`tojson`, `raise_exception`, `strftime_now`), with `messages`, `tools`,
`add_generation_prompt`, `bos_token` and `eos_token`. A model without a template gets ChatML
(said once in the log); the `chat_template` setting names a file or a built-in template.

A template is compiled once, when the model loads: a malformed one fails the load with its
line, not every request. What a template refuses at render time (its own raise_exception, a
sandbox violation, a missing field) is the request's error, naming the template's message.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from uma.errors import InvalidRequestError, ModelLoadError, kind_of

log = logging.getLogger("uma.templates")

# The ChatML layout (Qwen, Hermes, and llama-server's fallback for a model without a template).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# meta-llama/Llama-2-7b-chat-hf:
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)
# meta-llama/Meta-Llama-3-8B-Instruct:
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
BUILTIN: dict[str, str] = {"chatml": CHATML, "llama2": LLAMA2, "llama3": LLAMA3}


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            sort_keys: bool = False, separators: Any = None) -> str:
    # As transformers' chat templates have it: non-ASCII kept, keys in the order given.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=separators)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """One compiled template and the special tokens it is rendered with."""

    def __init__(self, source: str, *, name: str = "the model's", bos_token: str = "",
                 eos_token: str = "") -> None:
        self.name = name
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._template = _environment().from_string(source)
        except TemplateSyntaxError as exc:
            raise ModelLoadError(
                f"{name} chat template does not compile (line {exc.lineno}): {exc.message}"
            ) from None

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text. InvalidRequestError where the template refuses the messages."""
        try:
            return self._template.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except TemplateError as exc:
            raise InvalidRequestError(f"the chat template refused the messages: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # a template indexing a field the messages lack, or adding text to None: Python's
            # words ("can only concatenate str (not "NoneType") to str") go to the log
            log.info("%s chat template failed: %s: %s", self.name, type(exc).__name__, exc)
            raise InvalidRequestError(
                f"{self.name} chat template failed on these messages: it reads a field they "
                f"lack, or a value it cannot use"
            ) from None


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})


def checked_messages(messages: object) -> list[dict[str, Any]]:
    """Chat messages as a template takes them: a non-empty list of maps, each with a string
    `role` and `content`; an assistant's may instead carry `tool_calls` (content null), a
    tool result its `tool_call_id`, any message a `name`. InvalidRequestError naming the
    first bad field otherwise."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be a map, not {kind_of(m)}")
        unknown = set(m) - _MESSAGE_FIELDS
        if unknown:
            raise InvalidRequestError(
                f"unknown field {sorted(map(repr, unknown))[0]} in messages[{i}]; a message "
                f"has {', '.join(sorted(_MESSAGE_FIELDS))}")
        if not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"messages[{i}].role must be a string")
        calls = m.get("tool_calls")
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and calls)):
            raise InvalidRequestError(f"messages[{i}].content must be a string")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise InvalidRequestError(f"messages[{i}].{key} must be a string")
        if calls is not None:
            _check_calls(calls, f"messages[{i}].tool_calls")
        if "\0" in m["role"] or "\0" in (content or ""):
            raise InvalidRequestError(f"messages[{i}] contains a NUL character")
        out.append(dict(m))
    return out


def _check_calls(calls: object, where: str) -> None:
    if not isinstance(calls, list):
        raise InvalidRequestError(f"{where} must be a list")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments", ""), (str, Mapping)):
            raise InvalidRequestError(
                f"{where}[{j}] must be {{'function': {{'name': ..., 'arguments': ...}}}}")


def message_bytes(messages: Sequence[Mapping[str, Any]]) -> int:
    """UTF-8 bytes of what the messages hold (roles, contents, names, tool calls): what the
    prompt limit counts."""
    total = 0
    for m in messages:
        for key in ("role", "content", "name", "tool_call_id"):
            if isinstance(m.get(key), str):
                total += len(m[key].encode("utf-8", "surrogatepass"))
        if m.get("tool_calls"):
            total += len(json.dumps(m["tool_calls"], ensure_ascii=False).encode(
                "utf-8", "surrogatepass"))
    return total


def source_of(choice: str | None, model_template: str | None) -> tuple[str, str]:
    """(name, Jinja source) of the template to use: `choice` (the chat_template setting: a
    built-in name or a file), else the model's own, else ChatML."""
    if choice:
        if choice in BUILTIN:
            return f"the built-in {choice}", BUILTIN[choice]
        if not os.path.isfile(choice):
            raise ModelLoadError(f"chat_template must be a file or one of "
                                 f"{', '.join(BUILTIN)}, not {choice!r}")
        try:
            with open(choice, encoding="utf-8") as f:
                return f"the file {choice}'s", f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read chat_template {choice}: {exc}") from None
    if model_template:
        return "the model's", model_template
    log.info("the model has no chat template; chat messages are rendered as ChatML")
    return "the ChatML fallback", CHATML
