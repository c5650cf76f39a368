"""`swapmoe serve` on 127.0.0.1 with the tiny model, driven by the official openai client (and raw
HTTP for what a client library would not send)."""

import concurrent.futures
import json
import socket
import threading
import time
import urllib.request

import openai
import pytest
import uvicorn

import swapmoe
from swapmoe.runtime.chat import ChatTemplate
from swapmoe.server import create_app

GREEDY = dict(temperature=0, top_p=1, extra_body={"top_k": 0, "min_p": 0})
MESSAGES = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Write a loop."}]


def _start(api_key=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = swapmoe.default_model_path()
    app = create_app(lambda: swapmoe.load(path, parallel=4), name="tiny-moe", api_key=api_key, parallel=4)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health") as r:
                if r.status == 200:
                    return server, base
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not become ready")


APPS = {}  # base URL -> the app serving it


@pytest.fixture(scope="module")
def served():
    server, base = _start()
    APPS[base] = server.config.app
    yield base
    server.should_exit = True


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model():
    return swapmoe.load(swapmoe.default_model_path())


def solo(model, messages, max_tokens):
    """What `swapmoe run --chat` generates greedily for these messages."""
    text = ChatTemplate(model.tokenizer).render(messages, add_generation_prompt=True)
    return "".join(model.generate(model.tokenize(text, add_special=False), max_tokens, temperature=0))


def post(base, path, body: bytes, headers=None):
    request = urllib.request.Request(
        base + path, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"swapmoe:{name} "):
                return float(line.split()[1])


def test_chat_is_run_chats_greedy_output(client, model):
    reply = client.chat.completions.create(model="tiny-moe", messages=MESSAGES, max_tokens=24, **GREEDY)
    assert reply.choices[0].message.content == solo(model, MESSAGES, 24)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 24
    prompt = model.tokenize(ChatTemplate(model.tokenizer).render(MESSAGES), add_special=False)
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.total_tokens == len(prompt) + 24


def test_streaming_gives_the_same_text_and_usage(client):
    whole = client.completions.create(model="tiny-moe", prompt="def main():", max_tokens=20, **GREEDY)
    chunks = list(
        client.completions.create(
            model="tiny-moe",
            prompt="def main():",
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    chat = list(
        client.chat.completions.create(model="tiny-moe", messages=MESSAGES, max_tokens=5, stream=True, **GREEDY)
    )
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in chat)


def test_stop_strings_end_the_text_and_are_not_in_it(client):
    free = client.completions.create(model="tiny-moe", prompt="def main():", max_tokens=30, **GREEDY)
    text = free.choices[0].text
    stop = text[10:13]  # three characters the greedy text reaches
    cut = client.completions.create(model="tiny-moe", prompt="def main():", max_tokens=30, stop=[stop, "zzz"], **GREEDY)
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny-moe", prompt="def main():", max_tokens=30, stop=stop, stream=True, **GREEDY
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text[: text.index(stop)]


def test_concurrent_clients_each_get_their_solo_output(served, client, model):
    prompts = [[{"role": "user", "content": f"Count to {n}."}] for n in range(4)]
    tokens, steps = metric(served, "tokens_predicted_total"), metric(served, "decode_steps_total")

    def ask(messages):
        stream = client.chat.completions.create(
            model="tiny-moe", messages=messages, max_tokens=64, stream=True, **GREEDY
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, prompts))
    assert answers == [solo(model, m, 64) for m in prompts]
    tokens, steps = metric(served, "tokens_predicted_total") - tokens, metric(served, "decode_steps_total") - steps
    assert steps < tokens * 0.75  # the four decoded together, not one after another


def test_a_dropped_stream_frees_the_model(served, client):
    before = metric(served, "tokens_predicted_total")
    stream = client.completions.create(model="tiny-moe", prompt="def main():", max_tokens=3000, stream=True, **GREEDY)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    reply = client.completions.create(model="tiny-moe", prompt="x", max_tokens=4, **GREEDY)
    assert reply.usage.completion_tokens == 4
    assert metric(served, "tokens_predicted_total") - before < 500  # the dropped one stopped early


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        (b'{"model": "other", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}', 400, "max_tokens"),
        (b'{"messages": []}', 400, "messages"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "n"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "ignore_eos": 1}', 400, "ignore_eos"),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages[0]"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400, "temperature"),
        (b"[1, 2]", 400, None),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, client, body, status, param):
    code, error = post(served, "/v1/chat/completions", body)
    assert code == status and error["error"]["param"] == param and error["error"]["message"]
    assert client.completions.create(model="tiny-moe", prompt="x", max_tokens=1, **GREEDY).usage.completion_tokens


def test_prompt_longer_than_the_context_is_refused(client, model):
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="tiny-moe", prompt="word " * (model.n_ctx + 10), max_tokens=4)


def test_tokenize_round_trip(served, model):
    code, out = post(served, "/tokenize", json.dumps({"content": "Hello world"}).encode())
    assert code == 200 and out["tokens"] == model.tokenize("Hello world", add_special=False)
    code, back = post(served, "/detokenize", json.dumps({"tokens": out["tokens"]}).encode())
    assert code == 200 and back["content"] == "Hello world"
    assert post(served, "/detokenize", b'{"tokens": [-1]}')[0] == 400


def test_api_key_guards_every_route_but_health():
    server, base = _start(api_key="sekret")
    try:
        wrong = openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=base + "/v1", api_key="sekret", max_retries=0)
        assert [m.id for m in right.models.list()] == ["tiny-moe"]
        assert post(base, "/tokenize", b'{"content": "x"}')[0] == 401
        with urllib.request.urlopen(base + "/health") as r:
            assert r.status == 200
    finally:
        server.should_exit = True


def test_a_second_turn_reuses_the_first(client):
    first = client.chat.completions.create(model="tiny-moe", messages=MESSAGES, max_tokens=12, **GREEDY)
    turn = [
        *MESSAGES,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And another."},
    ]
    second = client.chat.completions.create(model="tiny-moe", messages=turn, max_tokens=4, **GREEDY)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the first turn's prompt and all but its last reply token were fed to the caches
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    unrelated = client.chat.completions.create(
        model="tiny-moe", messages=[{"role": "user", "content": "Zebra?"}], max_tokens=2, **GREEDY
    )
    assert unrelated.usage.prompt_tokens_details.cached_tokens < unrelated.usage.prompt_tokens


def test_logprobs_are_the_models_distribution(client, model):
    import numpy as np

    reply = client.chat.completions.create(
        model="tiny-moe", messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=2, **GREEDY
    )
    steps = reply.choices[0].logprobs.content
    assert len(steps) == 3 and "".join(s.token for s in steps) == reply.choices[0].message.content
    prompt = model.tokenize(ChatTemplate(model.tokenizer).render(MESSAGES), add_special=False)
    z = model.logits(prompt)[-1].astype(np.float64)
    log_p = z - z.max() - np.log(np.exp(z - z.max()).sum())
    assert abs(steps[0].logprob - log_p.max()) < 1e-4  # greedy: the most likely token
    assert [t.logprob for t in steps[0].top_logprobs] == sorted(
        (t.logprob for t in steps[0].top_logprobs), reverse=True
    )
    text = client.completions.create(model="tiny-moe", prompt="def main():", max_tokens=2, logprobs=1, **GREEDY)
    assert len(text.choices[0].logprobs.token_logprobs) == 2
    streamed = client.chat.completions.create(
        model="tiny-moe", messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=2, stream=True, **GREEDY
    )
    pieces = [step for c in streamed if c.choices and c.choices[0].logprobs for step in c.choices[0].logprobs.content]
    assert [(p.token, p.logprob) for p in pieces] == [(s.token, s.logprob) for s in steps]
    stream = client.completions.create(
        model="tiny-moe", prompt="def main():", max_tokens=2, logprobs=1, stream=True, **GREEDY
    )
    offsets = [o for c in stream if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == text.choices[0].logprobs.text_offset


def test_thinking_goes_to_reasoning_content(served, client, model, monkeypatch):
    """The tiny model has no <think> tokens: its greedy reply's own words stand in for the tags."""
    from swapmoe.server import reasoning

    messages = [{"role": "user", "content": "class Point:"}]  # a reply of varied words
    text = solo(model, messages, 24)
    tag = next(w for w in text.split()[1:] if text.count(w) == 1 and len(w) > 2)
    before, after = text.split(tag)
    monkeypatch.setattr(APPS[served].state.server.worker, "thinks", True)
    monkeypatch.setattr(reasoning, "CLOSE", tag)
    monkeypatch.setattr(reasoning, "opened_by", lambda prompt_text: True)
    reply = client.chat.completions.create(model="tiny-moe", messages=messages, max_tokens=24, **GREEDY)
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == (before.lstrip(), after.lstrip())
    chunks = list(
        client.chat.completions.create(model="tiny-moe", messages=messages, max_tokens=24, stream=True, **GREEDY)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert (streamed, "".join(d.content or "" for d in deltas)) == (before.lstrip(), after.lstrip())
    plain = client.chat.completions.create(
        model="tiny-moe",
        messages=messages,
        max_tokens=24,
        extra_body={**GREEDY["extra_body"], "reasoning_format": "none"},
        temperature=0,
        top_p=1,
    )
    assert plain.choices[0].message.content == text


def test_shutdown_closes_the_model(tmp_path):
    """Stopping the server stops its worker thread and closes the model: its routing trace is
    complete on disk."""
    from starlette.testclient import TestClient

    trace = tmp_path / "trace.jsonl"
    app = create_app(lambda: swapmoe.load(swapmoe.default_model_path(), trace=trace), name="tiny-moe")
    with TestClient(app) as http:
        while http.get("/health").status_code != 200:
            time.sleep(0.05)
        reply = http.post("/v1/completions", json={"prompt": "def f", "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200, reply.text
        worker = app.state.server.worker
    assert not worker.thread.is_alive()
    assert worker.model.trace.file.closed
    assert json.loads(trace.read_text().splitlines()[-1])["layer"] >= 0
