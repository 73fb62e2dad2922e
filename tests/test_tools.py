"""Tool calling (uma.tools): tools and tool_choice checked, rendered into the prompt, calls
parsed out of each format, and a streamed answer held back only where it may be a call."""

from __future__ import annotations

import json
import re

import pytest

import uma
from uma import tools
from uma.errors import InvalidRequestError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Oslo?"}]


def calls(text: str, fmt: str) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in tools.parse(text, fmt)[1]]


@pytest.mark.parametrize(("fmt", "text", "content"), [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
               "</tool_call>", "Checking."),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]', ""),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', ""),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', ""),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', ""),
    ("generic", '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', ""),
    ("generic", json.dumps({"tool_calls": [
        {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}]}), ""),
])
def test_each_format_parses_to_the_same_call(fmt, text, content):
    got_content, got = tools.parse(text, fmt)
    assert [(c.name, json.loads(c.arguments)) for c in got] == [("get_weather", {"city": "Oslo"})]
    assert got_content == content and all(c.id.startswith("call_") for c in got)


def test_several_calls_and_text_that_is_no_call():
    two = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
           '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    assert calls(two, "hermes") == [("a", {}), ("b", {"x": 1})]
    assert calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]',
                 "generic") == [("a", {}), ("b", {})]
    # plain answers, and JSON that is not a call, stay content
    for text, fmt in [("Sunny, 20 degrees.", "hermes"), ('{"city": "Oslo"}', "generic"),
                      ("<tool_call>not json</tool_call>", "hermes"),
                      ('{"name": "a", "arguments": [1]}', "llama3"),
                      ("[TOOL_CALLS] nothing", "mistral")]:
        assert tools.parse(text, fmt) == (text, [])


def test_the_format_follows_the_template():
    assert tools.format_of("... <tool_call> ...") == "hermes"
    assert tools.format_of("... [TOOL_CALLS] ...") == "mistral"
    assert tools.format_of("<|start_header_id|>{% if tools %}") == "llama3"
    assert tools.format_of("{{ messages }}") == "generic"
    assert tools.takes_tools("{% if tools %}") and not tools.takes_tools("{{ messages }}")


@pytest.mark.parametrize(("value", "words"), [
    ("get_weather", "tools must be a list"),
    ([{"type": "retrieval"}], "tools[0] must be"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "parameters"),
])
def test_bad_tools_are_named(value, words):
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        tools.check_tools(value)


def test_tool_choice():
    assert tools.check_tool_choice(None, [WEATHER]) is None
    assert tools.check_tool_choice("auto", [WEATHER]) == "auto"
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert tools.check_tool_choice(named, [WEATHER]) == "get_weather"
    with pytest.raises(InvalidRequestError, match="not among the tools"):
        tools.check_tool_choice({"type": "function", "function": {"name": "x"}}, [WEATHER])
    with pytest.raises(InvalidRequestError, match="needs tools"):
        tools.check_tool_choice("required", None)
    with pytest.raises(InvalidRequestError, match="tool_choice must be"):
        tools.check_tool_choice("always", [WEATHER])


def test_a_stream_holds_back_only_what_may_be_a_call():
    s = tools.ToolStream("hermes")
    sent = [s.feed(d) for d in ["Let me", " check. <tool", '_call>{"name": "f", ',
                                '"arguments": {}}</tool_call>']]
    assert sent == ["Let me", " check. ", "", ""]
    content, _ = tools.parse(s.text, "hermes")
    assert s.finish(content) == ""  # everything outside the call was sent
    # a marker's first characters wait until they turn out to be text
    s = tools.ToolStream("hermes")
    assert [s.feed("a <"), s.feed("b")] == ["a ", "<b"] and s.finish(None) == ""
    # JSON formats: an answer that starts like JSON waits whole, text goes at once
    s = tools.ToolStream("generic")
    assert [s.feed(" {"), s.feed('"x": 1}')] == ["", ""] and s.finish(None) == ' {"x": 1}'
    s = tools.ToolStream("llama3")
    assert [s.feed("Sun"), s.feed("ny")] == ["Sun", "ny"] and s.finish(None) == ""


def test_assistant_calls_reach_the_template_with_their_arguments_as_objects():
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]
    fixed = tools.template_messages(history)
    assert fixed[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_a_template_without_tools_gets_them_in_a_system_message(tiny_path):
    # the tiny model ships Llama 2's template, which knows no tools
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        assert e.tool_format == "generic"
        text = e.model.detokenize(e.render_chat(USER, [WEATHER], "auto"))
        assert "<<SYS>>" in text and '"name": "get_weather"' in text
        assert "Weather in Oslo?" in text
        # a request with tools runs, and its answer (random weights: no call) is content
        r = e.chat(USER, max_tokens=4, tools=[WEATHER])
        assert r.finish_reason in ("stop", "length") and r.tool_calls == ()
        # a conversation with a call and its result renders and runs too
        history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]
        # as plain turns: the call as the JSON asked for, the result as a user turn
        text = e.model.detokenize(e.render_chat(history, [WEATHER], "auto"))
        assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text
        assert '"tool_response"' in text and "20 degrees" in text
        assert e.chat(history, max_tokens=2, tools=[WEATHER]).usage.completion_tokens == 2
        with pytest.raises(InvalidRequestError, match="roles must alternate"):
            e.chat([*history, *USER], max_tokens=2, tools=[WEATHER])  # Llama 2's own rule
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1, chat_template="chatml") as e:
        assert e.chat([*history, *USER], max_tokens=2,
                      tools=[WEATHER]).usage.completion_tokens == 2
        with pytest.raises(InvalidRequestError, match="go with chat messages"):
            e.submit("plain text", tools=[WEATHER])
