"""uma.infill: fill-in-the-middle prompts laid out as llama-server's /infill lays them, on a
tokenizer that makes one id per character (so every piece of the layout can be read back)."""

from __future__ import annotations

import pytest

from uma import infill
from uma.errors import InvalidRequestError

PRE, SUF, MID, REP, SEP, BOS = 90_001, 90_002, 90_003, 90_004, 90_005, 90_000
BASIC = {"pre": PRE, "suf": SUF, "mid": MID, "pad": -1, "rep": -1, "sep": -1}
REPO = {**BASIC, "rep": REP, "sep": SEP}


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def layout(**kwargs) -> list[int]:
    args = {"prefix": "ab", "suffix": "yz", "n_batch": 512, "n_ctx": 4096, **kwargs}
    return infill.prompt_tokens(chars, args.pop("fim", BASIC), **args)


def test_prefix_then_suffix_then_middle_with_the_models_bos_first():
    assert layout() == [PRE, *chars("ab"), SUF, *chars("yz"), MID]
    assert layout(bos=BOS) == [BOS, PRE, *chars("ab"), SUF, *chars("yz"), MID]
    assert layout(prompt=[7, 8]) == [PRE, *chars("ab"), 7, 8, SUF, *chars("yz"), MID]


def test_extra_context_goes_before_everything_as_repository_files():
    extra = [infill.Chunk("x = 1", "a.py"), infill.Chunk("y = 2")]
    got = layout(fim=REPO, extra=extra, bos=BOS)
    repo = [REP, *chars("myproject\n"), SEP, *chars("a.py\n"), *chars("x = 1"),
            SEP, *chars("tmp\n"), *chars("y = 2"), SEP, *chars("filename\n")]
    assert got == [*repo, BOS, PRE, *chars("ab"), SUF, *chars("yz"), MID]


def test_without_a_file_separator_chunks_are_joined_by_a_snippet_line():
    got = layout(extra=[infill.Chunk("x = 1")])
    assert got[:len(chars("\n\n--- snippet ---\n\nx = 1"))] == chars("\n\n--- snippet ---\n\nx = 1")


def test_what_does_not_fit_is_cut_as_llama_server_cuts_it():
    # the prefix keeps its last 3/4 of a batch, the suffix its first quarter less the prompt
    # and two, the extra context its last n_ctx - n_batch - 2 * n_predict tokens
    got = layout(prefix="p" * 100, suffix="s" * 100, prompt=[7], n_batch=40,
                 extra=[infill.Chunk("e" * 100)], n_ctx=60, n_predict=5)
    extra = got[:got.index(PRE)]
    assert extra == chars("e" * 10)
    assert got[got.index(PRE) + 1:got.index(SUF)] == chars("p" * 30) + [7]
    assert got[got.index(SUF) + 1:got.index(MID)] == chars("s" * 7)


def test_a_model_without_fim_tokens_is_refused_naming_what_it_lacks():
    assert infill.unsupported(BASIC) is None
    lacking = {**BASIC, "suf": -1, "mid": -1}
    assert infill.unsupported(lacking) == (
        "infill is not supported by this model: suffix token is missing, middle token is "
        "missing")
    with pytest.raises(InvalidRequestError, match="not supported"):
        infill.prompt_tokens(chars, lacking, prefix="a", suffix="b", n_batch=8, n_ctx=64)


@pytest.mark.parametrize("value, words", [
    ("x", "must be an array"), ([1], "input_extra[0] must have a string 'text'"),
    ([{"text": "a", "filename": 3}], "input_extra[0].filename must be a string"),
])
def test_extra_chunks_are_checked(value, words):
    with pytest.raises(InvalidRequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        infill.chunks_of(value)
    assert infill.chunks_of([{"text": "a"}]) == [infill.Chunk("a", "tmp")]
