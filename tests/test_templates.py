"""Chat templates (uma.templates): the built-ins and real models' templates render as those
models expect; bad templates fail at load, bad messages per request."""

from __future__ import annotations

from pathlib import Path

import pytest

import uma
from uma import templates
from uma.errors import InvalidRequestError, ModelLoadError
from uma.templates import ChatTemplate

# Real models' templates, as llama.cpp's source tree keeps them (third_party/llama.cpp, filled
# by the build): read from there, not copied into this repository.
REAL = Path(__file__).resolve().parents[1] / "third_party" / "llama.cpp" / "models" / "templates"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
USER = CHAT[1:]


def real(name: str, **tokens: str) -> ChatTemplate:
    return ChatTemplate((REAL / f"{name}.jinja").read_text(), name=name, **tokens)


def test_chatml_is_the_fallback_and_renders_every_turn():
    name, source = templates.source_of(None, None)
    assert source == templates.CHATML and "ChatML" in name
    text = ChatTemplate(source).render(CHAT)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert ChatTemplate(source).render(USER, add_generation_prompt=False) == \
        "<|im_start|>user\nHi!<|im_end|>\n"


@pytest.mark.parametrize(("name", "tokens", "messages", "expected"), [
    ("Qwen-Qwen2.5-7B-Instruct", {}, CHAT,
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("Qwen-Qwen2.5-7B-Instruct", {}, USER,  # its own default system prompt
     "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
     "<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"),
    ("meta-llama-Llama-3.1-8B-Instruct", {"bos_token": "<|begin_of_text|>"}, CHAT,
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
     "December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("google-gemma-2-2b-it", {"bos_token": "<bos>"}, USER,
     "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n"),
    ("microsoft-Phi-3.5-mini-instruct", {"eos_token": "<|endoftext|>"}, CHAT,
     "<|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\n"),
    ("mistralai-Mistral-Nemo-Instruct-2407", {"bos_token": "<s>", "eos_token": "</s>"}, USER,
     "<s>[INST]Hi![/INST]"),
])
def test_real_models_templates_render_as_the_models_expect(name, tokens, messages, expected):
    assert real(name, **tokens).render(messages) == expected


def test_tools_are_rendered_into_a_template_that_takes_them():
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    text = real("Qwen-Qwen2.5-7B-Instruct").render(USER, tools=[tool])
    assert text.startswith("<|im_start|>system\nYou are Qwen")
    assert "# Tools" in text and '"name": "get_weather"' in text
    assert text.endswith("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")


def test_what_a_template_refuses_is_the_requests_error():
    gemma = real("google-gemma-2-2b-it", bos_token="<bos>")
    with pytest.raises(InvalidRequestError, match="System role not supported"):
        gemma.render(CHAT)
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        gemma.render([USER[0], USER[0]])
    # a template touching what the sandbox forbids
    sneaky = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidRequestError, match="chat template"):
        sneaky.render(USER)


def test_a_template_that_breaks_on_the_messages_is_the_requests_error_in_our_words():
    # a model's own template adding text to a tool call's null content
    concat = ChatTemplate("{% for m in messages %}{{ m.content + '!' }}{% endfor %}",
                          name="the model's")
    with pytest.raises(InvalidRequestError) as info:
        concat.render([{"role": "assistant", "content": None,
                        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}])
    assert str(info.value) == ("the model's chat template failed on these messages: it reads "
                               "a field they lack, or a value it cannot use")


def test_a_malformed_template_fails_at_load_with_its_line():
    with pytest.raises(ModelLoadError, match=r"does not compile \(line 2\)"):
        ChatTemplate("{% for m in messages %}\n{{ m.content }\n{% endfor %}")


@pytest.mark.parametrize(("messages", "match"), [
    ([], "non-empty list"),
    ("Hi", "non-empty list"),
    ([{"role": "user"}], r"messages\[0\].content must be a string"),
    ([{"content": "a"}], r"messages\[0\].role must be a string"),
    ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a map"),
    ([{"role": "user", "content": "a", "color": "red"}], "unknown field 'color'"),
    ([{"role": "assistant", "content": None}], "content must be a string"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}],
     r"tool_calls\[0\] must be"),
    ([{"role": "user", "content": "a\0b"}], "NUL"),
])
def test_messages_are_checked_before_rendering(messages, match):
    with pytest.raises(InvalidRequestError, match=match):
        templates.checked_messages(messages)


def test_the_setting_names_a_builtin_or_a_file(tmp_path):
    assert templates.source_of("llama3", "{{ x }}")[1] == templates.LLAMA3
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    name, source = templates.source_of(str(path), None)
    assert str(path) in name and ChatTemplate(source).render(USER) == "[user] Hi!\n"
    with pytest.raises(ModelLoadError, match="chat_template must be a file or one of chatml"):
        templates.source_of("no-such-template", None)


def test_the_engine_renders_chat_with_the_models_template_and_one_bos(tiny_path):
    # the tiny model ships Llama 2's template, which writes the BOS text itself
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=1) as e:
        tokens = e.render_chat(CHAT)
        assert e.chat_template.name == "the model's"
        assert list(tokens).count(e.model.bos) == 1 and tokens[0] == e.model.bos
        assert e.chat(CHAT, max_tokens=2).usage.prompt_tokens == len(tokens)
    with uma.Engine(tiny_path, n_ctx=512, n_seq_max=1, chat_template="chatml") as e:
        text = e.model.detokenize(e.render_chat(USER), unparse_special=True)
        assert "<|im_start|>user\nHi!<|im_end|>" in text
    with pytest.raises(ModelLoadError, match="chat_template must be"):
        uma.Engine(tiny_path, n_ctx=512, n_seq_max=1, chat_template="nonsense")
