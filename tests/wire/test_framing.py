"""The framer: messages survive any split of the stream; bad bytes raise FrameError only."""

from __future__ import annotations

import itertools
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uma.wire.framing import MAX_DEPTH, FrameDecoder, FrameError, decode_body, encode
from uma.wire.protocol import E_PROTO_001, E_PROTO_002, ProtocolError

MESSAGES = [
    {"type": "generate", "id": "a", "prompt": "héllo 🌍", "max_tokens": 16, "stream": True},
    {"event": "token", "id": "a", "text": "", "token_ids": [1, 2, 3], "logprobs": [-0.5, -1.25]},
    {"big": 2**64 - 1, "small": -(2**63), "none": None, "bytes": b"\x00\xff", "f": 1e300},
    {"nested": {"list": [[], {}, [1, [2, [3]]]], "flag": False}},
    {},
    {"text": "x" * 100_000},
]


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def feed_all(decoder: FrameDecoder, chunks) -> list[dict]:
    out = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


# --- well-formed streams -------------------------------------------------------------------


def test_round_trip_many_messages():
    stream = b"".join(encode(m) for m in MESSAGES * 50)
    decoder = FrameDecoder()
    assert decoder.feed(stream) == MESSAGES * 50
    assert decoder.buffered == 0


def test_encode_writes_little_endian_length_then_msgpack():
    data = encode({"a": 1})
    body = msgpack.packb({"a": 1})
    assert data == struct.pack("<I", len(body)) + body


def test_encode_uses_bin_type_for_bytes():
    assert FrameDecoder().feed(encode({"b": b"\x80"})) == [{"b": b"\x80"}]


def test_one_byte_at_a_time():
    stream = b"".join(encode(m) for m in MESSAGES[:5])
    decoder = FrameDecoder()
    out = []
    consumed = 0
    for i in range(len(stream)):
        got = decoder.feed(stream[i:i + 1])
        out.extend(got)
        if got:
            consumed = i + 1
        assert decoder.buffered == i + 1 - consumed
    assert out == MESSAGES[:5]
    assert decoder.buffered == 0


def test_partial_frame_is_held_until_complete():
    data = encode({"text": "abc"})
    decoder = FrameDecoder()
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == len(data) - 1
    assert decoder.feed(data[-1:]) == [{"text": "abc"}]
    assert decoder.buffered == 0


def test_accepts_memoryview_and_bytearray():
    data = encode({"a": "b"}) * 2
    assert FrameDecoder().feed(memoryview(data)) == [{"a": "b"}] * 2
    assert FrameDecoder().feed(bytearray(data)) == [{"a": "b"}] * 2
    assert FrameDecoder().feed(b"") == []


def test_large_frame_in_small_feeds_keeps_every_byte():
    message = {"text": "y" * (1 << 20)}
    data = encode(message) + encode({"after": 1})
    decoder = FrameDecoder()
    assert feed_all(decoder, (data[i:i + 4096] for i in range(0, len(data), 4096))) == [
        message, {"after": 1}]


def test_frame_of_exactly_max_frame_is_accepted():
    body = msgpack.packb({"t": "z" * 100})
    decoder = FrameDecoder(max_frame=len(body))
    assert decoder.feed(frame(body)) == [{"t": "z" * 100}]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10,
)
messages_st = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


@settings(max_examples=100, deadline=None)
@given(st.lists(messages_st, min_size=1, max_size=8), st.data())
def test_any_split_gives_the_same_messages(messages, data):
    stream = b"".join(encode(m) for m in messages)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)), max_size=20)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    decoder = FrameDecoder()
    assert feed_all(decoder, chunks) == messages
    assert decoder.buffered == 0


def test_pending_is_what_the_frame_in_progress_will_hold():
    first, second = encode({"a": "x" * 100}), encode({"b": 1})
    decoder = FrameDecoder()
    assert decoder.pending == 0
    decoder.feed(first[:2])
    assert decoder.pending == 2  # the length prefix is still incomplete
    decoder.feed(first[2:10])
    assert decoder.pending == len(first)  # known before the body arrives
    assert decoder.feed(first[10:] + second[:5]) == [{"a": "x" * 100}]
    assert decoder.pending == len(second)
    decoder.feed(second[5:])
    assert decoder.pending == decoder.buffered == 0


# --- length errors ---------------------------------------------------------------------------


def test_oversize_length_rejected_before_the_body_arrives():
    decoder = FrameDecoder(max_frame=1024)
    header = struct.pack("<I", 1025)
    assert decoder.feed(header[:3]) == []
    with pytest.raises(FrameError) as info:
        decoder.feed(header[3:])
    assert info.value.code == E_PROTO_002
    assert "1025" in info.value.message


def test_huge_length_rejected_with_default_limit():
    with pytest.raises(FrameError) as info:
        FrameDecoder().feed(b"\xff\xff\xff\xff")
    assert info.value.code == E_PROTO_002


def test_zero_length_rejected():
    with pytest.raises(FrameError) as info:
        FrameDecoder().feed(b"\x00\x00\x00\x00")
    assert info.value.code == E_PROTO_002


@pytest.mark.parametrize("max_frame", [0, -1, 2**32, True, 1.5, None])
def test_max_frame_must_be_a_sane_integer(max_frame):
    with pytest.raises(ValueError, match="max_frame"):
        FrameDecoder(max_frame=max_frame)


# --- bad bodies ----------------------------------------------------------------------------


def deep(n: int) -> bytes:
    return b"\x81\xa1k" + b"\x91" * (n - 1) + b"\xc0"  # {"k": [[[...nil...]]]}, n containers


BAD_BODIES = {
    "garbage": b"\xc1\xc1\xc1",
    "truncated": b"\x82\xa1a\x01",  # a map of two entries holding one
    "truncated string": b"\x81\xa1a\xa5ab",
    "trailing data": msgpack.packb({"a": 1}) + b"\x00",
    "invalid utf-8": b"\x81\xa1a\xa2\xc3\x28",
    "invalid utf-8 key": b"\x81\xa2\xff\xfe\x01",
    "top-level list": msgpack.packb([1, 2]),
    "top-level string": msgpack.packb("hello"),
    "top-level int": msgpack.packb(7),
    "int key": msgpack.packb({1: 2}),
    "nested int key": msgpack.packb({"a": [{"b": 1, 2: 3}]}),
    "binary key": msgpack.packb({b"type": 1}, use_bin_type=True),
    "nested binary key": msgpack.packb({"a": {b"k": 1}}, use_bin_type=True),
    "nil key": b"\x81\xc0\x01",
    "list key": b"\x81\x90\x01",
    "ext type": msgpack.packb({"a": msgpack.ExtType(5, b"xyz")}),
    "timestamp": msgpack.packb({"a": msgpack.Timestamp(1)}),
    "too deep for us": deep(MAX_DEPTH + 1),
    "deep enough to break repr": deep(1000),
    "too deep for msgpack": deep(5000),
    "array claiming 4G elements": b"\x81\xa1a\xdd\xff\xff\xff\xff",
    "string claiming 4G bytes": b"\x81\xa1a\xdb\xff\xff\xff\xff",
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_body_raises_frame_error(body):
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(frame(body))
    assert info.value.code == E_PROTO_001
    assert info.value.message


def test_depth_limit_is_inclusive():
    assert "k" in decode_body(deep(MAX_DEPTH))
    with pytest.raises(FrameError):
        decode_body(deep(MAX_DEPTH + 1))


def test_errors_name_the_problem():
    def message(body):
        with pytest.raises(FrameError) as info:
            decode_body(body)
        return info.value.message

    assert "left over" in message(BAD_BODIES["trailing data"])
    assert "UTF-8" in message(BAD_BODIES["invalid utf-8"])
    assert "map" in message(BAD_BODIES["top-level list"])
    assert "keys must be strings" in message(BAD_BODIES["int key"])
    assert "keys must be strings" in message(BAD_BODIES["binary key"])
    assert "deep" in message(BAD_BODIES["too deep for msgpack"])
    assert "extension types" in message(BAD_BODIES["ext type"])
    assert "extension types" in message(BAD_BODIES["timestamp"])
    assert "claims more" in message(BAD_BODIES["array claiming 4G elements"])
    assert "ends inside" in message(msgpack.packb({"a": "bc"})[:-1])
    # in msgpack's words, never Python's: "not list", "Unpack failed: ..."
    assert message(BAD_BODIES["top-level list"]).endswith("not a list")
    assert message(b"\xc1") == "invalid msgpack: not msgpack"


def test_frame_error_is_a_protocol_error_and_a_value_error():
    with pytest.raises(FrameError) as info:
        decode_body(b"\xc1")
    assert isinstance(info.value, ProtocolError)
    assert isinstance(info.value, ValueError)
    assert info.value.request_id is None


def test_decoder_stays_broken_after_an_error():
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(frame(b"\xc1"))
    for _ in range(2):
        with pytest.raises(FrameError) as info:
            decoder.feed(encode({"fine": True}))
        assert info.value.code == E_PROTO_001
        assert "earlier error" in info.value.message
    assert decoder.buffered == 0  # the broken stream's bytes are let go


def test_messages_before_the_bad_frame_come_with_the_error():
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(encode({"type": "cancel", "id": "x"}) + frame(b"\xc1") + encode({"n": 1}))
    assert info.value.messages == [{"type": "cancel", "id": "x"}]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 16))
def test_random_bytes_raise_only_frame_error(data, step):
    decoder = FrameDecoder(max_frame=256)
    try:
        for i in range(0, len(data), step):
            decoder.feed(data[i:i + step])
    except FrameError as exc:
        assert exc.code in (E_PROTO_001, E_PROTO_002)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=4))
def test_random_bodies_in_valid_frames_raise_only_frame_error(bodies):
    # Random bytes rarely make a valid length; these reach the msgpack decoder.
    decoder = FrameDecoder()
    try:
        for message in decoder.feed(b"".join(frame(body) for body in bodies)):
            assert type(message) is dict
    except FrameError as exc:
        assert exc.code == E_PROTO_001


# --- encoding --------------------------------------------------------------------------------


def test_encode_refuses_non_maps():
    with pytest.raises(TypeError, match="dict"):
        encode([1, 2])  # type: ignore[arg-type]


def test_encoder_recovers_after_an_unpackable_value():
    with pytest.raises(TypeError):
        encode({"a": object()})
    assert FrameDecoder().feed(encode({"b": 2})) == [{"b": 2}]
