"""The thread that owns the model. Requests wait in a first-come queue for one of `parallel`
slots; the sequences of all busy slots decode together, one token each per step (Model.advance:
each expert they need is read once for all of them), and each streams events (text pieces, then
the end) back to its request's event loop. A slot keeps the caches of its last request (a
Conversation), and a request goes to the free slot whose caches share the longest prefix with
its prompt, so the next turn of a chat processes only its new tokens."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.runtime.chat import ChatTemplate
from swapmoe.runtime.compare import log_softmax
from swapmoe.runtime.model import Conversation, Sequence, shared_prefix
from swapmoe.server import reasoning
from swapmoe.server.protocol import APIError, Generation
from swapmoe.server.reasoning import ReasoningSplit

TokenLogprobs = tuple[int, float, list[tuple[int, float]]]  # token, its log-probability, the top tokens'


@dataclass(frozen=True)
class Usage:
    """Tokens one request took: its prompt (of them, those its slot's caches already held) and
    its reply."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def as_dict(self) -> dict:
        """OpenAI's usage object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True)
class Text:
    """A piece of the reply: its answer and its thinking, and the log-probabilities (if asked
    for) of the tokens the piece completes."""

    content: str
    reasoning: str
    logprobs: list[TokenLogprobs] | None


@dataclass(frozen=True)
class Done:
    """The reply is complete: why it ended, its usage, its time, every token's log-probabilities
    (if asked for)."""

    finish: str
    usage: Usage
    seconds: float
    logprobs: list[TokenLogprobs] | None


@dataclass(frozen=True)
class Failed:
    """The request failed: the error its client gets."""

    error: APIError


Event = Text | Done | Failed  # what the worker thread sends a request's event loop


@dataclass
class Job:
    request: Generation
    prompt: list[int]  # the request's prompt as token ids (Worker.prompt_ids)
    reasoning: ReasoningSplit | None  # where the reply's thinking goes to reasoning_content
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Totals:
    """What /metrics reports: counters since the server started."""

    requests: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0  # wall time of the decoding steps (several sequences share one)
    decode_steps: int = 0  # decoding passes, each one token for every busy slot


class Reply:
    """One request's answer as its tokens come: the text (held back while it may be the start of
    a stop string), the log-probabilities if asked for, and why it ended."""

    def __init__(self, job: Job, seq: Sequence, tokenizer, started: float):
        self.job, self.seq, self.started = job, seq, started
        self.decoder = tokenizer.decoder()
        self.stops = job.request.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # may be the start of a stop string
        self.text, self.sent, self.finish = "", 0, None
        self.logprobs = [] if job.request.logprobs is not None else None
        self.logprobs_sent = 0  # of them, those whose text went out

    def take(self) -> bool:
        """Take the sequence's newest token (if any); True when the reply is complete."""
        seq, request = self.seq, self.job.request
        if self.job.cancelled.is_set():
            self.finish = "cancelled"
            return True
        if seq.token is not None:
            self.text += self.decoder.push(seq.token)
            cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.finish = self.text[:cut], "stop"
                return True
            if self.logprobs is not None:
                self.logprobs.append(_token_logprobs(seq.logits, seq.token, request.logprobs))
        if seq.finished:
            self.text += self.decoder.flush()
            self.finish = seq.finished
            return True
        safe = len(self.text) - self.hold if self.stops else len(self.text)
        if safe > self.sent:
            self._send(safe)
        return False

    def _send(self, upto: int, last: bool = False) -> None:
        """The text up to `upto` (as reasoning and content), with the log-probabilities of the
        tokens not sent yet."""
        steps = None
        if self.logprobs is not None:
            steps, self.logprobs_sent = self.logprobs[self.logprobs_sent :], len(self.logprobs)
        text, split = self.text[self.sent : upto], self.job.reasoning
        reasoning, content = ("", text) if split is None else split.push(text)
        if last and split is not None:
            rest = split.flush()
            reasoning, content = reasoning + rest[0], content + rest[1]
        if reasoning or content or steps:
            self.job.send(Text(content, reasoning, steps))
        self.sent = upto

    def end(self) -> None:
        if self.finish == "cancelled":
            return
        self._send(len(self.text), last=True)
        n_prompt, seq = len(self.job.prompt), self.seq
        usage = Usage(n_prompt, seq.generated, seq.cached_tokens)
        self.job.send(Done(self.finish, usage, time.perf_counter() - self.started, self.logprobs))


@dataclass
class Slot:
    conversation: Conversation = field(default_factory=Conversation)
    reply: Reply | None = None  # the request it is answering, if any
    last_used: int = 0


class Worker:
    def __init__(self, model, parallel: int = 1):
        self.model = model
        self.template = ChatTemplate(model.tokenizer)
        self.thinks = reasoning.thinks(model.tokenizer)
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.totals = Totals()
        self.slots = [Slot() for _ in range(parallel)]
        self._uses = 0
        self.thread = threading.Thread(target=self._run, name="swapmoe-worker", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        return self.jobs.qsize()

    @property
    def busy(self) -> int:
        return sum(slot.reply is not None for slot in self.slots)

    def prompt_ids(self, request: Generation) -> tuple[list[int], ReasoningSplit | None]:
        """The request's prompt as token ids, and for a chat with a model that thinks the split
        of its reply (raises APIError for a template error or a prompt that leaves no room in the
        context)."""
        split = None
        try:
            if request.chat:
                text = self.template.render(request.messages, add_generation_prompt=True, **request.template_kwargs)
                self.model.check_prompt_length(text)
                ids = self.model.tokenize(text, add_special=False)
                if request.reasoning and self.thinks:
                    split = ReasoningSplit(inside=reasoning.opened_by(text))
            else:
                self.model.check_prompt_length(request.prompt)
                ids = self.model.tokenize(request.prompt)
        except SwapmoeError as e:
            raise APIError(400, getattr(e, "reason", str(e)), "messages" if request.chat else "prompt") from None
        if len(ids) >= self.model.n_ctx:
            raise APIError(
                400,
                f"the prompt is {len(ids)} tokens; the context holds {self.model.n_ctx} "
                "(start the server with a larger --ctx)",
                "messages" if request.chat else "prompt",
                code="context_length_exceeded",
            )
        return ids, split

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def close(self, wait: float = 10.0) -> None:
        """Stop taking jobs; when the thread ends within `wait` seconds (the requests under way are
        cancelled by then: their clients are gone), close the model. A prompt still being
        processed after that is left to the process's exit."""
        self.jobs.put(None)
        self.thread.join(wait)
        if not self.thread.is_alive():
            self.model.close()

    def _run(self) -> None:
        while True:
            while any(slot.reply is None for slot in self.slots):  # fill free slots, in arrival order
                try:
                    job = self.jobs.get(block=not self.busy)
                except queue.Empty:
                    break
                if job is None:
                    return
                if not job.cancelled.is_set():
                    self._begin(job)
            busy = [slot for slot in self.slots if slot.reply is not None]
            if busy:
                self._step(busy)

    def _begin(self, job: Job) -> None:
        """Give the job a slot: process its prompt and take its first token."""
        slot = max(
            (s for s in self.slots if s.reply is None),
            key=lambda s: (shared_prefix(s.conversation.tokens, job.prompt), -s.last_used),
        )
        self._uses += 1
        slot.last_used = self._uses
        model, request, started = self.model, job.request, time.perf_counter()
        room = model.n_ctx - len(job.prompt)
        max_tokens = room if request.max_tokens is None else min(request.max_tokens, room)
        try:
            seq = model.start(job.prompt, max_tokens, request.ignore_eos, slot.conversation, **request.sampling)
        except Exception as e:  # the server keeps serving; the client learns what failed
            job.send(Failed(_server_error(e)))
            slot.conversation = Conversation()  # its caches may hold part of the failed prompt
            return
        self.totals.prompt_tokens += seq.prompt_tokens
        self.totals.prompt_seconds += seq.prompt_seconds
        slot.reply = Reply(job, seq, model.tokenizer, started)
        self._take(slot)

    def _step(self, busy: list[Slot]) -> None:
        """One token for every busy slot's sequence, together."""
        started = time.perf_counter()
        try:
            self.model.advance([slot.reply.seq for slot in busy])
        except Exception as e:
            for slot in busy:
                slot.reply.job.send(Failed(_server_error(e)))
                slot.reply, slot.conversation = None, Conversation()  # caches of an unfinished pass
            return
        self.totals.decode_seconds += time.perf_counter() - started
        self.totals.decode_steps += 1
        for slot in busy:
            self._take(slot)

    def _take(self, slot: Slot) -> None:
        reply = slot.reply
        if reply.seq.token is not None:
            self.totals.decode_tokens += 1
        if reply.take():
            reply.end()
            self.totals.requests += 1
            slot.reply = None


def _server_error(e: Exception) -> APIError:
    return e if isinstance(e, APIError) else APIError(500, f"generation failed: {e}", kind="server_error")


def _token_logprobs(logits, token: int, top: int) -> TokenLogprobs:
    """The token's log-probability under the model's distribution, and the `top` most likely tokens'."""
    log_p = log_softmax(logits)
    best = np.argsort(-log_p, kind="stable")[:top]
    return token, float(log_p[token]), [(int(t), float(log_p[t])) for t in best]
