"""Chat templates: rendered like Hugging Face, prompts like llama.cpp's chat layer (recorded by
tools/make_tokenizer_fixtures.py with llama-completion --jinja)."""
from __future__ import annotations

import json
from datetime import datetime

import pytest

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import chat
from swapmoe.runtime.chat import ChatTemplate, ChatTemplateError, apply_chat_template, render_template
from swapmoe.runtime.tokenizer import Tokenizer

from conftest import DATA, read_zst

PROMPTS = json.loads(read_zst(DATA / "tokenizer" / "templates.json.zst"))
MESSAGES = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]


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
    assert prompt == ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                      "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n")
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
        "<|im_start|>assistant\n")
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
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "<|channel|>final<|message|>Hello"},
                {"role": "user", "content": "More"}]
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
    source = ("{{ messages | tojson }}|{{ {'b': 1, 'a': 'ü'} | tojson(indent=1, sort_keys=True) }}|"
              "{{ strftime_now('%Y') | length }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
              "[{{ m.role }}]{% endfor %}{% generation %}gen{% endgeneration %}")
    out = render_template(source, [{"role": "user", "content": "ü"}, {"role": "x", "content": ""}])
    assert out == ('[{"role": "user", "content": "ü"}, {"role": "x", "content": ""}]|{\n "a": "ü",\n "b": 1\n}|'
                   "4[user]gen")
    with pytest.raises(ChatTemplateError, match="boom"):
        render_template("{{ raise_exception('boom') }}", [])
    with pytest.raises(ChatTemplateError, match="cannot parse"):
        render_template("{% if %}", [])


def test_templates_are_sandboxed():
    with pytest.raises(ChatTemplateError):
        render_template("{{ messages.append(1) }}", [])
