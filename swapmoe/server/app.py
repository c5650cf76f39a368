"""The HTTP side: OpenAI's routes on Starlette, answered from the worker thread's events."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from swapmoe.errors import SwapmoeError
from swapmoe.server.protocol import APIError, Generation, chat_request, completion_request, flag
from swapmoe.server.worker import Done, Failed, Job, Text, Worker

MAX_BODY = 8 << 20  # bytes of one request
PING_SECONDS = 10.0  # an SSE comment this often while the prompt runs, so clients do not time out


class Server:
    """The app's state: the model (loaded in the background when given a path), its worker."""

    def __init__(self, load, name: str, api_key: str | None, parallel: int):
        self.name, self.api_key, self.parallel = name, api_key, parallel
        self.worker: Worker | None = None
        self.load_error: str | None = None
        threading.Thread(target=self._load, args=(load,), name="swapmoe-load", daemon=True).start()

    def _load(self, load) -> None:
        try:
            self.worker = Worker(load(), self.parallel)
        except (SwapmoeError, OSError) as e:
            self.load_error = str(e)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

    def ready(self) -> Worker:
        if self.worker is None:
            raise APIError(503, self.load_error or "the model is loading", kind="unavailable_error")
        return self.worker


def create_app(load, name: str, api_key: str | None = None, parallel: int = 1) -> Starlette:
    """The ASGI app. load: a callable returning a swapmoe Model (run in the background; /health
    says 503 until it is done); name: the model id clients see; api_key: required as a Bearer
    token on every route but /health; parallel: requests decoded together (more wait in order)."""
    server = Server(load, name, api_key, parallel)

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            try:
                if server.api_key is not None:
                    given = request.headers.get("authorization", "")
                    if not hmac.compare_digest(given.encode(), f"Bearer {server.api_key}".encode()):
                        raise APIError(
                            401,
                            "invalid or missing API key (Authorization: Bearer KEY)",
                            kind="authentication_error",
                            code="invalid_api_key",
                        )
                return await handler(request)
            except APIError as e:
                return JSONResponse(e.body(), status_code=e.status)

        return endpoint

    async def health(request: Request) -> Response:
        if server.worker is None:
            message = server.load_error or "loading"
            return JSONResponse(
                {"status": "error" if server.load_error else "loading", "message": message}, status_code=503
            )
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        server.ready()
        return JSONResponse(
            {"object": "list", "data": [{"id": server.name, "object": "model", "created": 0, "owned_by": "swapmoe"}]}
        )

    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat_request)

    async def completions(request: Request) -> Response:
        return await _generate(request, completion_request)

    async def _generate(request: Request, parse) -> Response:
        worker = server.ready()
        body = await _json(request)
        if body.get("model") not in (None, server.name):
            raise APIError(
                404,
                f"model {body['model']!r} is not served here (this server has {server.name!r})",
                "model",
                code="model_not_found",
            )
        generation = parse(body)
        loop = asyncio.get_running_loop()
        prompt, split = await loop.run_in_executor(None, worker.prompt_ids, generation)  # fails here, not queued
        job = Job(generation, prompt, split, loop, asyncio.Queue())
        worker.submit(job)
        if generation.stream:
            return StreamingResponse(
                _stream(request, job), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        text, thought = [], []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), 1.0)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody to answer: the finally below frees the worker
                    continue
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Done):
                    break
                text.append(event.content)
                thought.append(event.reasoning)
        finally:
            job.cancelled.set()  # a client gone mid-request frees the worker at its next token
        reply = _response(generation, "".join(text), "".join(thought), event.finish, event.usage.as_dict(), server.name)
        if event.logprobs is not None:
            reply["choices"][0]["logprobs"] = _logprobs(worker.model.tokenizer, event.logprobs, generation.chat)
        return JSONResponse(reply)

    async def _stream(request: Request, job: Job) -> AsyncIterator[str]:
        generation, ident, created = job.request, _ident(job.request), int(time.time())

        sent = 0  # characters of text streamed (completions' logprobs text_offset)

        def chunk(
            delta: dict | None = None,
            finish: str | None = None,
            usage: dict | None = None,
            text: str | None = None,
            steps: list | None = None,
        ) -> str:
            logprobs = None if steps is None else _logprobs(server.worker.model.tokenizer, steps, generation.chat, sent)
            if generation.chat:
                choices = (
                    []
                    if delta is None
                    else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
                )
                obj = "chat.completion.chunk"
            else:
                choices = (
                    [] if text is None else [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]
                )
                obj = "text_completion"
            out: dict[str, Any] = {
                "id": ident,
                "object": obj,
                "created": created,
                "model": server.name,
                "choices": choices,
            }
            if usage is not None:
                out["usage"] = usage
            return f"data: {json.dumps(out, ensure_ascii=False)}\n\n"

        try:
            if generation.chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), PING_SECONDS)
                except asyncio.TimeoutError:
                    yield ": ping\n\n"
                    continue
                if isinstance(event, Text):
                    content, thought = event.content, event.reasoning
                    if generation.chat:
                        delta = {"reasoning_content": thought} if thought else {}
                        yield chunk(
                            {**delta, "content": content} if content or not thought else delta, steps=event.logprobs
                        )
                    else:
                        yield chunk(text=content, steps=event.logprobs)
                    sent += len(content)
                elif isinstance(event, Failed):
                    yield f"data: {json.dumps(event.error.body())}\n\n"
                    break
                else:
                    yield chunk({}, event.finish) if generation.chat else chunk(text="", finish=event.finish)
                    if generation.include_usage:
                        yield chunk(usage=event.usage.as_dict())
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled.set()  # the client went away (or the answer is complete)

    async def tokenize(request: Request) -> Response:
        worker = server.ready()
        body = await _json(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise APIError(400, "'content' must be a string", "content")
        return JSONResponse({"tokens": worker.model.tokenize(content, add_special=flag(body, "add_special"))})

    async def detokenize(request: Request) -> Response:
        worker = server.ready()
        body = await _json(request)
        tokens = body.get("tokens")
        n_vocab = worker.model.net.n_vocab
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < n_vocab for t in tokens):
            raise APIError(400, f"'tokens' must be a list of token ids in 0..{n_vocab - 1}", "tokens")
        return JSONResponse({"content": worker.model.detokenize(tokens)})

    async def metrics(request: Request) -> Response:
        worker = server.ready()
        t, store = worker.totals, worker.model.store.summary()
        lines = [
            ("requests_total", "counter", "finished generation requests", t.requests),
            ("prompt_tokens_total", "counter", "prompt tokens processed", t.prompt_tokens),
            ("prompt_seconds_total", "counter", "seconds spent on prompts", round(t.prompt_seconds, 6)),
            ("tokens_predicted_total", "counter", "tokens generated", t.decode_tokens),
            ("tokens_predicted_seconds_total", "counter", "seconds spent generating", round(t.decode_seconds, 6)),
            ("decode_steps_total", "counter", "decoding passes (one token for each request decoding)", t.decode_steps),
            (
                "prompt_tokens_seconds",
                "gauge",
                "average prompt tokens per second",
                round(t.prompt_tokens / t.prompt_seconds, 3) if t.prompt_seconds else 0,
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "average generated tokens per second",
                round(t.decode_tokens / t.decode_seconds, 3) if t.decode_seconds else 0,
            ),
            ("requests_processing", "gauge", "requests being generated", worker.busy),
            ("requests_deferred", "gauge", "requests waiting in the queue", worker.waiting),
            ("expert_requests_total", "counter", "experts asked of the expert store", store.requests),
            ("expert_hits_total", "counter", "experts found resident", store.hits),
            ("expert_misses_total", "counter", "experts read from storage", store.misses),
            ("expert_bytes_read_total", "counter", "expert bytes read from storage", store.bytes_loaded),
            ("expert_resident_bytes", "gauge", "bytes of resident experts", store.resident_bytes),
        ]
        text = "".join(
            f"# HELP swapmoe:{name} {doc}\n# TYPE swapmoe:{name} {kind}\nswapmoe:{name} {value}\n"
            for name, kind, doc, value in lines
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    routes = [
        Route("/health", health),
        Route("/v1/models", guarded(models)),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/tokenize", guarded(tokenize), methods=["POST"]),
        Route("/detokenize", guarded(detokenize), methods=["POST"]),
        Route("/metrics", guarded(metrics)),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await asyncio.get_running_loop().run_in_executor(None, server.close)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = server
    return app


async def _json(request: Request) -> dict:
    """The request's JSON object, within MAX_BODY bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise APIError(413, f"request body over {MAX_BODY} bytes")
    data = b""
    async for part in request.stream():
        data += part
        if len(data) > MAX_BODY:
            raise APIError(413, f"request body over {MAX_BODY} bytes")
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def _logprobs(tokenizer, steps: list, chat: bool, offset: int = 0) -> dict:
    """OpenAI's logprobs object: chat's per-token `content` list, or the completions' parallel lists
    (text offsets counted from `offset`: the characters before these tokens)."""

    def piece(token: int) -> bytes:
        return tokenizer.token_bytes(token)

    if chat:
        return {
            "content": [
                {
                    "token": piece(t).decode("utf-8", "replace"),
                    "logprob": lp,
                    "bytes": list(piece(t)),
                    "top_logprobs": [
                        {"token": piece(a).decode("utf-8", "replace"), "logprob": alp, "bytes": list(piece(a))}
                        for a, alp in top
                    ],
                }
                for t, lp, top in steps
            ]
        }
    offsets, at = [], offset
    for t, _, _ in steps:
        offsets.append(at)
        at += len(piece(t).decode("utf-8", "replace"))
    return {
        "tokens": [piece(t).decode("utf-8", "replace") for t, _, _ in steps],
        "token_logprobs": [lp for _, lp, _ in steps],
        "top_logprobs": [{piece(a).decode("utf-8", "replace"): alp for a, alp in top} for _, _, top in steps],
        "text_offset": offsets,
    }


def _ident(generation: Generation) -> str:
    return ("chatcmpl-" if generation.chat else "cmpl-") + uuid.uuid4().hex[:24]


def _response(generation: Generation, text: str, reasoning: str, finish: str, usage: dict, name: str) -> dict:
    common = {"id": _ident(generation), "created": int(time.time()), "model": name, "usage": usage}
    if generation.chat:
        message = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        return {
            **common,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        }
    return {
        **common,
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
