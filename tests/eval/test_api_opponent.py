"""API opponents (openai:MODEL@URL): a reply that cannot be used is that player's invalid move, never
a crash; keys and concurrency (`spiral-jax serve` as an opponent: tests/eval/test_serve.py)."""
import http.server
import json
import threading
import time

import pytest

from spiral_jax.api_player import ApiPlayer


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """An endpoint that misbehaves as told by the model name: garbage, 500, slow or a good answer."""

    seen: list = []

    def do_GET(self):  # noqa: N802
        self.send_response(401 if "refuse" in self.path else 429 if "busy" in self.path else
                           500 if "broken" in self.path else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeApi.seen.append((body["model"], self.headers.get("Authorization")))
        kind = body["model"]
        if kind == "slow":
            time.sleep(1.0)
        status = 500 if kind == "broken" else 200
        content = {"good": "\\boxed{4}", "surrogate": "\\boxed{4}\ud800",  # JSON can hold a lone surrogate
                   "parts": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "\\boxed"},
                             {"type": "text", "text": "{4}"}],
                   "no_text_parts": [{"type": "image_url", "image_url": {"url": "x"}}]}.get(kind)
        payload = b"not json" if kind == "garbage" else json.dumps({"choices": [{"message": {"content": content}}]}).encode()
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
