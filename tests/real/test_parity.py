"""UMA Serve against llama.cpp on real models: greedy text token for token with llama-server,
chat templates rendered as llama-server --jinja renders them, perplexity as llama-perplexity
computes it. Both sides run the same GGUF on the same ggml build."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest

import uma
from uma import _core
from uma.perplexity import perplexity

from .conftest import DATA, llama_server

N_PREDICT = 64
# Two candidates whose log-probabilities are this close may swap under a different reduction
# order (another batch shape, another kernel); only there may greedy paths part.
NEAR_TIE = 0.05

PROMPTS = {
    "prose": "The history of the printing press begins",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "arithmetic": "Question: What is 17 + 25?\nAnswer:",
    "multilingual": "Le petit chat dort sur le canapé. 东京是日本的首都，",
    "emoji": "My favourite foods are pizza 🍕, sushi 🍣 and",
}
# A prompt in each model's own chat format, as an editor sends it to /v1/completions: its
# special-token text must become the special tokens.
CHAT_FORMATTED = {
    "smollm2": "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "gemma3-270m": "<start_of_turn>user\nName three colours.<end_of_turn>\n"
                   "<start_of_turn>model\n",
}


def _model_name(path) -> str:
    return "smollm2" if "SmolLM2" in path.name else "gemma3-270m"


@pytest.fixture(scope="module")
def sides(real_model, llama_bin):
    """(uma.Engine, llama-server's base URL) on one real model."""
    with llama_server(llama_bin, real_model) as server, \
            uma.Engine(str(real_model), n_ctx=2048, n_seq_max=1, n_threads=2,
                       prefix_cache=0) as engine:
        yield engine, f"http://127.0.0.1:{server.port}", _model_name(real_model)


def _llama_complete(url: str, prompt: str) -> tuple[list[int], list[list[tuple[int, float]]]]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2,
            "return_tokens": True, "cache_prompt": False, "post_sampling_probs": False}
    r = httpx.post(f"{url}/completion", json=body, timeout=120)
    r.raise_for_status()
    out = r.json()
    tops = [[(t["id"], t["logprob"]) for t in step["top_logprobs"]]
            for step in out["completion_probabilities"]]
    return out["tokens"], tops


def _divergence(ours, theirs, our_tops, their_tops) -> str | None:
    """None where the greedy paths agree; else where they part, which must be a near-tie on
    both sides (the message shows it)."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            gap_ours = our_tops[i][0][1] - our_tops[i][1][1]
            gap_theirs = their_tops[i][0][1] - their_tops[i][1][1]
            shown = (f"token {i}: uma {a}, llama-server {b}; top-2 log-probability gaps "
                     f"{gap_ours:.4f} (uma), {gap_theirs:.4f} (llama-server)")
            assert {a, b} == {our_tops[i][0][0], our_tops[i][1][0]}, shown
            assert max(gap_ours, gap_theirs) < NEAR_TIE, shown
            return shown
    assert len(ours) == len(theirs), f"lengths {len(ours)} (uma), {len(theirs)} (llama-server)"
    return None


def test_greedy_completions_match_llama_server_token_for_token(sides):
    engine, url, name = sides
    parted = []
    for label, prompt in {**PROMPTS, "chat-formatted": CHAT_FORMATTED[name]}.items():
        result = engine.generate(prompt, max_tokens=N_PREDICT, top_logprobs=2)
        theirs, their_tops = _llama_complete(url, prompt)
        shown = _divergence(list(result.token_ids), theirs, result.top_logprobs, their_tops)
        if shown:
            parted.append(f"{label}: {shown}")
    print(f"\n{name}: {len(PROMPTS) + 1} greedy completions, parted at a near-tie: "
          f"{parted or 'none'}")
    assert len(parted) <= 1, parted  # a near-tie is rare: more than one is a real difference


def test_chat_formatted_text_is_read_as_special_tokens_unless_told_not_to(sides):
    engine, url, name = sides
    text = CHAT_FORMATTED[name]
    theirs = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": True,
                                                  "parse_special": True}).json()["tokens"]
    assert engine.tokenize(text, parse_special=True) == theirs
    special = engine.generate(text, max_tokens=1).usage.prompt_tokens
    plain = engine.generate(text, max_tokens=1, parse_special=False).usage.prompt_tokens
    assert special == len(theirs) and plain > special  # as text, each marker is several tokens


MESSAGES = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Count to three."},
     {"role": "assistant", "content": "One, two, three."},
     {"role": "user", "content": "Now in French, s'il vous plaît. 🇫🇷"}],
]


@pytest.mark.parametrize("messages", MESSAGES, ids=["one turn", "system", "three turns"])
def test_chat_template_renders_as_llama_server_jinja(sides, messages):
    engine, url, _ = sides
    theirs = httpx.post(f"{url}/apply-template", json={"messages": messages}).json()["prompt"]
    ours = engine.chat_template.render(engine_messages(messages))
    assert ours == theirs
    # and the same prompt tokens reach the model
    r = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": messages, "max_tokens": 1, "temperature": 0}).json()
    assert engine.generate(messages, max_tokens=1).usage.prompt_tokens \
        == r["usage"]["prompt_tokens"]


def engine_messages(messages):
    from uma import templates, tools
    return tools.template_messages(templates.checked_messages(messages))


def test_perplexity_matches_llama_perplexity(real_model, llama_bin, tmp_path):
    # llama-perplexity drops the file's last newline; the same text goes to both
    text = (DATA / "prose.txt").read_text().rstrip("\n")
    (tmp_path / "prose.txt").write_text(text)
    out = subprocess.run(
        [str(llama_bin["llama-perplexity"]), "-m", str(real_model), "-f",
         str(tmp_path / "prose.txt"), "-c", "128", "-b", "128", "-t", "2"],
        capture_output=True, text=True, timeout=600)
    theirs = float(re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)[1])
    with _core.Model(real_model) as model:
        ours = perplexity(model, text, n_ctx=128, n_threads=2)
    print(f"\n{real_model.name}: PPL {ours.ppl:.4f} (uma), {theirs:.4f} (llama-perplexity)")
    assert abs(ours.ppl / theirs - 1) < 0.005
