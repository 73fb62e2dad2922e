"""llama-server's `POST /infill` for editor plugins (llama.vim, llama.vscode): a body of
input_prefix, input_suffix, input_extra and prompt becomes a fill-in-the-middle prompt
(uma.infill), and the answer is llama-server's own completion object (content, tokens, stop,
...), streamed as server-sent events with stream: true. Sampling fields are the completion
endpoints' (n_predict is llama-server's name for max_tokens); fields this server has no use for
(samplers, t_max_predict_ms, ...) are ignored, as llama-server ignores what it does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from uma import infill
from uma.errors import InvalidRequestError
from uma.handle import Result, TokenEvent
from uma.priority import Priority
from uma.server.openai_api import (
    _PASSED,
    ApiError,
    ApiRequest,
    _check_model,
    _field,
    _object,
    parse_as_socket,
    sse,
)
from uma.wire import protocol as P

# (prefix, suffix, extra chunks, prompt) -> the prompt's token ids (Engine.infill_tokens)
InfillTokens = Callable[[str, str, Sequence[infill.Chunk], str], Sequence[int]]


def parse_infill(body: object, *, model_id: str, limits: P.RequestLimits,
                 default_priority: Priority, tokens_of: InfillTokens) -> ApiRequest:
    """POST /infill. Tokenises (tokens_of), so it runs off the event loop."""
    body = _object(body)
    _check_model(body, model_id)
    texts = {}
    for name in ("input_prefix", "input_suffix"):
        texts[name] = _field(body, name, str)
        if texts[name] is None:
            raise ApiError(400, f"{name} is required (a string)", param=name)
    prompt = _field(body, "prompt", str) or ""
    try:
        extra = infill.chunks_of(body.get("input_extra"))
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param="input_extra") from None
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in (
        texts["input_prefix"], texts["input_suffix"], prompt, *(c.text for c in extra)))
    if size > limits.max_prompt_bytes:
        raise ApiError(400, f"the prefix, suffix, prompt and extra context are over "
                            f"{limits.max_prompt_bytes} bytes of UTF-8",
                       code="context_length_exceeded")
    try:
        tokens = [int(t) for t in tokens_of(texts["input_prefix"], texts["input_suffix"], extra,
                                            prompt)]
    except InvalidRequestError as exc:
        if str(exc).startswith("infill is not supported"):
            raise ApiError(501, str(exc), type="not_supported_error") from None
        raise ApiError(400, str(exc)) from None
    max_tokens = body.get("max_tokens")
    n_predict = _field(body, "n_predict", int)
    if n_predict is not None and max_tokens is None:
        max_tokens = n_predict if n_predict >= 0 else None  # -1: llama-server's "no limit"
    stream = bool(_field(body, "stream", bool))
    msg = {"type": "generate", "id": "http", "stream": stream, "stop": body.get("stop"),
           **{name: body.get(name) for name in _PASSED if name != "parse_special"},
           "tokens": tokens, "max_tokens": max_tokens}
    req = parse_as_socket(msg, limits, default_priority)
    assert isinstance(req, P.GenerateRequest)  # the message above is a generate request
    return ApiRequest(req, stream, include_usage=False)


class InfillFormat:
    """llama-server's completion objects (not OpenAI's): each streamed one carries content,
    its tokens and stop: false; the last (or the whole answer) stop: true with the counts.
    Its streams end without OpenAI's [DONE], as llama-server's do."""

    done_marker = False

    def __init__(self, model_id: str, piece: Callable[[int], bytes]) -> None:
        self.model_id = model_id

    def full(self, result: Result) -> dict:
        return self._final(result, result.text, list(result.token_ids))

    def delta_sse(self, event: TokenEvent) -> bytes:
        return sse(self.delta(event))

    def delta(self, event: TokenEvent) -> dict:
        return {"index": 0, "content": event.text, "tokens": list(event.token_ids),
                "stop": False}

    def closing(self, result: Result) -> dict:
        return self._final(result, "", [])

    def _final(self, result: Result, text: str, tokens: list[int]) -> dict:
        u = result.usage
        return {"index": 0, "content": text, "tokens": tokens, "stop": True,
                "model": self.model_id, "tokens_predicted": u.completion_tokens,
                "tokens_evaluated": u.prompt_tokens, "tokens_cached": u.cached_tokens,
                "truncated": False,
                "stop_type": "limit" if result.finish_reason == "length" else "eos",
                "timings": {"prompt_n": u.prompt_tokens - u.cached_tokens,
                            "predicted_n": u.completion_tokens}}
