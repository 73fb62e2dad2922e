"""Constrained decoding on the real core (uma.grammar): random weights are the worst case, so
every output matching its schema or grammar is the grammar's doing alone."""

from __future__ import annotations

import json
import random
import types

import jsonschema
import numpy as np
import pytest

import uma
from uma.errors import InvalidRequestError
from uma.grammar import Constraint, Grammars, TickMasks, constraint_of, tool_call

from .test_templates import REAL

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


def fuzzed_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random schema of bounded size: strings, integers and arrays carry limits, so that an
    answer can always end within max_tokens. No floating-point numbers: no schema bounds
    their digits, and a random model writes digits for ever (a real one ends them)."""
    kinds = ["string", "integer", "boolean", "enum"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 10)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, None, True], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": fuzzed_schema(rng, depth + 1),
                "maxItems": rng.randint(1, 3)}
    names = rng.sample(["id", "name", "tags", "size", "ok", "when"], rng.randint(1, 3))
    return {"type": "object", "properties": {n: fuzzed_schema(rng, depth + 1) for n in names},
            "required": names[: rng.randint(0, len(names))], "additionalProperties": False}


SCHEMAS = [fuzzed_schema(random.Random(seed)) for seed in range(32)]


@pytest.fixture(scope="module", params=["serial", "overlapped", "prefetched"])
def engine(tiny_path, request):
    # overlapped: masks are built while the device decodes, tokens handed on a tick later;
    # prefetched: as beside a GPU, each tick's masks started on a thread once the last
    # tick's tokens are consumed (uma.grammar.TickMasks), their builder's pool in use
    overlap = "off" if request.param == "serial" else "on"
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=4, overlap=overlap) as e:
        if request.param == "prefetched":  # before any request: the compute thread waits
            e._scheduler.runner.tick_masks = TickMasks(Grammars(e.model, parallel=True),
                                                e.model.n_vocab)
        yield e


def as_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def test_every_output_matches_its_fuzzed_schema(engine):
    # sampled (temperature 1.5) and batched: four constrained rows share every tick
    handles = [engine.submit("Answer in JSON.", max_tokens=400, temperature=1.5, seed=k,
                             response_format=as_format(schema))
               for k, schema in enumerate(SCHEMAS)]
    for schema, handle in zip(SCHEMAS, handles, strict=True):
        result = handle.result(timeout=120)
        assert result.finish_reason == "stop", (schema, result.text)
        jsonschema.validate(json.loads(result.text), schema)


def test_json_object_and_gbnf(engine):
    # any object: with random weights a string never closes (one token of 32,000 is its
    # quote), so the answer is an object's beginning, cut at max_tokens
    r = engine.generate("JSON:", max_tokens=40, temperature=1.0,
                        response_format={"type": "json_object"})
    assert r.finish_reason == "length" and r.text.startswith('{"')
    yes_no = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    for seed in range(4):
        r = engine.generate("Well?", max_tokens=20, temperature=1.0, seed=seed, grammar=yes_no)
        word, number = r.text.split(" ")
        assert word in ("yes", "no") and number.isdigit() and len(number) <= 2
    # unconstrained requests beside constrained ones are untouched
    plain = engine.generate("Well?", max_tokens=8, ignore_eos=True)
    beside = engine.submit("Well?", max_tokens=8, ignore_eos=True)
    engine.generate("Well?", max_tokens=8, grammar=yes_no)
    assert beside.result().token_ids == plain.token_ids


@pytest.mark.parametrize("template", ["chatml", "qwen"])
def test_a_required_tool_call_always_parses(tiny_path, template):
    if template == "qwen":  # Hermes-style <tool_call> markers, from a real model's template
        template = str(REAL / "Qwen-Qwen2.5-7B-Instruct.jinja")
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=2, chat_template=template) as e:
        chat = [{"role": "user", "content": "What now?"}]
        for seed, choice in enumerate(["required", "required",
                                       {"type": "function", "function": {"name": "get_time"}}]):
            r = e.chat(chat, max_tokens=200, temperature=1.0, seed=seed,
                       tools=[WEATHER, CLOCK], tool_choice=choice)
            assert r.finish_reason == "tool_calls", r.text
            [call] = r.tool_calls
            fn = {"get_weather": WEATHER, "get_time": CLOCK}[call.name]["function"]
            jsonschema.validate(json.loads(call.arguments), fn["parameters"])
            if isinstance(choice, dict):
                assert call.name == "get_time"


def test_a_constrained_request_is_sampled_on_the_host_even_with_device_sampling(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, device_sampling="on") as e:
        r = e.generate("JSON:", max_tokens=300, response_format=as_format(SCHEMAS[3]))
        jsonschema.validate(json.loads(r.text), SCHEMAS[3])
        assert not e._scheduler.runner.on_device.any()


def test_a_parked_constrained_request_resumes_where_its_grammar_was(tiny_path):
    # one sequence, two apps taking turns every few ticks: the grammar's state survives
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=1, fair_quantum_ms=0.01) as e:
        a = e.submit("JSON:", max_tokens=300, temperature=1.0, seed=1, app="a",
                     response_format=as_format(SCHEMAS[5]))
        b = e.submit("JSON:", max_tokens=300, temperature=1.0, seed=2, app="b",
                     response_format=as_format(SCHEMAS[6]))
        for handle, schema in ((a, SCHEMAS[5]), (b, SCHEMAS[6])):
            jsonschema.validate(json.loads(handle.result(timeout=60).text), schema)
        assert e.snapshot()["fair_parked_total"] >= 1


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"response_format": {"type": "xml"}}, "response_format.type must be"),
    ({"response_format": "json"}, "response_format must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
     "'schema' object"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "not both"),
    ({"grammar": ""}, "non-empty GBNF"),
    ({"grammar": "root ::= foo"}, "Rule 'foo' not found"),
    ({"response_format": as_format({"type": "object", "dependentSchemas": {"a": {}}})},
     "Unimplemented keys"),
])
def test_bad_constraints_are_named(engine, kwargs, words):
    with pytest.raises(InvalidRequestError, match=words):
        engine.submit("x", max_tokens=2, **kwargs)
    assert engine.generate("x", max_tokens=2).finish_reason in ("stop", "length")


def test_constraint_shapes():
    assert constraint_of() is None and constraint_of({"type": "text"}) is None
    assert constraint_of({"type": "json_object"}) == Constraint.json_object()
    assert constraint_of(as_format({"type": "integer"})) == Constraint("json_schema",
                                                                       '{"type": "integer"}')
    hermes = tool_call([WEATHER], None, "hermes")
    assert hermes.kind == "lark" and hermes.source.startswith('start: "<tool_call>\\n"')
    generic = json.loads(tool_call([WEATHER, CLOCK], "get_time", "generic").source)
    assert generic["properties"]["name"] == {"const": "get_time"}
    assert generic["properties"]["arguments"]["additionalProperties"] is False


def test_masks_filled_on_the_pool_equal_those_filled_in_turn(engine):
    pooled = Grammars(engine.model, parallel=True)
    constraints = [Constraint.json_schema(s) for s in SCHEMAS[:4]]
    words = (engine.model.n_vocab + 31) // 32
    one, many = np.empty((4, words), np.int32), np.empty((4, words), np.int32)
    engine.grammars.fill_masks([engine.grammars.matcher(c) for c in constraints], one)
    pooled.fill_masks([pooled.matcher(c) for c in constraints], many)
    assert (one == many).all() and one.any()


def test_prefetched_masks_are_those_built_when_needed(engine):
    pooled = Grammars(engine.model, parallel=True)
    masks = TickMasks(pooled, engine.model.n_vocab)
    reqs = [types.SimpleNamespace(matcher=pooled.matcher(Constraint.json_schema(s)))
            for s in SCHEMAS[:3]]
    words = (engine.model.n_vocab + 31) // 32
    want = np.empty((3, words), np.int32)
    pooled.fill_masks([r.matcher for r in reqs], want)
    masks.prefetch(reqs[:2])
    got = masks.fill([reqs[2], reqs[0], reqs[1]])  # one not prefetched, in another order
    assert (got == want[[2, 0, 1]]).all()
    masks.prefetch(reqs)
    masks.wait()  # dropped: built again when needed
    assert (masks.fill(reqs) == want).all()
    masks.close()
