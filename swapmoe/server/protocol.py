"""The OpenAI request fields swapmoe serves, checked: a bad field is a 400 in OpenAI's error shape
naming the field, never a traceback."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class APIError(Exception):
    """An error the client caused (or, with status >= 500, the server): OpenAI's JSON error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """What to generate, from either endpoint: the prompt (chat messages or text), how much, how."""

    prompt: str
    chat: bool
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # None: none; else how many alternatives per token (top_logprobs)
    ignore_eos: bool = False  # llama-server's extension: generate past end-of-generation tokens
    reasoning: bool = True  # a thinking model's <think> text goes to reasoning_content (chat)
    sampling: dict[str, Any] = field(default_factory=dict)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)


def _number(
    body: dict, name: str, kind: type, low: float | None = None, high: float | None = None, default: Any = None
) -> Any:
    value = body.get(name)
    if value is None:
        return default
    whole = isinstance(value, (int, float)) and math.isfinite(value) and float(value).is_integer()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not whole):
        raise APIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, not {value!r}", name)
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise APIError(400, f"'{name}' must be {bounds}, not {value!r}", name)
    return kind(value)


def flag(body: dict, name: str) -> bool:
    """A true/false field (false when absent)."""
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise APIError(400, f"'{name}' must be true or false", name)
    return value


def _text_content(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"{where}: only text content parts are supported", where)
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(400, f"{where} must be a string or a list of text parts", where)


def _common(body: dict, chat: bool) -> dict[str, Any]:
    if body.get("n", 1) != 1:
        raise APIError(400, "only n = 1 is supported", "n")
    if chat:
        wanted = flag(body, "logprobs")
        top = _number(body, "top_logprobs", int, 0, 20, 0)
        if top and not wanted:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = top if wanted else None
    else:
        logprobs = _number(body, "logprobs", int, 0, 5)
    max_tokens = _number(
        body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens", int, low=1
    )
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        stops = list(stop)
    else:
        raise APIError(400, "'stop' must be a string or a list of up to 16 strings", "stop")
    stream = flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "'stream_options' must be an object", "stream_options")
    sampling = {
        # unset: llama-server's defaults
        "temperature": _number(body, "temperature", float, 0.0, 2.0, 0.8),
        "top_p": _number(body, "top_p", float, 0.0, 1.0, 0.95),
        "top_k": _number(body, "top_k", int, 0, None, 40),
        "min_p": _number(body, "min_p", float, 0.0, 1.0, 0.05),
        "repeat_penalty": _number(body, "repeat_penalty", float, 0.0, None, 1.0),
        "presence_penalty": _number(body, "presence_penalty", float, -2.0, 2.0, 0.0),
        "frequency_penalty": _number(body, "frequency_penalty", float, -2.0, 2.0, 0.0),
        "seed": _number(body, "seed", int, 0, 2**63 - 1),
    }
    ignore_eos = flag(body, "ignore_eos")
    if sampling["repeat_penalty"] == 0.0:
        raise APIError(400, "'repeat_penalty' must be above 0", "repeat_penalty")
    return dict(
        max_tokens=max_tokens,
        stop=[s for s in stops if s],
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        logprobs=logprobs,
        sampling=sampling,
        ignore_eos=ignore_eos,
    )


def chat_request(body: dict) -> Generation:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", "messages")
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            raise APIError(400, f"{where} needs a role of system, user, assistant or tool", where)
        out = {
            k: v for k, v in message.items() if k in ("role", "name", "tool_calls", "tool_call_id", "reasoning_content")
        }
        out["role"] = "system" if message["role"] == "developer" else message["role"]
        out["content"] = _text_content(message.get("content"), f"{where}.content")
        checked.append(out)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise APIError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs")
    if body.get("tools") is not None:
        if not isinstance(body["tools"], list):
            raise APIError(400, "'tools' must be a list", "tools")
        kwargs = {**kwargs, "tools": body["tools"]}
    reasoning_format = body.get("reasoning_format", "auto")
    if reasoning_format not in ("auto", "deepseek", "none"):
        raise APIError(400, "'reasoning_format' must be auto, deepseek or none", "reasoning_format")
    return Generation(
        prompt="",
        chat=True,
        messages=checked,
        template_kwargs=kwargs,
        reasoning=reasoning_format != "none",
        **_common(body, chat=True),
    )


def completion_request(body: dict) -> Generation:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(400, "'prompt' must be a non-empty string", "prompt")
    return Generation(prompt=prompt, chat=False, **_common(body, chat=False))
