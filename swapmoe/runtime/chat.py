"""Chat prompts from the model's own Jinja chat template (`tokenizer.chat_template`).

    template = ChatTemplate.from_gguf(path)        # or ChatTemplate(tokenizer)
    text = template.render(messages)               # the whole prompt: encode(text, add_special=False)
    text = apply_chat_template(tokenizer, messages)  # llama.cpp's text: encode(text) adds BOS itself

Rendered as Hugging Face's `apply_chat_template` does: jinja2's ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loop-controls extension, `{% generation %}` blocks,
`raise_exception` and `strftime_now` functions and a `tojson` filter that keeps non-ASCII
text; variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` plus any extra
ones (`tools`, `enable_thinking`, ...).

Both also do what llama.cpp's chat layer (common/chat.cpp) does around the template, so that
the prompt tokens are llama.cpp's: bos_token / eos_token are those tokens' text; a BOS (EOS)
text the template writes at the start (end) is dropped when the tokenizer adds that token
itself (render() then puts it back once), so the prompt has it exactly once; `enable_thinking` (true),
`date_string` and `datetime` have llama.cpp's defaults; a "developer" message becomes "system"
(except for gpt-oss templates); a system message is merged into the next message for
templates that do not use it (e.g. Mixtral's, Gemma's); tool-call arguments given as JSON
strings (OpenAI's format; Hugging Face expects dicts) are parsed for templates that read them
as an object (e.g. Qwen3.5's), found by llama.cpp's probe; and the checks llama.cpp patches out
of the gpt-oss and Mistral templates are patched out here too.
"""
from __future__ import annotations

import json
import time
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable

from swapmoe.errors import SwapmoeError


class ChatTemplateError(SwapmoeError):
    """The template called raise_exception(), or cannot be parsed or rendered. `reason` is the
    message without the model file's name (for clients of a server, who should not see paths)."""

    def __init__(self, reason: str, source: str | None = None):
        super().__init__(f"{source}: chat template: {reason}" if source else reason)
        self.reason = reason


# Templates come from strangers' files: bounds on what one rendering may build and how long it
# may run (a real template renders a conversation in milliseconds and a few hundred kB)
MAX_TEXT = 1 << 24  # characters in the prompt, and in any string or list the template builds
MAX_RANGE = 1 << 16  # items in one range()
MAX_SECONDS = 10.0


def _bounded_range(*args):
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise ChatTemplateError(f"the chat template asks for range() of {len(items)} items (at most {MAX_RANGE})")
    return items


def _bounded_size(size: int, what: str) -> None:
    if size > MAX_TEXT:
        raise ChatTemplateError(f"the chat template builds {what} of {size} items (at most {MAX_TEXT})")


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    if isinstance(indent, int) and not 0 <= indent <= 64:
        raise ChatTemplateError(f"the chat template asks tojson for an indent of {indent} (0..64)")
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    _bounded_size(len(text), "a JSON text")
    return text


def _center(value: Any, width: int = 80) -> str:
    _bounded_size(int(width), "a centered string")
    return str(value).center(int(width))


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError, nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """{% generation %}...{% endgeneration %}: Hugging Face uses it to mark the assistant's
        text for training masks; it renders as its body."""
        tags = {"generation"}

        def parse(self, parser) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, and no string or list repeated past MAX_TEXT, no huge powers."""
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                        _bounded_size(len(seq) * count, "a repeated string or list")
            elif isinstance(right, int) and isinstance(left, int) and abs(right) > 4096 and abs(left) > 1:
                raise ChatTemplateError(f"the chat template computes {left} ** {right}")
            return super().call_binop(context, operator, left, right)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock])
    env.globals["range"] = _bounded_range
    env.filters["center"] = _center
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ChatTemplateError(f"cannot parse the chat template: {e}") from None


def render_template(source: str, messages: Iterable[dict[str, Any]], add_generation_prompt: bool = True,
                    bos_token: str = "", eos_token: str = "", **variables: Any) -> str:
    """Render a Jinja chat template with `messages` ([{"role": ..., "content": ...}, ...])."""
    from jinja2 import TemplateError

    template = _compile(source)
    try:
        pieces, size, deadline = [], 0, time.monotonic() + MAX_SECONDS
        for piece in template.generate(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, **variables):
            pieces.append(piece)
            size += len(piece)
            _bounded_size(size, "a prompt")
            if time.monotonic() > deadline:
                raise ChatTemplateError(f"the chat template ran for over {MAX_SECONDS:.0f} s")
        return "".join(pieces)
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateError("the chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory") from None
    except TemplateError as e:
        raise ChatTemplateError(f"cannot render the chat template: {e}") from None
    except (TypeError, ValueError, LookupError, ArithmeticError) as e:  # e.g. `|items` of a string
        raise ChatTemplateError(f"cannot render the chat template: {type(e).__name__}: {e}") from None


class ChatTemplate:
    """A model's chat template with its tokenizer's BOS/EOS rules."""

    def __init__(self, tokenizer, template: str | None = None):
        """template: Jinja source to use instead of the model's own (e.g. for a GGUF without one)."""
        self.tokenizer, self.template = tokenizer, template

    @classmethod
    def from_gguf(cls, path, template: str | None = None) -> "ChatTemplate":
        from swapmoe.runtime.tokenizer import Tokenizer

        return cls(Tokenizer.from_gguf(path), template)

    def render(self, messages: Iterable[dict[str, Any]], add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The whole prompt text, BOS (EOS) text included once where the tokenizer adds it: the
        same token ids as llama.cpp with `tokenizer.encode(text, add_special=False)`."""
        tok = self.tokenizer
        prompt = apply_chat_template(tok, messages, add_generation_prompt, self.template, **variables)
        if tok.add_bos:
            prompt = _special_text(tok, tok.bos_id) + prompt
        if tok.add_eos:
            prompt += _special_text(tok, tok.eos_id)
        return prompt


def apply_chat_template(tokenizer, messages: Iterable[dict[str, Any]], add_generation_prompt: bool = True,
                        template: str | None = None, **variables: Any) -> str:
    """The prompt text for `messages` in the model's chat format as llama.cpp makes it, for
    `tokenizer.encode(prompt)` (add_special=True: the tokenizer adds BOS/EOS where it does).

    template: Jinja source to use instead of the model's own (e.g. for a GGUF without one).
    """
    source = template if template is not None else tokenizer.chat_template
    if not source:
        raise SwapmoeError(f"{tokenizer.source}: the model has no chat template (tokenizer.chat_template); "
                           "pass one with template=..., or give the prompt as plain text")
    for marker, check in _LLAMA_CPP_TEMPLATE_PATCHES:
        if marker in source:
            source = source.replace(check, "{%- if false %}")
    bos = _special_text(tokenizer, tokenizer.bos_id)
    eos = _special_text(tokenizer, tokenizer.eos_id)
    now = datetime.now()
    variables = {"enable_thinking": True, "date_string": now.strftime("%d %b %Y"),
                 "datetime": now.strftime("%b %d %Y"), **variables}
    messages = _adapt_messages(source, list(messages))
    try:
        prompt = render_template(source, messages, add_generation_prompt, bos_token=bos, eos_token=eos,
                                 **variables)
    except ChatTemplateError as e:
        raise ChatTemplateError(e.reason, getattr(tokenizer, "source", None)) from None
    if tokenizer.add_bos and bos and prompt.startswith(bos):
        prompt = prompt[len(bos):]
    if tokenizer.add_eos and eos and prompt.endswith(eos):
        prompt = prompt[:-len(eos)]
    return prompt


# Checks that raise on messages llama.cpp passes (reasoning in gpt-oss content, empty Mistral
# tool-call content): llama.cpp replaces them by `if false` (common_chat_templates_init).
_LLAMA_CPP_TEMPLATE_PATCHES = [
    ("<|channel|>", '{%- if "<|channel|>analysis<|message|>" in message.content or '
                    '"<|channel|>final<|message|>" in message.content %}'),
    ("[TOOL_CALLS]", "{%- if (message['content'] is none or message['content'] == '' or "
                     "message['content']|length == 0) and (message['tool_calls'] is not defined or "
                     "message['tool_calls'] is none or message['tool_calls']|length == 0) %}"),
]


def _special_text(tokenizer, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes(token_id, special=True).decode("utf-8", "replace")


def _adapt_messages(source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama.cpp's message workarounds: developer -> system, system merged where unsupported,
    JSON-string tool-call arguments parsed for templates that read them as objects."""
    if any(isinstance(_call_function(call).get("arguments"), str) for m in messages
           for call in (m.get("tool_calls") or ())) and _uses_object_arguments(source):
        messages = [{**m, "tool_calls": [_parse_arguments(call) for call in m["tool_calls"]]} if m.get("tool_calls")
                    else m for m in messages]
    if "<|channel|>" not in source:
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    if messages and messages[0].get("role") == "system" and not _supports_system_role(source):
        if len(messages) > 1:
            merged = {**messages[1], "content": f"{messages[0]['content']}\n{messages[1]['content']}"}
            messages = [merged, *messages[2:]]
        else:
            messages = []
    return messages


@lru_cache(maxsize=16)
def _supports_system_role(source: str) -> bool:
    """Whether the template shows a system message (llama.cpp probes the template the same way)."""
    probe = [{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}]
    try:
        return "System message" in render_template(source, probe)
    except SwapmoeError:
        return False


def _call_function(call: Any) -> dict[str, Any]:
    """The {"name", "arguments"} part of a tool call, OpenAI style ({"type", "function": {...}}) or bare."""
    if not isinstance(call, dict):
        return {}
    function = call.get("function")
    return function if isinstance(function, dict) else call


def _parse_arguments(call: Any) -> Any:
    function = _call_function(call)
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError as e:
        raise ChatTemplateError(f"tool call arguments are not JSON ({e}): {arguments!r}") from None
    if function is call:
        return {**call, "arguments": parsed}
    return {**call, "function": {**function, "arguments": parsed}}


class _ArgumentsProbe(dict):
    """Tool-call arguments that note whether the template reads their values."""

    read = False

    def __getitem__(self, key):
        self.read = True
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read = True
        return super().get(key, default)

    def items(self):
        self.read = True
        return super().items()

    def values(self):
        self.read = True
        return super().values()


@lru_cache(maxsize=16)
def _uses_object_arguments(source: str) -> bool:
    """Whether the template reads tool-call arguments as an object (a mapping), as llama.cpp
    probes it (supports_object_arguments): then it parses OpenAI-style JSON-string arguments."""
    arguments = _ArgumentsProbe(arg="value")
    probe = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": arguments}}]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]
    tools = [{"name": "tool", "type": "function", "function": {
        "name": "tool1", "description": "Tool description",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                       "required": ["arg"]}}}]
    try:
        render_template(source, probe, tools=tools)
    except SwapmoeError:
        return False
    return arguments.read
