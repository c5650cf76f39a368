"""The thread that owns the model: requests wait in a first-come queue and run one at a time;
each streams events (text pieces, then the end) back to the request's event loop. The caches of
the last request are kept (a Conversation), so the next turn of a chat processes only its new
tokens."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.runtime.chat import ChatTemplate
from swapmoe.runtime.model import Conversation
from swapmoe.server.protocol import APIError, Generation


@dataclass
class Job:
    request: Generation
    prompt: list[int]  # the request's prompt as token ids (Worker.prompt_ids)
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, *event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Totals:
    """What /metrics reports: counters since the server started."""
    requests: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0


class Worker:
    def __init__(self, model):
        self.model = model
        self.template = ChatTemplate(model.tokenizer)
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.totals = Totals()
        self.conversation = Conversation()  # the caches of the last request: a follow-up reuses its prefix
        self.busy = False
        self.thread = threading.Thread(target=self._run, name="swapmoe-worker", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        return self.jobs.qsize()

    def prompt_ids(self, request: Generation) -> list[int]:
        """The request's prompt as token ids (raises APIError for a template error or a prompt that
        leaves no room in the context)."""
        try:
            if request.chat:
                text = self.template.render(request.messages, add_generation_prompt=True, **request.template_kwargs)
                ids = self.model.tokenize(text, add_special=False)
            else:
                ids = self.model.tokenize(request.prompt)
        except SwapmoeError as e:
            raise APIError(400, getattr(e, "reason", str(e)), "messages" if request.chat else "prompt") from None
        if len(ids) >= self.model.n_ctx:
            raise APIError(400, f"the prompt is {len(ids)} tokens; the context holds {self.model.n_ctx} "
                                "(start the server with a larger --ctx)", "messages" if request.chat else "prompt",
                           code="context_length_exceeded")
        return ids

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancelled.is_set():
                continue
            self.busy = True
            try:
                self._generate(job)
            except APIError as e:
                job.send("error", e)
            except Exception as e:  # the server keeps serving; the client learns what failed
                job.send("error", APIError(500, f"generation failed: {e}", kind="server_error"))
            finally:
                self.busy = False

    def _generate(self, job: Job) -> None:
        request, model, ids = job.request, self.model, job.prompt
        room = model.n_ctx - len(ids)
        max_tokens = room if request.max_tokens is None else min(request.max_tokens, room)
        stops = request.stop
        hold = max((len(s) for s in stops), default=1) - 1  # text that may be the start of a stop string
        decoder = model.tokenizer.decoder()
        text, sent, finish, n_generated = "", 0, "length", 0
        logprobs = []  # (token, its log-probability, the top alternatives) while the text is kept
        start = time.perf_counter()
        tokens = model.generate_ids(ids, max_tokens, conversation=self.conversation, **request.sampling)
        try:
            for token in tokens:
                n_generated += 1
                if job.cancelled.is_set():
                    finish = "cancelled"
                    break
                text += decoder.push(token)
                cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                    break
                if request.logprobs is not None:
                    logprobs.append(_token_logprobs(model.step_logits, token, request.logprobs))
                safe = len(text) - hold if stops else len(text)
                if safe > sent:
                    job.send("text", text[sent:safe])
                    sent = safe
            else:
                if n_generated < max_tokens:
                    finish = "stop"  # an end-of-generation token
                text += decoder.flush()
        finally:
            tokens.close()
        if text[sent:]:
            job.send("text", text[sent:])
        stats = model.stats
        totals = self.totals
        totals.requests += 1
        totals.prompt_tokens += stats.prompt_tokens
        totals.prompt_seconds += stats.prompt_seconds
        totals.decode_tokens += stats.decode_tokens
        totals.decode_seconds += stats.decode_seconds
        job.send("done", finish, {"prompt_tokens": len(ids), "completion_tokens": n_generated,
                                  "total_tokens": len(ids) + n_generated,
                                  "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}},
                 time.perf_counter() - start, logprobs if request.logprobs is not None else None)


def _token_logprobs(logits, token: int, top: int) -> tuple[int, float, list[tuple[int, float]]]:
    """The token's log-probability under the model's distribution, and the `top` most likely tokens'."""
    z = logits.astype(np.float64)
    z = z - z.max()
    log_p = z - np.log(np.exp(z).sum())
    best = np.argsort(-log_p, kind="stable")[:top]
    return token, float(log_p[token]), [(int(t), float(log_p[t])) for t in best]
