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
import math
import re
import threading
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
MAX_TEXT = 1 << 24  # characters in the prompt, and in any string the template builds
MAX_ITEMS = 1 << 20  # items in any list the template builds (each costs a pointer, and more as text)
MAX_RANGE = 1 << 16  # items in one range(), lines wordwrap() makes, slices slice() makes
MAX_NUMBER_BITS = 1 << 16  # bits of an integer a product or power may make
MAX_SECONDS = 10.0
MAX_REASON = 500  # characters of a raise_exception() message shown
_NUMBER_DIGITS = 9  # a width or precision of more digits exceeds MAX_TEXT anyway
_render = threading.local()  # .deadline: the monotonic time the rendering under way in this thread must end by


def _check_time() -> None:
    """Called at every loop step, call and attribute of a rendering: templates cannot run long
    without doing one of those."""
    if time.monotonic() > getattr(_render, "deadline", math.inf):
        raise ChatTemplateError(f"the chat template ran for over {MAX_SECONDS:.0f} s")


def _bounded_range(*args):
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise ChatTemplateError(f"the chat template asks for range() of {len(items)} items (at most {MAX_RANGE})")
    return items


def _bounded_size(size: int, what: str, limit: int = MAX_TEXT) -> None:
    if size > limit:
        raise ChatTemplateError(f"the chat template builds {what} of {size} items (at most {limit})")


def _limit(seq: Any) -> int:
    return MAX_TEXT if isinstance(seq, str) else MAX_ITEMS


def _bounded_bits(bits: int, left: int, operator: str, right: int) -> None:
    if bits > MAX_NUMBER_BITS:
        raise ChatTemplateError(
            f"the chat template computes {left if left.bit_length() < 64 else 'a huge number'} "
            f"{operator} {right if right.bit_length() < 64 else 'a huge number'}"
        )


def _formatted_size(fmt: str, args: Any) -> int:
    """At most how long `fmt % args` or `fmt.format(*args)` is: fmt, the widths and precisions
    written in it, the values' text, and the integers among the values where fmt takes a width
    or precision from them (`*`, or a field inside a format spec)."""
    values = (
        list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, (tuple, list)) else [args]
    )
    size = len(fmt) + sum(len(v) for v in values if isinstance(v, str))
    for digits in re.findall(r"\d+", fmt):
        size += int(digits) if len(digits) <= _NUMBER_DIGITS else MAX_TEXT + 1
    if "*" in fmt or re.search(r"\{[^{}]*\{", fmt):
        size += sum(abs(v) for v in values if isinstance(v, int))
    return size


def _method_size(method: Any, args: tuple) -> int | None:
    """At most how long the string a str method call makes is, for those that can make one much
    longer than their arguments; None for any other call."""
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, str):
        return None
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        return max(len(text), args[0])
    if name == "expandtabs":
        return len(text) + text.count("\t") * (args[0] if args and isinstance(args[0], int) else 8)
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        return _replaced_size(text, *args[:3])
    if name == "join" and args and isinstance(args[0], (list, tuple, str)):
        return len(text) * max(0, len(args[0]) - 1) + sum(len(v) for v in args[0] if isinstance(v, str))
    return None


def _replaced_size(text: str, old: str, new: str, count: int | None = None) -> int:
    found = text.count(old) if old else len(text) + 1
    if count is not None and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def _raise_exception(message: str):
    raise ChatTemplateError(str(message)[:MAX_REASON])


def _strftime_now(format: str) -> str:
    _bounded_size(_formatted_size(format, ()), "a date")
    return datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    if isinstance(indent, int) and not 0 <= indent <= 64:
        raise ChatTemplateError(f"the chat template asks tojson for an indent of {indent} (0..64)")
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    _bounded_size(len(text), "a JSON text")
    return text


def _center(value: Any, width: int = 80) -> str:
    _bounded_size(int(width), "a centered string")
    return str(value).center(int(width))


def _bounded_filters(filters: dict) -> dict:
    """Jinja's filters that can make far more than they are given, each checked first."""
    replace, join, indent, wordwrap, slice_, format_ = (
        filters[name] for name in ("replace", "join", "indent", "wordwrap", "slice", "format")
    )

    def bounded_replace(eval_ctx, s, old, new, count=None):
        _bounded_size(_replaced_size(str(s), str(old), str(new), count), "a replaced string")
        return replace(eval_ctx, s, old, new, count)

    def bounded_join(eval_ctx, value, d="", attribute=None):
        items = value if isinstance(value, (str, list, tuple)) else list(value)
        _bounded_size(len(str(d)) * max(0, len(items) - 1), "a joined string")
        return join(eval_ctx, items, d, attribute)

    def bounded_indent(s, width=4, first=False, blank=False):
        pad = width if isinstance(width, int) else len(str(width))
        _bounded_size(len(str(s)) + (str(s).count("\n") + 1) * pad, "an indented string")
        return indent(s, width, first, blank)

    def bounded_wordwrap(environment, s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
        if len(str(s)) // max(1, int(width)) > MAX_RANGE:
            raise ChatTemplateError(
                f"the chat template wraps {len(str(s))} characters at {width} (at most {MAX_RANGE} lines)"
            )
        return wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)

    def bounded_slice(value, slices, fill_with=None):
        if int(slices) > MAX_RANGE:
            raise ChatTemplateError(f"the chat template asks for {slices} slices (at most {MAX_RANGE})")
        return slice_(value, slices, fill_with)

    def bounded_format(value, *args, **kwargs):
        _bounded_size(_formatted_size(str(value), kwargs or args), "a formatted string")
        return format_(value, *args, **kwargs)

    for wrapper, original in ((bounded_replace, replace), (bounded_join, join), (bounded_wordwrap, wordwrap)):
        wrapper.jinja_pass_arg = original.jinja_pass_arg  # the context argument jinja hands them
    return {
        "replace": bounded_replace,
        "join": bounded_join,
        "indent": bounded_indent,
        "wordwrap": bounded_wordwrap,
        "slice": bounded_slice,
        "format": bounded_format,
        "center": _center,
        "tojson": _tojson,
    }


def _loop_steps(iterable):
    """Every `for` of a template iterates through this (see _guard_loops)."""
    for item in iterable:
        _check_time()
        yield item


def _joined(*parts) -> str:
    """The `~` operator, bounded."""
    texts = [part if isinstance(part, str) else str(part) for part in parts]
    _bounded_size(sum(map(len, texts)), "a joined string")
    return "".join(texts)


def _guard_loops(tree):
    """Route every `for` loop through _loop_steps and every `~` through _joined: a loop that
    outputs nothing and calls nothing is still timed, a doubling `s ~ s` still bounded. They are
    attributes of the environment, which a template cannot rebind (a name it could shadow)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Guard(NodeTransformer):
        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = nodes.Call(nodes.EnvironmentAttribute("loop_steps"), [node.iter], [], None, None)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            return nodes.Call(nodes.EnvironmentAttribute("joined"), node.nodes, [], None, None)

    return Guard().visit(tree)


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
        """The sandbox, timed at every call and attribute, and with no string, list or number grown
        past the bounds by an operator or a method."""

        intercepted_binops = frozenset(["*", "**", "+", "%"])
        loop_steps, joined = staticmethod(_loop_steps), staticmethod(_joined)

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                        _bounded_size(len(seq) * count, "a repeated string or list", _limit(seq))
                if isinstance(left, int) and isinstance(right, int):
                    _bounded_bits(left.bit_length() + right.bit_length(), left, "*", right)
            elif operator == "**":
                if isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                    _bounded_bits(left.bit_length() * abs(right), left, "**", right)
            elif operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    _bounded_size(len(left) + len(right), "a concatenated string or list", _limit(left))
            elif isinstance(left, str):  # %
                _bounded_size(_formatted_size(left, right), "a formatted string")
            return super().call_binop(context, operator, left, right)

        def call(self, context, obj, /, *args, **kwargs):
            _check_time()
            size = _method_size(obj, args)
            if size is not None:
                _bounded_size(size, f"with {getattr(obj, '__name__', 'a call')}() a string")
            result = super().call(context, obj, *args, **kwargs)
            if isinstance(result, (str, list, tuple)):
                _bounded_size(len(result), "a string or list", _limit(result))
            return result

        def getattr(self, obj, attribute):
            _check_time()
            value = super().getattr(obj, attribute)
            if isinstance(obj, str) and attribute in ("format", "format_map") and callable(value):

                def bounded_format(*args, **kwargs):  # the sandbox's own str.format, checked first
                    _bounded_size(_formatted_size(obj, list(args) + list(kwargs.values())), "a formatted string")
                    return value(*args, **kwargs)

                return bounded_format
            return value

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock])
    env.globals["range"] = _bounded_range
    env.globals.pop("lipsum")  # paragraphs of filler on request: no template needs it, a hostile one asks for 10**9
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters.update(_bounded_filters(env.filters))
    try:
        return env.from_string(_guard_loops(env.parse(source)))
    except TemplateError as e:
        raise ChatTemplateError(f"cannot parse the chat template: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the chat template is nested too deeply to parse") from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory while it was compiled") from None


def render_template(
    source: str,
    messages: Iterable[dict[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **variables: Any,
) -> str:
    """Render a Jinja chat template with `messages` ([{"role": ..., "content": ...}, ...])."""
    from jinja2 import TemplateError

    template = _compile(source)
    _render.deadline = time.monotonic() + MAX_SECONDS
    try:
        pieces, size = [], 0
        for piece in template.generate(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **variables,
        ):
            pieces.append(piece)
            size += len(piece)
            _bounded_size(size, "a prompt")
            _check_time()
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
        raise ChatTemplateError(f"cannot render the chat template: {type(e).__name__}: {str(e)[:MAX_REASON]}") from None
    finally:
        _render.deadline = math.inf


class ChatTemplate:
    """A model's chat template with its tokenizer's BOS/EOS rules."""

    def __init__(self, tokenizer, template: str | None = None):
        """template: Jinja source to use instead of the model's own (e.g. for a GGUF without one)."""
        self.tokenizer, self.template = tokenizer, template

    @classmethod
    def from_gguf(cls, path, template: str | None = None) -> "ChatTemplate":
        from swapmoe.runtime.tokenizer import Tokenizer

        return cls(Tokenizer.from_gguf(path), template)

    def render(self, messages: Iterable[dict[str, Any]], add_generation_prompt: bool = True, **variables: Any) -> str:
        """The whole prompt text, BOS (EOS) text included once where the tokenizer adds it: the
        same token ids as llama.cpp with `tokenizer.encode(text, add_special=False)`."""
        tok = self.tokenizer
        prompt = apply_chat_template(tok, messages, add_generation_prompt, self.template, **variables)
        if tok.add_bos:
            prompt = _special_text(tok, tok.bos_id) + prompt
        if tok.add_eos:
            prompt += _special_text(tok, tok.eos_id)
        return prompt


def apply_chat_template(
    tokenizer,
    messages: Iterable[dict[str, Any]],
    add_generation_prompt: bool = True,
    template: str | None = None,
    **variables: Any,
) -> str:
    """The prompt text for `messages` in the model's chat format as llama.cpp makes it, for
    `tokenizer.encode(prompt)` (add_special=True: the tokenizer adds BOS/EOS where it does).

    template: Jinja source to use instead of the model's own (e.g. for a GGUF without one).
    """
    source = template if template is not None else tokenizer.chat_template
    if source is not None and not isinstance(source, str):
        raise SwapmoeError(f"{tokenizer.source}: tokenizer.chat_template is a {type(source).__name__}, not a template")
    if not source:
        raise SwapmoeError(
            f"{tokenizer.source}: the model has no chat template (tokenizer.chat_template); "
            "pass one with template=..., or give the prompt as plain text"
        )
    for marker, check in _LLAMA_CPP_TEMPLATE_PATCHES:
        if marker in source:
            source = source.replace(check, "{%- if false %}")
    bos = _special_text(tokenizer, tokenizer.bos_id)
    eos = _special_text(tokenizer, tokenizer.eos_id)
    now = datetime.now()
    variables = {
        "enable_thinking": True,
        "date_string": now.strftime("%d %b %Y"),
        "datetime": now.strftime("%b %d %Y"),
        **variables,
    }
    messages = _adapt_messages(source, list(messages))
    try:
        prompt = render_template(source, messages, add_generation_prompt, bos_token=bos, eos_token=eos, **variables)
    except ChatTemplateError as e:
        raise ChatTemplateError(e.reason, getattr(tokenizer, "source", None)) from None
    if tokenizer.add_bos and bos and prompt.startswith(bos):
        prompt = prompt[len(bos) :]
    if tokenizer.add_eos and eos and prompt.endswith(eos):
        prompt = prompt[: -len(eos)]
    return prompt


# Checks that raise on messages llama.cpp passes (reasoning in gpt-oss content, empty Mistral
# tool-call content): llama.cpp replaces them by `if false` (common_chat_templates_init).
_LLAMA_CPP_TEMPLATE_PATCHES = [
    (
        "<|channel|>",
        '{%- if "<|channel|>analysis<|message|>" in message.content or '
        '"<|channel|>final<|message|>" in message.content %}',
    ),
    (
        "[TOOL_CALLS]",
        "{%- if (message['content'] is none or message['content'] == '' or "
        "message['content']|length == 0) and (message['tool_calls'] is not defined or "
        "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
    ),
]


def _special_text(tokenizer, token_id: int | None) -> str:
    if token_id is None:
        return ""
    return tokenizer.token_bytes(token_id, special=True).decode("utf-8", "replace")


def _adapt_messages(source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama.cpp's message workarounds: developer -> system, system merged where unsupported,
    JSON-string tool-call arguments parsed for templates that read them as objects."""
    if any(
        isinstance(_call_function(call).get("arguments"), str) for m in messages for call in (m.get("tool_calls") or ())
    ) and _uses_object_arguments(source):
        messages = [
            {**m, "tool_calls": [_parse_arguments(call) for call in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages
        ]
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
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": arguments}}
            ],
        },
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]
    tools = [
        {
            "name": "tool",
            "type": "function",
            "function": {
                "name": "tool1",
                "description": "Tool description",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                    "required": ["arg"],
                },
            },
        }
    ]
    try:
        render_template(source, probe, tools=tools)
    except SwapmoeError:
        return False
    return arguments.read
