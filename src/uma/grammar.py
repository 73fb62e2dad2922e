"""Constrained decoding: what a request's output must match (a JSON schema, any JSON object, a
GBNF or Lark grammar, or a tool call), compiled by llguidance into a matcher that gives each
step's token mask.

llguidance (Microsoft's Rust engine behind guidance, also used by llama.cpp and vLLM) is used
rather than llama.cpp's own grammar sampler: it compiles JSON schemas itself (llama.cpp's
schema converter lives in its `common` library, which UMA Serve does not build), builds a
JSON grammar's mask about a thousand times faster than llama.cpp's sampler on the same GBNF and
tokens (benches/constrained.py; docs/results/constrained-decoding.md), and has no
dependencies. xgrammar, the other well-kept engine, needs torch. The mask is applied by the
host sampler (uma._core Sampler.sample's masks): a constrained row is never sampled on the
device.

The model's vocabulary is handed to llguidance once, on the first constrained request
(`Grammars.tokenizer`); each request gets its own matcher (`Grammars.matcher`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from uma.errors import InvalidRequestError

KINDS = ("json_schema", "json_object", "gbnf", "lark")
# JSON without optional whitespace, as OpenAI's structured outputs write it: a model (a
# random one certainly) may otherwise pad it with spaces and newlines until max_tokens.
COMPACT: dict[str, Any] = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: kind is one of KINDS; source the schema (JSON text) or the
    grammar's text."""

    kind: str
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> Constraint:
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object", '{"type": "object"}')


def constraint_of(response_format: object = None, grammar: object = None) -> Constraint | None:
    """The constraint OpenAI's `response_format` ({"type": "text" | "json_object" |
    "json_schema", "json_schema": {"schema": ...}}) or a GBNF `grammar` (llama-server's field)
    asks for; None for plain text. InvalidRequestError naming the bad field."""
    text = response_format is None or (isinstance(response_format, dict)
                                       and response_format.get("type") == "text")
    if grammar is not None:
        if not text:
            raise InvalidRequestError("give response_format or grammar, not both")
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidRequestError("grammar must be a non-empty GBNF grammar")
        return Constraint("gbnf", grammar)
    if text:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequestError("response_format must be an object")
    kind = response_format.get("type")
    if kind == "json_object":
        return Constraint.json_object()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                "response_format.json_schema must be an object with a 'schema' object")
        return Constraint.json_schema(schema)
    raise InvalidRequestError(
        "response_format.type must be 'text', 'json_object' or 'json_schema'")


def tool_call(tools: Sequence[Mapping[str, Any]], name: str | None, fmt: str) -> Constraint:
    """A constraint that makes the answer one call, in the format `fmt` (uma.tools), of the
    named function or of any of `tools` (tool_choice 'required')."""
    fns = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    key = "parameters" if fmt == "llama3" else "arguments"
    calls = [{"type": "object", "properties": {"name": {"const": fn["name"]}, key: _closed(
        fn.get("parameters") or {"type": "object", "properties": {}})},
        "required": ["name", key], "additionalProperties": False} for fn in fns]
    # compact JSON: with flexible whitespace a model may pad a call with newlines for ever
    schema = json.dumps({**(calls[0] if len(calls) == 1 else {"anyOf": calls}),
                         "x-guidance": COMPACT})
    if fmt == "hermes":
        lark = f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {schema}\n'
    elif fmt == "mistral":
        lark = f'start: "[TOOL_CALLS][" call "]"\ncall: %json {schema}\n'
    else:
        return Constraint("json_schema", schema)
    return Constraint("lark", lark)


def _closed(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A function's parameters schema holding only the parameters it declares, unless it says
    otherwise: a required call's arguments are the declared ones (as OpenAI's strict mode
    has them), and a call always ends."""
    out = dict(parameters)
    if out.get("type") == "object":
        out.setdefault("additionalProperties", False)
    return out


class Grammars:
    """The model's vocabulary as llguidance sees it, and a matcher per constrained request."""

    def __init__(self, model: Any, parallel: bool = False) -> None:
        """parallel: fill a tick's masks on a thread pool (where the model runs on a GPU and
        the host's cores are free while it decodes), else one after the other."""
        self._model = model
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._pool: Any = None
        self._parallel = parallel

    @property
    def parallel(self) -> bool:
        """Whether masks are built on a thread pool (beside a GPU)."""
        return self._parallel

    def tokenizer(self) -> Any:
        """The llguidance tokenizer over the model's vocabulary (built once)."""
        with self._lock:
            if self._tokenizer is None:
                import llguidance

                pieces, control = self._model.vocab_pieces()
                vocab, tokenize = self._model.tokenizer_addresses()
                # Control tokens are marked with a leading 0xff, as llguidance expects; it
                # tokenises through llama.cpp's own llama_tokenize (SentencePiece's leading
                # space included), as its llama.cpp integration does.
                # (llguidance's own stub lacks from_llamacpp; its llama.cpp module calls it)
                self._tokenizer = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                    tokens=[b"\xff" + p if control[t] else p for t, p in enumerate(pieces)],
                    vocab_ptr=vocab, tokenize_fptr=tokenize,
                    eos_token=[int(t) for t in self._model.eog_tokens()], slices=None)
                if self._parallel:
                    self._pool = llguidance.LLExecutor()
            return self._tokenizer

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for one request; InvalidRequestError naming what is wrong with the
        schema or grammar."""
        import llguidance

        try:
            grammar = _compile(llguidance, constraint)
        except ValueError as exc:
            raise InvalidRequestError(f"the {_name(constraint)} is not valid: {exc}") from None
        tokenizer = self.tokenizer()
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise InvalidRequestError(
                f"the {_name(constraint)} is not supported: {_brief(messages[0])}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(
                f"the {_name(constraint)} is not supported: {_brief(matcher.get_error())}")
        return matcher

    def fill_masks(self, matchers: Sequence[Any], out: np.ndarray) -> None:
        """Each matcher's next-token mask into a row of `out` (int32, (n, words)).

        On a CPU, one after the other: with few cores llguidance's thread pool cost a
        noticeable share of the decode rate, its threads spinning beside llama.cpp's, where
        one after the other cost nothing measurable. Beside a GPU, on the pool: with a large
        vocabulary a mask takes a fair fraction of a fast GPU's decode, and eight in a row
        left it under a quarter of its decode rate, a third on the pool (benches/constrained.py;
        docs/results/constrained-decoding.md; TickMasks starts them earlier still)."""
        from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

        if self._pool is not None and len(matchers) > 1:
            fill_next_token_bitmask_par(self._pool, [(m, i) for i, m in enumerate(matchers)],
                                        out)
            return
        for i, matcher in enumerate(matchers):
            fill_next_token_bitmask(matcher, out, i)


def _compile(llguidance: Any, constraint: Constraint) -> str:
    if constraint.kind in ("json_schema", "json_object"):
        return str(llguidance.LLMatcher.grammar_from_json_schema(
            constraint.source, defaults=COMPACT))
    if constraint.kind == "gbnf":
        return str(llguidance.grammar_from("gbnf", constraint.source))
    if constraint.kind == "lark":
        return str(llguidance.LLMatcher.grammar_from_lark(constraint.source))
    raise InvalidRequestError(f"unknown constraint {constraint.kind!r}")


def _brief(message: str) -> str:
    """An engine's message on one line, at most 300 characters."""
    return " ".join(message.split())[:300] or "no reason given"


def _name(constraint: Constraint) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object format",
            "gbnf": "grammar", "lark": "tool-call grammar"}[constraint.kind]


class TickMasks:
    """The token masks of each tick's constrained rows, in row order.

    Beside a GPU (Grammars built parallel), the next tick's masks are started on a thread of
    their own as soon as this tick's tokens are consumed (`prefetch`), so they are built while
    the tick is handed on, the next one planned and its decode run; the sampler then waits only
    for what is left. Built after the decode's launch instead, a tick's masks took nearly as
    long as a fast GPU's decode, most of it on the critical path
    (docs/results/constrained-decoding.md). Masks are keyed by request: a request that was
    parked, or is new since the prefetch, gets its mask built when it is needed. On a CPU the
    masks are built when needed, one after the other (Grammars.fill_masks says why)."""

    def __init__(self, grammars: Grammars, n_vocab: int) -> None:
        self.grammars = grammars
        self.words = (n_vocab + 31) // 32
        self._thread: ThreadPoolExecutor | None = ThreadPoolExecutor(
            1, thread_name_prefix="uma-masks") if grammars.parallel else None
        self._pending: tuple[Future[None], list[Any], np.ndarray] | None = None

    def prefetch(self, requests: Sequence[Any]) -> None:
        """Starts building these requests' next masks (requests with a matcher that have
        consumed their last token); the next fill() takes them."""
        if self._thread is None or not requests:
            return
        self.wait()
        reqs = list(requests)
        buf = np.empty((len(reqs), self.words), np.int32)
        future = self._thread.submit(self.grammars.fill_masks, [r.matcher for r in reqs], buf)
        self._pending = (future, reqs, buf)

    def fill(self, requests: Sequence[Any]) -> np.ndarray:
        """The masks of these requests, a row each: prefetched where they were, else built
        now. Matchers are not used elsewhere meanwhile (tokens are consumed after sampling)."""
        out = np.empty((len(requests), self.words), np.int32)
        done: dict[int, tuple[Any, int]] = {}
        pending, self._pending = self._pending, None
        if pending is not None:
            future, reqs, buf = pending
            if future.exception() is None:  # waits; a failure is met again below
                done = {id(r): (r, k) for k, r in enumerate(reqs)}
        todo = []
        for k, req in enumerate(requests):
            hit = done.get(id(req))
            if hit is not None and hit[0] is req:
                out[k] = buf[hit[1]]
            else:
                todo.append(k)
        if todo:
            fresh = np.empty((len(todo), self.words), np.int32)
            self.grammars.fill_masks([requests[k].matcher for k in todo], fresh)
            out[todo] = fresh
        return out

    def wait(self) -> None:
        """Lets a prefetch in flight finish, and drops it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].exception()

    def close(self) -> None:
        self.wait()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
