"""A thinking model's reply split into reasoning_content and content (swapmoe.server.reasoning),
and the server's reply assembly around it (worker.Reply) with a scripted token stream."""

import pytest

from swapmoe.runtime.model import Sequence
from swapmoe.server.protocol import Generation
from swapmoe.server.reasoning import ReasoningSplit, opened_by
from swapmoe.server.worker import Done, Job, Reply, Text

CASES = [
    # (the template left <think> open, reply text, reasoning, content)
    (False, "<think>\nI should greet.\n</think>\n\nHello!", "I should greet.\n", "Hello!"),
    (True, "\nI should greet.</think>Hello!", "I should greet.", "Hello!"),
    (True, "a </thin k</think>  Hi", "a </thin k", "Hi"),
    (False, "  Hello <think> is literal here", "", "  Hello <think> is literal here"),
    (False, " <thinking", "", " <thinking"),
    (True, "never closed <", "never closed <", ""),
]


@pytest.mark.parametrize("inside, text, reasoning, content", CASES)
def test_split_at_every_boundary(inside, text, reasoning, content):
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            split = ReasoningSplit(inside)
            parts = [split.push(text[:cut]), split.push(text[cut:second]), split.push(text[second:]), split.flush()]
            assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (reasoning, content), (cut, second)


def test_a_prompt_ending_in_an_open_think_starts_inside():
    assert opened_by("<|im_start|>assistant\n<think>\n")
    assert not opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")


class _Tokens:
    """A tokenizer whose token i is the i-th piece of a script."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decoder(self):
        pieces = self.pieces

        class Decoder:
            def push(self, token):
                return pieces[token]

            def flush(self):
                return ""

        return Decoder()


class _Loop:
    def call_soon_threadsafe(self, fn, *args):
        fn(*args)


class _Events(list):
    def put_nowait(self, event):
        self.append(event)


def _reply(pieces, stop=(), inside=False):
    request = Generation(prompt="", chat=True, max_tokens=None, stop=list(stop), stream=True, include_usage=False)
    job = Job(request, [1, 2, 3], ReasoningSplit(inside), _Loop(), _Events())
    seq = Sequence(conversation=None, routing=None, sampler=None, stop=set(), max_tokens=len(pieces), history=[])
    reply = Reply(job, seq, _Tokens(pieces), 0.0)
    for i in range(len(pieces)):
        seq.token, seq.generated = i, i + 1
        seq.finished = "length" if i + 1 == len(pieces) else None
        if reply.take():
            break
    reply.end()
    texts = [e for e in job.events if isinstance(e, Text)]
    return "".join(e.reasoning for e in texts), "".join(e.content for e in texts), job.events[-1]


def test_reply_streams_reasoning_then_content():
    thought, content, done = _reply(["<think>", "\nplan", " it", "</think>", "\n\n", "Do", " it."])
    assert (thought, content) == ("plan it", "Do it.")
    assert isinstance(done, Done) and done.finish == "length"


def test_a_stop_string_inside_the_content_ends_it():
    thought, content, done = _reply(["plan", "</think>", "Do", " it", " STOP", " more"], stop=["STOP"], inside=True)
    assert (thought, content, done.finish) == ("plan", "Do it ", "stop")
