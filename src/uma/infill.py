"""Fill-in-the-middle prompts, laid out exactly as llama-server's `POST /infill` lays them
(tools/server/server-common.cpp, format_prompt_infill), so editor plugins written for it get the
same completions here:

    [FIM_REP]myproject\\n [FIM_SEP]file\\n extra ...  [FIM_SEP]filename\\n
    [FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID] prompt

The repository-level part ([FIM_REP], [FIM_SEP]) is written only where the vocabulary has those
tokens (without [FIM_SEP], extra chunks are joined by a "--- snippet ---" line). The prefix keeps
its last 3/4 of a batch, the suffix its first 1/4 less the prompt, and extra context fills what
the context leaves. A pure function of the tokenizer: no model runs here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from uma.errors import InvalidRequestError

Tokenize = Callable[[str], Sequence[int]]  # text -> ids, no BOS, special text kept as text

_SNIPPET = "\n\n--- snippet ---\n\n"
NEEDED = ("pre", "suf", "mid")


@dataclass(frozen=True)
class Chunk:
    """One piece of extra context (llama-server's input_extra): a file's name and text."""

    text: str
    filename: str = "tmp"


def unsupported(fim: Mapping[str, int]) -> str | None:
    """Why a model with these FIM tokens cannot infill (llama-server's words), or None."""
    missing = [f"{'prefix' if r == 'pre' else 'suffix' if r == 'suf' else 'middle'} token "
               f"is missing" for r in NEEDED if fim.get(r, -1) < 0]
    if not missing:
        return None
    return "infill is not supported by this model: " + ", ".join(missing)


def prompt_tokens(tokenize: Tokenize, fim: Mapping[str, int], *, prefix: str, suffix: str,
                  extra: Sequence[Chunk] = (), prompt: Sequence[int] = (),
                  bos: int | None = None, n_batch: int, n_ctx: int, n_predict: int = -1
                  ) -> list[int]:
    """The infill prompt's token ids. bos: the BOS to put first where the model adds one.
    n_batch, n_ctx: the batch and the context per sequence, which bound what of the prefix,
    suffix and extra context is kept; n_predict: the tokens to be generated (-1: unknown)."""
    reason = unsupported(fim)
    if reason is not None:
        raise InvalidRequestError(reason)
    extra_tokens: list[int] = []
    if fim.get("rep", -1) >= 0:
        extra_tokens += [fim["rep"], *tokenize("myproject\n")]
    sep = fim.get("sep", -1)
    for chunk in extra:
        if sep >= 0:
            extra_tokens += [sep, *tokenize(chunk.filename + "\n")]
        else:
            extra_tokens += tokenize(_SNIPPET)
        extra_tokens += tokenize(chunk.text)
    if sep >= 0:
        extra_tokens += [sep, *tokenize("filename\n")]

    pre = list(tokenize(prefix))
    suf = list(tokenize(suffix))
    n_prefix = min(len(pre), 3 * (n_batch // 4))
    n_suffix = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [fim["pre"], *pre[len(pre) - n_prefix:], *prompt]
    tail = [fim["suf"], *suf[:n_suffix]]
    out = ([] if bos is None else [bos]) + head
    out[:0] = extra_tokens[len(extra_tokens) - n_extra:]
    return [*out, *tail, fim["mid"]]


def chunks_of(value: object) -> list[Chunk]:
    """input_extra as llama-server takes it: a list of {"text": str, "filename"?: str}."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(
            'input_extra must be an array of {"filename": string, "text": string}')
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise InvalidRequestError(f"input_extra[{i}] must have a string 'text'")
        name = item.get("filename", "tmp")
        if not isinstance(name, str):
            raise InvalidRequestError(f"input_extra[{i}].filename must be a string")
        out.append(Chunk(item["text"], name))
    return out
