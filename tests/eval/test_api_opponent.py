"""API opponents (openai:MODEL@URL): a reply that cannot be used is that player's invalid move, never
a crash; keys and concurrency (`spiral-jax serve` as an opponent: tests/eval/test_serve.py)."""
import http.server
import json
import logging
import threading
import time

import pytest

from spiral_jax.api_player import ApiPlayer
from spiral_jax.sampling import SamplingParams


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """An endpoint that misbehaves as told by the model name: garbage, 500, slow or a good answer."""

    seen: list = []
    bodies: list = []

    def do_GET(self):  # noqa: N802
        self.send_response(401 if "refuse" in self.path else 429 if "busy" in self.path else
                           500 if "broken" in self.path else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeApi.seen.append((body["model"], self.headers.get("Authorization")))
        _FakeApi.bodies.append(body)
        kind = body["model"]
        if kind.startswith("ratelimited") and _FakeApi.bodies.count(body) == 1:  # busy at the first try
            self.send_response(429)
            self.send_header(*{"ratelimited_ms": ("retry-after-ms", "400"),
                               "ratelimited_s": ("Retry-After", "1")}[kind])
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        refusal = {"reasoning": "max_tokens" in body and "Unsupported parameter: 'max_tokens' is not supported with "
                                "this model. Use 'max_completion_tokens' instead.",
                   "picky": "Unsupported value: 'temperature' does not support 0.6 with this model.\n\x1b[2J"}.get(kind)
        if refusal:
            self._json(400, {"error": {"message": refusal, "type": "invalid_request_error", "param": None}})
            return
        if kind == "slow":
            time.sleep(1.0)
        status = 500 if kind == "broken" else 200
        content = {"good": "\\boxed{4}", "reasoning": "\\boxed{4}", "ratelimited_ms": "\\boxed{4}",
                   "ratelimited_s": "\\boxed{4}", "surrogate": "\\boxed{4}\ud800",  # JSON can hold a lone surrogate
                   "parts": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "\\boxed"},
                             {"type": "text", "text": "{4}"}],
                   "no_text_parts": [{"type": "image_url", "image_url": {"url": "x"}}]}.get(kind)
        if kind == "garbage":
            self._json(status, None, b"not json")
        else:
            self._json(status, {"choices": [{"message": {"content": content}}]})

    def _json(self, status, reply, payload=None):
        payload = payload or json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.mark.parametrize("kind,requests", [("garbage", 1), ("broken", 3), ("slow", 3), ("null", 1), ("surrogate", 1),
                                           ("no_text_parts", 1)])
def test_unusable_replies_are_counted_invalid_moves(fake_api, kind, requests, caplog):
    """Unreadable bodies and replies without text (or with a lone surrogate, which no tokenizer takes)
    fail at once; server errors and timeouts are retried
    (2 more tries here) and then fail: "" (an invalid move), counted and logged."""
    player = ApiPlayer.from_spec(f"openai:{kind}@{fake_api}", timeout_s=0.5, retries=2, backoff_s=0.01)
    before = len(_FakeApi.seen)
    assert player.replies(["a", "b"]) == ["", ""]
    assert player.failures == 2 and player.calls == 2
    assert len(_FakeApi.seen) - before == 2 * requests
    assert "no usable reply" in caplog.text and "the move is invalid" in caplog.text


def test_good_replies_key_and_concurrency(fake_api, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test")
    player = ApiPlayer.from_spec(f"openai:good@{fake_api}", key_env="MY_KEY", concurrency=3)
    assert player.replies([str(i) for i in range(5)]) == ["\\boxed{4}"] * 5 and player.failures == 0
    assert _FakeApi.seen[-1] == ("good", "Bearer sk-test")


def test_a_dead_server_logs_a_few_failed_moves_not_every_one(fake_api, caplog):
    """The first three failed moves are logged, then the 10th, 100th, ... with the count so far."""
    player = ApiPlayer.from_spec(f"openai:garbage@{fake_api}", concurrency=8)
    assert player.replies(["a"] * 120) == [""] * 120 and player.failures == 120
    said = [r.getMessage() for r in caplog.records if "no usable reply" in r.getMessage()]
    assert len(said) == 5 and "(10 such moves so far" in said[3] and "(100 such moves so far" in said[4]


def test_a_reply_in_content_parts_is_its_text_parts_joined(fake_api):
    """Some OpenAI-compatible servers send the content as parts, a reasoning model's thinking among
    them: the answer is the text parts, in order."""
    player = ApiPlayer.from_spec(f"openai:parts@{fake_api}")
    assert player.replies(["a"]) == ["\\boxed{4}"] and player.failures == 0


def test_dead_endpoint_refused_key_and_bad_specs_are_clear_errors(fake_api):
    with pytest.raises(ConnectionError, match="cannot reach the API opponent at http://127.0.0.1:9/v1"):
        ApiPlayer.from_spec("openai:m@http://127.0.0.1:9/v1", timeout_s=2).check()
    with pytest.raises(PermissionError, match="refused the API key"):
        ApiPlayer.from_spec(f"openai:m@{fake_api}/refuse").check()
    ApiPlayer.from_spec(f"openai:m@{fake_api}").check()  # alive: no error
    ApiPlayer.from_spec(f"openai:m@{fake_api}/busy").check()  # rate-limited now: alive, the moves retry
    with pytest.raises(ConnectionError, match="answered HTTP 500"):
        ApiPlayer.from_spec(f"openai:m@{fake_api}/broken").check()
    for spec in ("openai:gpt", "openai:@http://x/v1", "openai:m@ftp://x", "gpt@http://x"):
        with pytest.raises(ValueError, match="write it openai:MODEL@BASE_URL"):
            ApiPlayer.from_spec(spec)


def test_a_model_that_takes_max_completion_tokens_gets_it(fake_api, caplog):
    """OpenAI's reasoning models refuse max_tokens with a 400 naming max_completion_tokens: the player
    sends that field from then on, in check() and in its moves, and the move is not lost."""
    caplog.set_level(logging.INFO, "spiral_jax.api_player")
    player = ApiPlayer.from_spec(f"openai:reasoning@{fake_api}", max_tokens=64)
    assert player.replies(["a"]) == ["\\boxed{4}"] and player.failures == 0
    assert _FakeApi.bodies[-1]["max_completion_tokens"] == 64 and "max_tokens" not in _FakeApi.bodies[-1]
    assert "asks for max_completion_tokens" in caplog.text
    fresh = ApiPlayer.from_spec(f"openai:reasoning@{fake_api}")
    fresh.check()
    assert _FakeApi.bodies[-1]["max_completion_tokens"] == 16
    fresh.reply("a")
    assert "max_tokens" not in _FakeApi.bodies[-1]


def test_a_refused_move_fails_check_and_its_log_line_says_why(fake_api, caplog):
    """A move the server refuses (a temperature the model does not take) is a clear error before the run,
    quoting the server's message (escaped) and the sampling that was sent; during a run, each such move's
    log line says it too."""
    player = ApiPlayer.from_spec(f"openai:picky@{fake_api}", temperature=0.6)
    with pytest.raises(ConnectionError, match=r"refused a move's request \(HTTP 400: Unsupported value: "
                                              r"'temperature' does not support 0.6 .*temperature 0.6, top_p"):
        player.check()
    assert player.reply("a") == "" and player.failures == 1
    assert "HTTP 400: Unsupported value: 'temperature'" in caplog.text and "\x1b" not in caplog.text


def test_a_seat_plays_at_its_samplings_settings():
    greedy = SamplingParams(32, greedy=True, top_p=0.9)
    player = ApiPlayer.playing("openai:m@http://127.0.0.1:9/v1", greedy, {"retries": 1})
    assert (player.temperature, player.top_p, player.max_tokens, player.retries) == (0.0, 0.9, 32, 1)
    player = ApiPlayer.playing("openai:m@http://127.0.0.1:9/v1", SamplingParams(16, temperature=0.7), {})
    assert (player.temperature, player.max_tokens) == (0.7, 16)


@pytest.mark.parametrize("kind,wait", [("ratelimited_ms", 0.4), ("ratelimited_s", 1.0)])
def test_a_busy_server_is_given_the_wait_it_asks_for(fake_api, kind, wait):
    """A 429's retry-after-ms (OpenAI's) or Retry-After is waited out before the next try, where the
    doubling waits would try again sooner and spend the retries."""
    player = ApiPlayer.from_spec(f"openai:{kind}@{fake_api}", retries=1, backoff_s=0.01)
    start = time.perf_counter()
    assert player.reply(f"waits {kind}") == "\\boxed{4}" and player.failures == 0
    assert wait <= time.perf_counter() - start < wait + 5
