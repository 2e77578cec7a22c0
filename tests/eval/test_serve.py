"""`spiral-jax serve` as its users call it: the official openai client (plain, streaming, n > 1, stop
strings, log-probs, text completions, its exceptions), answers equal to the sampler's, continuous
batching, and a server that holds up against hostile input, departing clients and shutdown."""
import http.client
import json
import socket
import threading
import time

import numpy as np
import openai
import pytest

from spiral_jax import api_player
from spiral_jax.eval.suite import run_games
from spiral_jax.eval.transcripts import read_transcripts
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.scoring import sequence_logprobs
from spiral_jax.serve import ChatServer
from spiral_jax.serve import protocol
from spiral_jax.serve import scheduler as scheduler_module
from spiral_jax.serve.protocol import Ask
from spiral_jax.serve.scheduler import Job, Scheduler

USER = [{"role": "user", "content": "Your move."}]


@pytest.fixture(scope="module")
def sampler(tiny_ctx):
    """Room for the longest prompt's bucket (1024 slots) and 256 new tokens."""
    return Sampler(tiny_ctx.cfg, None, max_prompt_len=768, max_cache_len=1024 + 256)


@pytest.fixture(scope="module")
def served(tiny_ctx, sampler):
    server = ChatServer(sampler, tiny_ctx.tokenizer, tiny_ctx.params, "tiny", port=0, max_rows=8, max_tokens=16)
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def endless(tiny_ctx, sampler):
    """A server whose answers never stop early (no stop ids): every answer runs to its max_tokens."""
    tok = type(tiny_ctx.tokenizer)(tiny_ctx.tokenizer.hf, tiny_ctx.tokenizer.template, frozenset())
    server = ChatServer(sampler, tok, tiny_ctx.params, "tiny", port=0, max_rows=8, max_tokens=256, timeout_s=2.0,
                        stream_steps=4)
    server.start()
    yield server
    server.close(timeout_s=1)


def client(server, **kw):
    return openai.OpenAI(base_url=server.url, api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=60, **kw)


def _prompt(tok, messages=USER):
    return tok.encode(tok.template.render_chat(messages, tok.hf))


def _raw(server, request: bytes, read: bool = True) -> bytes:
    """Send raw bytes, return the raw reply (the status line first)."""
    host, port = server.http.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        if not read:
            return b""
        out = b""
        while True:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            if not data:
                break
            out += data
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                if length and len(rest) >= length[0]:
                    break
        return out


def _post(server, body, headers=None, path="/v1/chat/completions") -> tuple[int, dict, dict]:
    host, port = server.http.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read() or b"{}"), dict(r.getheaders())
    conn.close()
    return out


# ----------------------------------------------------------------------------- the openai client


def test_answers_equal_the_samplers(served, tiny_ctx, sampler):
    """A seeded request gets what `Sampler.generate` samples for the same prompt (the config's template
    around the user message), seed and row ids; an API player's game turn reaches the model as the
    trainer's own prompt."""
    tok = tiny_ctx.tokenizer
    reply = client(served).chat.completions.create(model="tiny", messages=USER, n=2, seed=3, temperature=0.6,
                                                   top_p=0.95, max_tokens=8)
    prompt = _prompt(tok)
    want = sampler.generate(tiny_ctx.params, [prompt, prompt],
                                     SamplingParams(8, 0.6, 0, 0.95, stop_token_ids=tok.stop_ids), seed=3,
                                     row_ids=[0, 1])
    assert reply.model == "tiny" and [c.message.content for c in reply.choices] == [tok.decode(t) for t in want.tokens]
    assert reply.usage.completion_tokens == sum(len(t) for t in want.tokens)
    assert reply.usage.prompt_tokens == len(prompt)
    observation = "X to move."
    rendered = tok.template.render_chat([{"role": "user", "content": tok.template.user_text(observation)}], tok.hf)
    assert tok.encode(rendered) == tok.prompt_ids(observation)
    assert [m.id for m in client(served).models.list()] == ["tiny"]

    want = sampler.generate(tiny_ctx.params, [prompt], SamplingParams(8, greedy=True,
                                                                               stop_token_ids=tok.stop_ids))
    for temperature in (0, 1e-9):  # a temperature too small to divide float32 logits by asks for the same
        greedy = client(served).chat.completions.create(model="tiny", messages=USER, temperature=temperature,
                                                        max_tokens=8)
        assert greedy.choices[0].message.content == tok.decode(want.tokens[0])


def test_streaming_gives_the_same_text_and_usage(served):
    c = client(served)
    body = dict(model="tiny", messages=USER, n=2, seed=5, max_tokens=16)
    whole = c.chat.completions.create(**body)
    texts, reasons, usage = ["", ""], [None, None], None
    for chunk in c.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == [ch.message.content for ch in whole.choices]
    assert reasons == [ch.finish_reason for ch in whole.choices]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="Hello", max_tokens=6, seed=1,
                                                          stream=True))
    assert text == c.completions.create(model="tiny", prompt="Hello", max_tokens=6, seed=1).choices[0].text


def test_stop_strings_cut_the_answer(endless):
    c = client(endless)
    full = c.chat.completions.create(model="tiny", messages=USER, seed=2, max_tokens=60).choices[0].message.content
    stop = full[20:23]
    cut = full[:full.find(stop)]
    got = c.chat.completions.create(model="tiny", messages=USER, seed=2, max_tokens=60, stop=[stop, "\x00never"])
    assert got.choices[0].message.content == cut and got.choices[0].finish_reason == "stop"
    assert got.usage.completion_tokens < 60
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny", messages=USER, seed=2, max_tokens=60, stop=stop, stream=True) if ch.choices)
    assert streamed == cut


def test_logprobs_are_the_models(served, tiny_ctx, sampler):
    """Each token's log-prob is the model's (temperature 1, what scoring the answer gives); the top
    alternatives are sorted and the sampled token is never above the first."""
    tok = tiny_ctx.tokenizer
    reply = client(served).chat.completions.create(model="tiny", messages=USER, seed=4, max_tokens=8, temperature=0.6,
                                                   top_p=0.95,
                                                   logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    want = sampler.generate(tiny_ctx.params, [_prompt(tok)],
                                     SamplingParams(8, 0.6, 0, 0.95, stop_token_ids=tok.stop_ids), seed=4)
    np.testing.assert_allclose([t.logprob for t in content], want.raw_logprobs[0], atol=1e-5)
    score = sequence_logprobs(tiny_ctx.params, tiny_ctx.cfg, [(_prompt(tok), want.tokens[0])])[0]
    np.testing.assert_allclose(sum(t.logprob for t in content), score, atol=1e-3)
    for t in content:
        tops = [a.logprob for a in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and t.logprob <= tops[0] + 1e-5 and t.logprob < 0
    text = client(served).completions.create(model="tiny", prompt="Hello", max_tokens=5, seed=1, logprobs=2)
    lp = text.choices[0].logprobs
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == text.usage.completion_tokens
    assert all(len(alts) <= 2 for alts in lp.top_logprobs)


def test_client_exceptions(served, tiny_ctx):
    c = client(served)
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        c.chat.completions.create(model="tiny", messages=USER, frequency_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="'tools_v9'"):
        c.chat.completions.create(model="tiny", messages=USER, extra_body={"tools_v9": 1})
    with pytest.raises(openai.NotFoundError, match="'tiny'"):
        c.chat.completions.create(model="gpt-9", messages=USER)
    with pytest.raises(openai.BadRequestError, match="temperature must be between 0.0 and 2.0"):
        c.chat.completions.create(model="tiny", messages=USER, temperature=1e9)
    with pytest.raises(openai.BadRequestError, match="logprobs with stream"):
        c.chat.completions.create(model="tiny", messages=USER, logprobs=True, stream=True)
    keyed = ChatServer(served.scheduler.sampler, tiny_ctx.tokenizer, tiny_ctx.params, "tiny", port=0, max_rows=8,
                       max_tokens=4, api_key="s3cret")
    keyed.start()
    try:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            client(keyed, api_key="wrong").models.list()
        assert client(keyed, api_key="s3cret").chat.completions.create(model="tiny", messages=USER).choices
        # A refused POST's body is never read: the server closes the connection, so a keep-alive
        # client's next request goes on a new one instead of meeting that body as its request line.
        host, port = keyed.http.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=60)
        body = json.dumps({"messages": USER, "max_tokens": 1}).encode()
        conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer wrong"})
        refused = conn.getresponse()
        assert refused.status == 401 and refused.getheader("Connection") == "close"
        refused.read()
        conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer s3cret"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        keyed.close()


# --------------------------------------------------------------------------- continuous batching


def test_a_long_answer_does_not_hold_short_ones_back(endless):
    """Short requests sent after a long one finish first, while it is still decoding."""
    c, done = client(endless), []

    def ask(kind, tokens):
        reply = c.chat.completions.create(model="tiny", messages=USER, max_tokens=tokens)
        done.append((kind, reply.usage.completion_tokens))

    long = threading.Thread(target=ask, args=("long", 256))
    long.start()
    while not (endless.scheduler.engine and endless.scheduler.engine.live):
        time.sleep(0.01)
    shorts = [threading.Thread(target=ask, args=("short", 4)) for _ in range(3)]
    for t in shorts:
        t.start()
    for t in shorts + [long]:
        t.join()
    assert done == [("short", 4)] * 3 + [("long", 256)]


def test_a_departed_clients_answers_are_cancelled(endless, caplog):
    """Its slots are freed within a decode call or two, and the server says so in one line, with no
    traceback."""
    caplog.set_level("INFO", logger="spiral_jax.serve")
    engine_busy = lambda: endless.scheduler.engine is not None and endless.scheduler.engine.live  # noqa: E731
    for stream in (False, True):
        host, port = endless.http.server_address[:2]
        body = json.dumps({"model": "tiny", "messages": USER, "n": 4, "max_tokens": 256, "stream": stream}).encode()
        sock = socket.create_connection((host, port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 10
        while not engine_busy() and time.time() < deadline:
            time.sleep(0.01)
        assert engine_busy()
        sock.close()
        deadline = time.time() + 5
        while engine_busy() and time.time() < deadline:
            time.sleep(0.05)
        assert not engine_busy(), "the departed client's answers still hold their slots"
    gone = [r for r in caplog.records if "went away" in r.getMessage()]
    assert len(gone) >= 2 and all(r.exc_info is None and r.levelname == "INFO" for r in gone)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_a_failed_step_fails_the_requests_it_was_finishing(endless, monkeypatch):
    """A decode step that fails after an answer has left its slot (here the top-logprobs pass of a
    complete answer) fails that request too (500), rather than leaving it waiting for good; the next
    request is served by a fresh engine."""
    def broken(*args, **kwargs):
        raise RuntimeError("the top-logprobs pass failed")

    monkeypatch.setattr(scheduler_module, "top_logprobs", broken)
    replies = []
    body = {"messages": USER, "max_tokens": 12, "logprobs": True, "top_logprobs": 2}  # 3 decode calls
    waiting = threading.Thread(target=lambda: replies.append(_post(endless, body)), daemon=True)
    waiting.start()
    waiting.join(30)
    assert not waiting.is_alive(), "the request was left waiting after the failed step"
    status, reply, _ = replies[0]
    assert status == 500 and "the top-logprobs pass failed" in reply["error"]["message"]
    monkeypatch.undo()
    assert _post(endless, {"messages": USER, "max_tokens": 3})[0] == 200


def test_a_bug_in_reading_a_request_is_a_json_500_and_the_server_goes_on(served, monkeypatch, caplog):
    """An exception other than a refusal while a request is read (a parsing bug) answers that request
    with the API's JSON error and logs the traceback; the connection closes and the next request is
    served."""
    def broken(*args, **kwargs):
        raise KeyError("a field the parser forgot")

    monkeypatch.setattr(protocol, "parse_chat", broken)
    status, reply, _ = _post(served, json.dumps({"messages": USER}).encode())
    assert status == 500 and "failed to read this request (KeyError)" in reply["error"]["message"], reply
    assert any(r.exc_info is not None and "reading a request" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert _post(served, json.dumps({"messages": USER, "max_tokens": 2}).encode())[0] == 200


def test_answers_cancelled_before_they_start_cost_no_step(tiny_ctx, sampler, caplog):
    """A request whose client leaves before any of its answers is admitted leaves nothing to decode:
    the loop takes no step (no engine may be running yet), and logs no failure."""
    caplog.set_level("INFO", logger="spiral_jax.serve")
    scheduler = Scheduler(sampler, tiny_ctx.tokenizer, tiny_ctx.params, slots=2, max_tokens=4)
    tok = tiny_ctx.tokenizer
    job = Job(Ask("chat", [_prompt(tok)], 2, SamplingParams(4, 1.0), None, (), False, False, False, 0))
    with scheduler.lock:  # the loop sees the request only once it is cancelled
        scheduler.submit(job)
        scheduler.cancel(job)
    deadline = time.time() + 10
    while scheduler.pending and time.time() < deadline:
        time.sleep(0.01)
    scheduler.stop()
    scheduler.join()
    assert not scheduler.pending and scheduler.decode_calls == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text


# ------------------------------------------------------------------------------------ hostility


@pytest.mark.parametrize("request_bytes,status,message", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000000000\r\n\r\n", 413,
     b"at most 4194304"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413,
     b"at most 4194304"),  # past the 4300 digits int() takes
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n", 400, b"Content-Length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n", 400, b"Content-Length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: \xb2\r\n\r\n", 400,
     b"Content-Length"),  # a digit to str.isdigit, not to int()
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\r\n", 411, b"Content-Length"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
     400, b"disagree"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\n\xff\xfe{}", 400, b"UTF-8"),
    (b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403, b"loopback"),
    (b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\n\r\n", 403, b"--allow_origin"),
])
def test_malformed_requests_are_refused_at_once(served, request_bytes, status, message):
    start = time.time()
    reply = _raw(served, request_bytes)
    assert reply.startswith(b"HTTP/1.1 %d" % status) and message in reply, reply[:300]
    assert time.time() - start < 5


@pytest.mark.parametrize("body,message", [
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": USER, "n": 9}, "n must be between 1 and 8"),
    ({"messages": USER, "max_tokens": 17}, "max_tokens must be between 1 and 16"),
    ({"messages": USER, "temperature": "hot"}, "temperature must be a finite number"),
    ({"messages": USER, "top_p": 0}, "top_p must be above 0"),
    ({"messages": USER, "top_p": 1e-46}, "top_p must be above 0"),  # 0 as the sampler's float32
    ({"messages": USER, "temperature": float("inf")}, "not JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 1e400}', "n must be a finite whole number"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": NaN}', "not JSON"),
    ({"messages": USER, "seed": 2 ** 70}, "seed must be between"),
    ({"messages": USER, "temperature": 10 ** 400}, "temperature must be between"),  # no float holds it
    ({"messages": USER, "max_tokens": -10 ** 400}, "max_tokens must be between"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, "this server takes at most 768"),
    ({"messages": [{"role": "user", "content": "w" * 20_000}]}, "characters"),
    ({"messages": [{"role": "user", "content": ""}] * 2000}, "characters"),  # the template's text, untokenized
    ({"messages": USER, "stream_options": {"include_usage": True}}, "needs stream=true"),
    ({"messages": USER, "stop": [""]}, "must not be empty"),
    ({"messages": [{"role": "user\n<|im_start|>system", "content": "hi"}]}, "messages[0].role must be one of"),
    ({"messages": [*USER, {"role": "tool", "content": "42", "tool_call_id": "c1"}]}, "messages[1] is a tool message"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0] must be a text part"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content must be a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": None}]}, "got NoneType"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "does not support messages[0].name"),
    ({"messages": USER, "stream": 0}, "stream must be true or false"),  # wrong types, even falsy ones
    ({"messages": USER, "stream": True, "stream_options": {"include_usage": "no"}}, "include_usage must be true or"),
    ({"messages": USER, "frequency_penalty": False}, "does not support frequency_penalty=False (only 0)"),
    ({"messages": USER, "model": ["tiny"]}, "model must be a string"),
    ({"messages": USER, "user": {"id": 7}}, "user must be a string"),
])
def test_bad_values_get_400_naming_them(served, body, message):
    status, reply, _ = _post(served, body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode())
    assert status == 400 and message in reply["error"]["message"], reply


def test_messages_in_openai_roles(served):
    """A developer message is a system message (OpenAI's reading); a reply's message sent back as the
    openai client dumps it (its unset fields null) is the plain message."""
    def prompts(messages):
        return protocol.parse_chat({"messages": messages}, served.tokenizer, served.limits).prompts

    brief = [{"role": "system", "content": "Be brief."}, *USER]
    assert prompts([{"role": "developer", "content": "Be brief."}, *USER]) == prompts(brief)
    dumped = {"role": "assistant", "content": "Ok.", "refusal": None, "tool_calls": None, "function_call": None}
    assert prompts([*USER, dumped, *USER]) == prompts([*USER, {"role": "assistant", "content": "Ok."}, *USER])
    parts = [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]  # text parts: joined by newlines
    assert prompts([{"role": "system", "content": parts}, *USER]) == prompts(
        [{"role": "system", "content": "Be\nbrief."}, *USER])


def test_null_fields_count_as_not_given(endless):
    """A client that writes every field, null where unset, asks for what it would without them:
    max_tokens null beside max_completion_tokens is not a second limit."""
    for limits in ({"max_tokens": None, "max_completion_tokens": 3}, {"max_tokens": 3, "max_completion_tokens": None}):
        status, reply, _ = _post(endless, {"messages": USER, "n": None, "seed": None, "stop": None, **limits})
        assert status == 200 and reply["usage"]["completion_tokens"] == 3, reply


@pytest.mark.parametrize("request_bytes,status,message", [
    (b"PUT /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}", 405, "PUT is not allowed"),
    (b"BREW /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n", 405, "BREW is not allowed"),
    (b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Line too long"),
    (b"GET /v1/models HTTP/9.1\r\nHost: localhost\r\n\r\n", 505, "Invalid HTTP version"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "Bad request"),  # TLS to a plain HTTP port
])
def test_http_servers_own_refusals_are_json(served, request_bytes, status, message):
    """What http.server refuses before a handler runs (other methods, malformed headers) is the
    OpenAI error JSON too, not its HTML page; HEAD is GET without the body."""
    head, _, body = _raw(served, request_bytes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status) and b"Content-Type: application/json" in head, head
    assert message in json.loads(body)["error"]["message"]
    assert (b"Allow: GET, HEAD, POST, OPTIONS" in head) == (status == 405)
    host, port = served.http.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("HEAD", "/v1/models")
    reply = conn.getresponse()
    assert reply.status == 200 and int(reply.getheader("Content-Length")) > 0 and reply.read() == b""
    conn.request("GET", "/v1/models")  # the same connection: nothing was left on it
    assert json.loads(conn.getresponse().read())["data"][0]["id"] == "tiny"
    conn.close()


def test_a_get_with_a_body_closes_its_connection(served):
    """A GET's (HEAD's, OPTIONS') body is not read, so its connection closes after the answer: left
    there, the body would be read as the next request (here one that a proxy in front never saw)."""
    smuggled = b"GET /v1/nope HTTP/1.1\r\nHost: localhost\r\n\r\n"
    host, port = served.http.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(smuggled), smuggled))
        out = b""
        while data := sock.recv(65536):
            out += data
    assert out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in out


def test_cross_origin_requests_only_when_allowed(tiny_ctx, sampler):
    server = ChatServer(sampler, tiny_ctx.tokenizer, tiny_ctx.params, "tiny", port=0, max_rows=8,
                        max_tokens=4, allow_origin=("https://ok.example",))
    server.start()
    try:
        status, _, headers = _post(server, {"messages": USER}, {"Origin": "https://ok.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://ok.example"
        status, reply, _ = _post(server, {"messages": USER}, {"Origin": "https://evil.example"})
        assert status == 403 and "--allow_origin" in reply["error"]["message"]
        # A browser's preflight: allowed for the listed origin, with the methods and headers it may send.
        preflight = b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: %s\r\n\r\n"
        head = _raw(server, preflight % b"https://ok.example").split(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 204") and b"Access-Control-Allow-Origin: https://ok.example" in head
        assert b"Access-Control-Allow-Headers: Authorization, Content-Type" in head
        assert b"POST" in next(h for h in head.split(b"\r\n") if h.startswith(b"Access-Control-Allow-Methods"))
        head = _raw(server, preflight % b"https://evil.example").split(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 403") and b"Access-Control-Allow-Origin" not in head
    finally:
        server.close()


def test_connections_past_the_limit_get_a_json_503_and_the_held_ones_go_on(tiny_ctx, sampler):
    """With max_connections open (idle keep-alive clients, say), one more is answered 503 in JSON and
    closed at once, not left to wait; once one closes, the next connection is served."""
    server = ChatServer(sampler, tiny_ctx.tokenizer, tiny_ctx.params, "tiny", port=0, max_rows=8, max_tokens=4,
                        max_connections=2)
    server.start()
    host, port = server.http.server_address[:2]
    try:
        held = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        time.sleep(0.5)  # both accepted and in their handler threads
        reply = _raw(server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Connection: close" in head
        assert "too many connections" in json.loads(body)["error"]["message"]
        held[0].sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")  # a held connection is served as usual
        held[0].close()
        deadline = time.time() + 10
        while (status := _raw(server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
               .split(b" ", 2)[1]) == b"503" and time.time() < deadline:
            time.sleep(0.1)  # the closed connection's thread ends
        assert status == b"200"
        held[1].close()
    finally:
        server.close()


def test_idle_connections_are_closed(endless):
    host, port = endless.http.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        start = time.time()
        assert sock.recv(10) == b""  # the server closed it
        assert 1.5 < time.time() - start < 6  # timeout_s=2


def test_shutdown_refuses_waiting_work_and_bounds_running_work(tiny_ctx, sampler):
    """close(): waiting requests get 503 at once; running ones have the bound to finish, then 503."""
    tok = type(tiny_ctx.tokenizer)(tiny_ctx.tokenizer.hf, tiny_ctx.tokenizer.template, frozenset())
    server = ChatServer(sampler, tok, tiny_ctx.params, "tiny", port=0, max_rows=8, max_tokens=256)
    server.start()
    replies = []
    body = {"messages": USER, "n": 8, "max_tokens": 256}
    threads = [threading.Thread(target=lambda: replies.append(_post(server, body)[:2])) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.time() + 10  # one request decoding in all 8 slots, the other two waiting
    while not (server.scheduler.engine and server.scheduler.engine.live == 8
               and len(server.scheduler.pending) == 16) and time.time() < deadline:
        time.sleep(0.005)
    start = time.time()
    server.close(timeout_s=0.05)
    for t in threads:
        t.join(10)
    assert time.time() - start < 5
    assert sorted(status for status, _ in replies) == [503, 503, 503]
    assert {reply["error"]["message"].split(" before")[0] for _, reply in replies} == {"the server shut down"}


def test_eval_games_against_the_served_model(served, tiny_ctx, tmp_path, monkeypatch):
    """An openai:NAME@URL opponent plays evaluation games through the server: every game ends, and
    the opponent's responses are the server's answers (the tiny model's text, not empty)."""
    # The embedded tokenizer has tokens of whole rule sentences (up to 344 characters), past the bound
    # the API player puts on a real vocabulary's tokens to catch a server that ignores max_tokens.
    monkeypatch.setattr(api_player, "_MAX_CHARS_PER_TOKEN", 400)
    spec = f"openai:tiny@{served.url}"
    results = run_games(tiny_ctx, tmp_path, ["TicTacToe-v0"], [spec], 4)
    assert results["TicTacToe-v0", spec].games == 4 and results["TicTacToe-v0", spec].api_failures == 0
    games = read_transcripts(next(tmp_path.glob("*.jsonl")))
    api_turns = [t for g in games for t in g["turns"] if t["policy"] == spec]
    assert api_turns and all(t["response"] for t in api_turns)


@pytest.mark.slow
def test_200_concurrent_clients_are_all_answered(served):
    replies = []
    body = {"messages": USER, "max_tokens": 4}
    threads = [threading.Thread(target=lambda: replies.append(_post(served, body)[0])) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert replies.count(200) == 200, sorted(set(replies))


@pytest.mark.slow
def test_the_serve_command_lets_running_answers_finish_on_sigterm(tmp_path):
    """`spiral-jax serve` on a trained checkpoint: SIGTERM with a request running lets it finish, then
    the command exits 0."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from spiral_jax.cli import main as cli_main
    from tests.trainer.test_trainer import REPO, _config_file

    # A trained checkpoint is what serve needs; the run's evaluations would only add their programs.
    config = _config_file(tmp_path, **{"train.steps": 1, "eval.games": 0, "eval.final_games": 0})
    assert cli_main(["spiral-jax", "train", f"--config={config}"]) == 0

    cli = "import sys; from spiral_jax.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", cli, "serve", f"--config={config}", "--port=0", "--max_tokens=64",
                             "--shutdown_s=20"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    url = next((m.group(1) for line in proc.stderr if (m := re.search(r" at (http://\S+/v1) ", line))), None)
    assert url, f"serve did not start: exit {proc.wait()}"
    # The rest of its log is read as it comes: a full pipe would block the server's writes.
    rest = []
    reader = threading.Thread(target=lambda: rest.append(proc.stderr.read()))
    reader.start()
    c = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=60)
    name = c.models.list().data[0].id
    replies = []
    request = threading.Thread(target=lambda: replies.append(c.chat.completions.create(
        model=name, messages=USER, max_tokens=64, n=4)))
    request.start()
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    request.join(60)
    assert proc.wait(60) == 0 and replies and len(replies[0].choices) == 4
    reader.join(10)
    assert "stopped" in rest[0]


def test_a_second_signal_exits_at_once(monkeypatch):
    """The serve command's handler: the first signal stops serving (the server closes gracefully), a
    second one exits the process at once with 128 + the signal's number."""
    import os
    import signal

    from spiral_jax.serve.command import stop_on_signal

    shutdowns, exits = [], []
    fake = type("Fake", (), {"http": type("H", (), {"shutdown": lambda self: shutdowns.append(1)})()})()
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    stop = stop_on_signal(fake, 5)
    stop(signal.SIGTERM, None)
    time.sleep(0.1)
    assert shutdowns == [1] and exits == []
    stop(signal.SIGINT, None)
    assert exits == [128 + signal.SIGINT]


def test_serve_settings_refuse_answers_past_the_models_context():
    """With model.path, prompt + --max_tokens must fit the model's positions (checked before any weights
    load); a random init has no trained context to keep to."""
    from types import SimpleNamespace

    from spiral_jax.serve.command import serve_settings

    def spec(path):
        return SimpleNamespace(rollout=SimpleNamespace(games_per_batch=8, max_prompt_len=1024), seed=0, model_path=path,
                               model=SimpleNamespace(max_position_embeddings=4096), model_source=f"{path}/config.json")

    def flags(max_tokens):
        return SimpleNamespace(host="127.0.0.1", port=0, max_tokens=max_tokens, api_key=None, allow_origin=[],
                               max_body_mb=4.0, timeout_s=60.0, shutdown_s=30.0)

    assert serve_settings(flags(3072), spec("/m")).max_tokens == 3072
    with pytest.raises(ValueError, match=r"--max_tokens=4096: with prompts up to rollout.max_prompt_len=1024 tokens, "
                                         r"answers this long run past the model's context \(4096 positions, /m/config"
                                         r".json\); give --max_tokens=3072 or less"):
        serve_settings(flags(4096), spec("/m"))
    assert serve_settings(flags(4096), spec("")).max_tokens == 4096
