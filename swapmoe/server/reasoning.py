"""A thinking model's reply split into `reasoning_content` and `content`, as llama-server's
default reasoning format does: the text between `<think>` and `</think>` is reasoning, where the
reply opens with `<think>` or the chat template already opened it at the end of the prompt
(Qwen3, Qwen3.5, DeepSeek-R1, MiniMax-M2 templates)."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def thinks(tokenizer) -> bool:
    """Whether the vocabulary has the tags (a template that thinks writes them as tokens)."""
    return OPEN in tokenizer.token_ids and CLOSE in tokenizer.token_ids


def opened_by(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a `<think>` open (the reply starts inside it)."""
    return prompt_text.rstrip().endswith(OPEN)


class ReasoningSplit:
    """Feed text pieces in order; each push returns (reasoning, content) of what is certain so far.
    A piece that may be the start of a tag is held back until the next one decides it."""

    def __init__(self, inside: bool):
        self.inside = inside
        self.at_start = not inside  # only a reply's first non-blank text may open a <think>
        self.skip_blanks = inside  # blanks right after either tag are dropped
        self.pending = ""

    def push(self, text: str) -> tuple[str, str]:
        self.pending += text
        reasoning, content = [], []
        while self.pending:
            if self.at_start:
                stripped = self.pending.lstrip()
                if not stripped:
                    break  # only blanks so far: wait
                if stripped.startswith(OPEN):
                    self.pending, self.inside, self.at_start, self.skip_blanks = (
                        stripped[len(OPEN) :],
                        True,
                        False,
                        True,
                    )
                    continue
                if OPEN.startswith(stripped):
                    break  # may still become <think>
                self.at_start = False
            if not self.inside:
                self._skip_blanks()
                content.append(self.pending)
                self.pending = ""
                break
            self._skip_blanks()
            end = self.pending.find(CLOSE)
            if end >= 0:
                reasoning.append(self.pending[:end])
                self.pending, self.inside, self.skip_blanks = self.pending[end + len(CLOSE) :], False, True
                continue
            keep = _partial_tail(self.pending, CLOSE)
            reasoning.append(self.pending[: len(self.pending) - keep])
            self.pending = self.pending[len(self.pending) - keep :]
            break
        return "".join(reasoning), "".join(content)

    def _skip_blanks(self) -> None:
        if self.skip_blanks:
            self.pending = self.pending.lstrip()
            self.skip_blanks = not self.pending

    def flush(self) -> tuple[str, str]:
        """The end of the reply: whatever is held back, where it belongs."""
        rest, self.pending = self.pending, ""
        return (rest, "") if self.inside else ("", rest)


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
