"""Chat templates: rendered like Hugging Face, prompts like llama.cpp's chat layer (recorded by
tools/make_tokenizer_fixtures.py with llama-completion --jinja)."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import chat
from swapmoe.runtime.chat import ChatTemplate, ChatTemplateError, apply_chat_template, render_template
from swapmoe.runtime.tokenizer import Tokenizer

from conftest import DATA, read_zst

PROMPTS = json.loads(read_zst(DATA / "tokenizer" / "templates.json.zst"))
# Qwen3.5's and poolside Laguna's templates: conversations and the text transformers renders
CASES = PROMPTS["cases"]
LAGUNA = ["poolside-Laguna-XS.2", "poolside-Laguna-XS-2.1", "poolside-Laguna-S-2.1"]
MESSAGES = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
]


@pytest.fixture(scope="module")
def synthetic(synth_model) -> Tokenizer:
    return Tokenizer.from_gguf(synth_model())


@pytest.fixture(scope="module")
def vocab(vocab_dir):
    """name -> tokenizer of a committed vocab-only GGUF, built on first use."""
    built: dict[str, Tokenizer] = {}

    def tokenizer(name: str) -> Tokenizer:
        if name not in built:
            built[name] = Tokenizer.from_gguf(vocab_dir / f"ggml-vocab-{name}.gguf")
        return built[name]

    return tokenizer


def test_chatml_of_the_synthetic_model(synthetic):
    prompt = apply_chat_template(synthetic, MESSAGES)
    assert prompt == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = synthetic.encode(prompt)
    assert ids.count(synthetic.token_ids["<|im_start|>"]) == 5
    assert not apply_chat_template(synthetic, MESSAGES[:2], add_generation_prompt=False).endswith("assistant\n")


@pytest.mark.parametrize("name", sorted(n for n in PROMPTS["templates"] if n not in PROMPTS["differ"]))
def test_prompt_matches_llama_cpp(synthetic, monkeypatch, name):
    """System + user message through each of llama.cpp's test templates: the same token ids."""
    recorded = datetime.fromisoformat(PROMPTS["date"])

    class RecordingDay(datetime):
        @classmethod
        def now(cls, tz=None):
            return recorded

    monkeypatch.setattr(chat, "datetime", RecordingDay)
    messages = [{"role": "system", "content": PROMPTS["system"]}, {"role": "user", "content": PROMPTS["user"]}]
    template = PROMPTS["templates"][name]
    prompt = apply_chat_template(synthetic, messages, template=template["source"])
    assert synthetic.encode(prompt) == template["ids"], prompt


def test_llama_cpp_prompts_cover_the_moe_families():
    names = set(PROMPTS["templates"]) - set(PROMPTS["differ"])
    assert len(names) >= 60
    for family in ("Qwen3", "DeepSeek-V3", "gpt-oss", "GLM-4", "Kimi-K2", "MiniMax-M2", "Llama-3"):
        assert any(family in name for name in names), family


def test_templates_of_the_vocab_files(vocab):
    qwen = vocab("qwen2")
    assert apply_chat_template(qwen, [{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    gemma = vocab("gemma-4")
    prompt = apply_chat_template(gemma, MESSAGES)
    assert "You are helpful." in prompt and "2+2?" in prompt
    assert render_template(gemma.chat_template, MESSAGES, bos_token="<bos>").startswith("<bos>")
    assert not prompt.startswith("<bos>")  # the template writes BOS, the tokenizer adds it: once only
    ids = gemma.encode(prompt)
    assert ids.count(gemma.bos_id) == 1 and ids[0] == gemma.bos_id
    whole = ChatTemplate(gemma).render(MESSAGES)  # BOS text put back once, for add_special=False
    assert whole == "<bos>" + prompt and gemma.encode(whole, add_special=False) == ids
    assert "2+2?" in apply_chat_template(vocab("phi-3"), MESSAGES)


def test_system_message_merged_for_templates_without_one(synthetic):
    source = PROMPTS["templates"]["google-gemma-2-2b-it.jinja"]["source"]
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_template(source, MESSAGES)
    prompt = apply_chat_template(synthetic, MESSAGES, template=source)
    assert "You are helpful.\nHi!" in prompt


def test_llama_cpp_template_patches(synthetic):
    source = PROMPTS["templates"]["openai-gpt-oss-120b.jinja"]["source"]
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<|channel|>final<|message|>Hello"},
        {"role": "user", "content": "More"},
    ]
    with pytest.raises(ChatTemplateError):
        render_template(source, messages)
    assert "More" in apply_chat_template(synthetic, messages, template=source)


def test_chat_template_from_gguf(synth_model):
    template = ChatTemplate.from_gguf(synth_model())
    assert template.render(MESSAGES[1:2]) == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"


def test_model_without_template(vocab):
    tok = vocab("gpt-2")
    assert tok.chat_template is None
    with pytest.raises(SwapmoeError, match="gpt-2.gguf: the model has no chat template"):
        apply_chat_template(tok, MESSAGES)
    assert apply_chat_template(tok, MESSAGES[1:2], template="{{ messages[-1]['content'] }}") == "Hi!"


def test_hugging_face_helpers():
    source = (
        "{{ messages | tojson }}|{{ {'b': 1, 'a': 'ü'} | tojson(indent=1, sort_keys=True) }}|"
        "{{ strftime_now('%Y') | length }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "[{{ m.role }}]{% endfor %}{% generation %}gen{% endgeneration %}"
    )
    out = render_template(source, [{"role": "user", "content": "ü"}, {"role": "x", "content": ""}])
    assert out == (
        '[{"role": "user", "content": "ü"}, {"role": "x", "content": ""}]|{\n "a": "ü",\n "b": 1\n}|4[user]gen'
    )
    with pytest.raises(ChatTemplateError, match="boom"):
        render_template("{{ raise_exception('boom') }}", [])
    with pytest.raises(ChatTemplateError, match="cannot parse"):
        render_template("{% if %}", [])


def test_templates_are_sandboxed():
    with pytest.raises(ChatTemplateError):
        render_template("{{ messages.append(1) }}", [])


def render_case(tok: Tokenizer, case: dict, messages: list | None = None, **variables) -> str:
    """A recorded case through swapmoe's ChatTemplate: its tools and variables (or `variables`)."""
    template = ChatTemplate(tok, PROMPTS["case_sources"][case["template"]])
    tools = {"tools": case["tools"]} if case["tools"] else {}
    return template.render(
        case["messages"] if messages is None else messages,
        case["add_generation_prompt"],
        **tools,
        **(variables or case["variables"]),
    )


def openai_arguments(messages: list[dict]) -> list[dict]:
    """The messages with tool-call arguments as JSON strings, as OpenAI's API has them."""

    def call(c: dict) -> dict:
        return {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}

    return [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def test_cases_cover_qwen35_and_laguna():
    assert {"Qwen3.5-4B:thinking", "Qwen3.5-4B:no-thinking", "Qwen3.5-4B:tool-call"} <= set(CASES)
    assert "enable_thinking" in PROMPTS["case_sources"]["Qwen3.5-4B.jinja"]
    names = {name.split(":")[1] for name in CASES}
    assert len(names) >= 13 and {f"{template}:{name}" for template in LAGUNA for name in names} <= set(CASES)
    # every case's text is transformers' own (apply_chat_template's steps, in another Python) where that was run
    assert PROMPTS["case_check"]["differ"] == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_renders_as_hugging_face(vocab, name):
    """swapmoe's prompt is the text transformers renders the template to, and llama.cpp's chat layer's,
    with tool-call arguments as dicts and as JSON strings; where the template raises, all three do."""
    case = CASES[name]
    tok = vocab("qwen35")
    if case["text"] is None:
        assert case["llama_cpp"] is None
        with pytest.raises(ChatTemplateError, match=re.escape(case["error"])):
            render_case(tok, case)
        return
    text = render_case(tok, case)
    assert text == case["text"]
    if case["llama_cpp"] is not None:
        assert text == case["llama_cpp"]
    if case["tools"] and any(m.get("tool_calls") for m in case["messages"]):
        assert render_case(tok, case, openai_arguments(case["messages"])) == text


def test_qwen35_thinking_on_and_off(vocab):
    tok = vocab("qwen35")
    on, off = CASES["Qwen3.5-4B:thinking"], CASES["Qwen3.5-4B:no-thinking"]
    assert on["messages"] == off["messages"] and on["variables"] == {"enable_thinking": True}
    assert off["variables"] == {"enable_thinking": False}
    assert on["text"].endswith("<|im_start|>assistant\n<think>\n")
    assert off["text"] == on["text"] + "\n</think>\n\n"  # an empty thought: the model answers at once
    assert render_case(tok, off) == off["text"] != render_case(tok, on)
    # llama.cpp's default (and the template's when the variable is missing) is thinking on
    assert ChatTemplate(tok, PROMPTS["case_sources"]["Qwen3.5-4B.jinja"]).render(on["messages"]) == on["text"]


def test_qwen35_tool_call_turn(vocab):
    tok = vocab("qwen35")
    case = CASES["Qwen3.5-4B:tool-call"]
    text = case["text"]
    assert [m["role"] for m in case["messages"]] == ["system", "user", "assistant", "user", "assistant", "tool", "tool"]
    assert text.startswith(
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", '
    )
    assert "Paris or 東京" in text and text.count("<tool_call>\n<function=get_weather>\n") == 2
    assert "<think>\nTwo cities: two calls.\n</think>\n\nLet me check both cities.\n\n<tool_call>" in text
    assert '<parameter=days>\n2\n</parameter>\n<parameter=fields>\n["temp", "wind"]\n</parameter>' in text
    assert text.endswith("<tool_response>\n晴れ, 25°C\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert render_case(tok, case) == text

    # OpenAI-style JSON-string arguments: parsed for a template that reads them as an object, as llama.cpp does
    openai = openai_arguments(case["messages"])
    assert isinstance(openai[4]["tool_calls"][0]["function"]["arguments"], str)
    kept = json.dumps(openai)
    assert render_case(tok, case, openai) == text
    assert json.dumps(openai) == kept  # the caller's messages are left as they are
    with pytest.raises(ChatTemplateError, match="mapping"):  # transformers passes them through: |items fails
        render_template(PROMPTS["case_sources"]["Qwen3.5-4B.jinja"], openai, tools=case["tools"])
    openai[4]["tool_calls"][1]["function"]["arguments"] = "{city: Paris"
    with pytest.raises(ChatTemplateError, match="tool call arguments are not JSON"):
        render_case(tok, case, openai)


def test_string_arguments_parsed_only_for_templates_that_read_objects(synthetic):
    """As llama.cpp: a template that prints the arguments gets the JSON string as given."""
    messages = [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    ]
    loop = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments %s }}{% endfor %}{% endfor %}"

    def render(expression: str) -> str:
        return apply_chat_template(synthetic, messages, template=loop.replace("%s", expression))

    assert render("") == '{"a": 1}'
    assert render("| tojson(indent=1)") == '{\n "a": 1\n}' and render(".a") == "1"
    # a call without the "function" wrapper, for a template that takes both shapes (as Qwen's do)
    bare = [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": '{"a": 1}'}]}]
    either = loop.replace(
        "{{ c.function.arguments %s }}", "{% set f = c.function if c.function is defined else c %}{{ f.arguments.a }}"
    )
    assert apply_chat_template(synthetic, bare, template=either) == "1"


def test_laguna_cases():
    """What the Laguna templates do with the cases (each text checked against transformers and
    llama.cpp above): a leading 〈|EOS|〉, thinking, a default system message, tool calls."""
    for template in LAGUNA:
        for name, case in CASES.items():
            if name.startswith(template + ":"):
                assert case["text"].startswith("〈|EOS|〉") and case["llama_cpp"] == case["text"], name
    xs, s = "poolside-Laguna-XS.2", "poolside-Laguna-S-2.1"
    assert CASES[f"{xs}:thinking"]["text"].endswith("<assistant>\n<think>")
    assert CASES[f"{xs}:no-thinking"]["text"].endswith("<assistant>\n</think>")
    assert CASES[f"{s}:thinking"]["text"].endswith("<assistant><think>")
    default_system = "You are a helpful, conversationally-fluent assistant made by Poolside."
    assert default_system in CASES[f"{xs}:no-system"]["text"] and default_system in CASES[f"{s}:no-system"]["text"]
    assert "<system>" not in CASES["poolside-Laguna-XS-2.1:no-system"]["text"]  # XS-2.1 has no default
    assert "<system>" not in CASES[f"{s}:empty-system"]["text"]  # an empty system message opts out
    call = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>"
    assert call in CASES[f"{xs}:tool-call"]["text"]
    assert (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>東京</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call></assistant>"
    ) in CASES[f"{s}:tool-call"]["text"]
    # S-2.1 drops earlier turns' reasoning when thinking is off, unless preserve_thinking
    reasoning = "<think>17·20 = 340, 17·3 = 51: 391.</think>"
    assert reasoning not in CASES[f"{s}:multi-turn-no-thinking"]["text"]
    assert reasoning in CASES[f"{s}:preserve-thinking"]["text"]


@pytest.mark.parametrize("template", ["poolside-Laguna-XS.2", "poolside-Laguna-XS-2.1"])
def test_laguna_thinking_default_is_llama_cpps(vocab, template):
    """The XS templates default enable_thinking to false; llama.cpp's chat layer (and so swapmoe)
    always passes it, true unless asked otherwise: the prompt ends in <think>, not </think>."""
    tok = vocab("qwen35")
    on, off = CASES[f"{template}:thinking"], CASES[f"{template}:no-thinking"]
    source = PROMPTS["case_sources"][f"{template}.jinja"]
    assert ChatTemplate(tok, source).render(on["messages"]) == on["text"]
    assert render_template(source, on["messages"]) == off["text"]  # the template alone, as transformers


def test_laguna_reads_arguments_as_an_object(vocab):
    """The Laguna templates iterate the arguments (`.items()`): OpenAI-style JSON strings are parsed
    first, as llama.cpp does; given to the template as they are they fail, as in transformers."""
    case = CASES["poolside-Laguna-S-2.1:tool-call"]
    openai = openai_arguments(case["messages"])
    assert render_case(vocab("qwen35"), case, openai) == case["text"]
    with pytest.raises(ChatTemplateError, match="items"):
        render_template(PROMPTS["case_sources"][case["template"]], openai, tools=case["tools"])


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ 'x' * 10**10 }}", "computes 10 \\*\\* 10|repeated"),
        ("{{ 'x' * 100000000 }}", "repeated string"),
        ("{% for i in range(10**9) %}{% endfor %}", "computes|range"),
        ("{% for i in range(1000000) %}{% endfor %}", "range"),
        ("{{ 'x' | center(10**9) }}", "centered"),
        ("{{ messages | tojson(indent=100000) }}", "indent"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed"),
    ],
)
def test_hostile_templates_are_bounded(template, message):
    with pytest.raises(ChatTemplateError, match=message):
        render_template(template, [{"role": "user", "content": "hi"}])


def test_template_errors_name_the_model_file(vocab_dir):
    path = vocab_dir / "ggml-vocab-qwen2.gguf"
    tokenizer = Tokenizer.from_gguf(path)
    with pytest.raises(ChatTemplateError, match=f"^{re.escape(str(path))}: chat template: boom") as caught:
        apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}], template="{{ raise_exception('boom') }}")
    assert caught.value.reason == "boom"
