"""HTTP bodies are read as the socket reads frames: UTF-8 JSON, nested at most MAX_DEPTH deep,
every string valid Unicode; what is not is a 400 naming the problem in the project's words."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uma.server.openai_api import ApiError, body_of
from uma.wire.framing import MAX_DEPTH


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        body_of(raw)
    assert info.value.status == 400
    return info.value


def test_a_body_is_utf8_json():
    assert body_of(b'{"prompt": "h\\u00e9 \xf0\x9f\xa6\x99 \\ud83e\\udd99"}') == {
        "prompt": "h\u00e9 \U0001f999 \U0001f999"}  # escaped surrogate pairs are one character
    assert body_of(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a byte order mark is let pass
    assert body_of(b"[1, 2]") == [1, 2] and body_of(b'"x"') == "x"  # refused later, by kind


# Lone surrogates were a 500 quoting Python ("'utf-8' codec can't encode character '\ud800'
# ... surrogates not allowed") on every text field: prompt, chat content and role, a tool's
# description, /v1/embeddings input, /tokenize content.
@pytest.mark.parametrize(("body", "where"), [
    ({"prompt": "abc\ud800"}, "prompt"),
    ({"messages": [{"role": "user", "content": "\udfff"}]}, "messages[0].content"),
    ({"messages": [{"role": "u\udc00ser", "content": "x"}]}, "messages[0].role"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
     "tools[0].function.description"),
    ({"input": ["ok", "\ud800"]}, "input[1]"),
    ({"content": "\ud800"}, "content"),
    ({"stop": ["\udbff"]}, "stop[0]"),
    ({"response_format": {"json_schema": {"schema": {"pattern": "\ud800"}}}},
     "response_format.json_schema.schema.pattern"),
])
def test_lone_surrogates_are_refused_naming_the_field(body, where):
    err = refused(json.dumps(body).encode())  # json.dumps writes them as "\ud800" escapes
    assert err.param == where
    assert err.message.startswith(f"{where} is not valid Unicode: it holds half of a UTF-16 "
                                  f"surrogate pair (U+D")


def test_surrogates_in_keys_and_as_raw_bytes_are_refused():
    assert refused(b'{"a": {"\\ud800": 1}}').message.startswith("a key in a is not valid")
    # CESU-8, as json.loads would read it from bytes (it decodes them with surrogatepass)
    assert refused(b'{"prompt": "\xed\xa0\x80"}').message == \
        "the body is not valid UTF-8 (byte 12)"


@pytest.mark.parametrize(("raw", "message"), [
    (b"\xff\xfe{\x00}\x00", "the body is not valid UTF-8 (byte 0)"),
    (b'{"prompt": "a"', "the body is not valid JSON: Expecting ',' delimiter at line 1, "
                        "column 15"),
    (b"", "the body is not valid JSON: Expecting value at line 1, column 1"),
    # "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()"
    (b'{"max_tokens": 1' + b"0" * 5000 + b"}", "the body holds a number with too many digits"),
    # "maximum recursion depth exceeded while decoding a JSON array from a unicode string"
    (b"[" * 100_000 + b"]" * 100_000, f"the body is nested more than {MAX_DEPTH} deep"),
    (b'{"a": ' * 100_000, f"the body is nested more than {MAX_DEPTH} deep"),
], ids=["utf-16", "cut short", "empty", "4300 digits", "deep lists", "deep maps"])
def test_unreadable_bodies_are_named_in_our_words(raw, message):
    assert refused(raw).message == message


def test_nesting_is_bounded_as_the_sockets_is():
    def nested(depth: int) -> bytes:  # a map at depth 1 holding lists down to `depth`
        return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    assert body_of(nested(MAX_DEPTH))
    assert refused(nested(MAX_DEPTH + 1)).message == \
        f"the body is nested more than {MAX_DEPTH} deep"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_any_json_value_is_read_or_refused_with_a_400(value):
    raw = json.dumps(value).encode()
    try:
        body = body_of(raw)
    except ApiError as exc:
        assert exc.status == 400
        assert "not valid Unicode" in exc.message or "nested more than" in exc.message
    else:
        assert json.dumps(body) == json.dumps(json.loads(raw))  # NaN is not equal to itself


# --- streamed events ------------------------------------------------------------------------

def _formats():
    from uma.server.openai_api import ChatFormat, CompletionFormat

    return [CompletionFormat("m", lambda t: b"x"), ChatFormat("m", lambda t: b"x")]


@given(st.text())
def test_a_streamed_token_from_the_template_is_the_same_bytes_as_from_its_object(text):
    from uma.handle import TokenEvent
    from uma.server.openai_api import sse

    for fmt in _formats():
        event = TokenEvent(text, (1,))
        assert fmt.delta_sse(event) == sse(fmt.delta(event))
        assert fmt.delta_sse(event) == fmt.delta_sse(event)  # the template kept


@pytest.mark.parametrize("text", ["a\x85b", "a\u2028b", "a\u2029b", "\u2028", "é\u2029"])
def test_an_event_stays_one_line_for_readers_that_split_at_any_line_break(text):
    # str.splitlines (httpx's aiter_lines) also splits at NEL and the Unicode line and
    # paragraph separators, which JSON leaves raw: a client cut such an event in two
    from uma.handle import TokenEvent
    from uma.server import ollama_api
    from uma.server.openai_api import sse

    for fmt in _formats():
        for raw in (fmt.delta_sse(TokenEvent(text, (1,))), sse({"text": text})):
            lines = raw.decode().splitlines()
            assert lines == [lines[0], ""] or lines == [lines[0]]
            assert text in json.dumps(json.loads(lines[0][6:]), ensure_ascii=False)
    line = ollama_api.line({"response": text}).decode()
    assert line.splitlines() == [line[:-1]] and json.loads(line) == {"response": text}
