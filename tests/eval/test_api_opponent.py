"""API opponents (openai:MODEL@URL) and `spiral-jax serve`: the served model answers as the sampler
does, concurrent requests share batches, evaluation games run against the served model, and a reply
that cannot be used is that player's invalid move, never a crash."""
import http.server
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from spiral_jax.api_player import ApiPlayer
from spiral_jax.eval.suite import run_games
from spiral_jax.eval.transcripts import read_transcripts
from spiral_jax.sampling import SamplingParams
from spiral_jax.serve import ChatServer


@pytest.fixture(scope="module")
def served(tiny_ctx):
    server = ChatServer(tiny_ctx.sampler, tiny_ctx.tokenizer, tiny_ctx.params, "tiny", port=0, max_rows=8,
                        max_tokens=16)
    server.start()
    yield server
    server.close()


def _post(url: str, body) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_serve_answers_as_the_sampler_does(served, tiny_ctx):
    """A seeded request gets what `Sampler.generate` samples for the same prompt (the config's template
    around the user message), seed and row ids."""
    tok = tiny_ctx.tokenizer
    status, reply = _post(served.url, {"model": "tiny", "messages": [{"role": "user", "content": "Your move."}],
                                       "n": 2, "seed": 3, "temperature": 0.6, "top_p": 0.95, "max_tokens": 8})
    assert status == 200 and reply["model"] == "tiny" and len(reply["choices"]) == 2
    prompt = tok.encode(tok.template.render_chat([{"role": "user", "content": "Your move."}], tok.hf))
    observation = "X to move."  # an API player's game turn reaches the model as the trainer's prompt
    rendered = tok.template.render_chat([{"role": "user", "content": tok.template.user_text(observation)}], tok.hf)
    assert tok.encode(rendered) == tok.prompt_ids(observation)
    want = tiny_ctx.sampler.generate(tiny_ctx.params, [prompt, prompt],
                                     SamplingParams(8, 0.6, 0, 0.95, stop_token_ids=tok.stop_ids), seed=3,
                                     row_ids=[0, 1])
    assert [c["message"]["content"] for c in reply["choices"]] == [tok.decode(t) for t in want.tokens]
    assert reply["usage"]["completion_tokens"] == sum(len(t) for t in want.tokens)
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    with urllib.request.urlopen(f"{served.url}/models") as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny"


@pytest.mark.parametrize("body,message", [
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 9}, "n must be between 1 and 8"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 17}, "max_tokens must be between 1 and 16"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature must be a number"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p must be in"),
    ({"messages": [{"role": "user", "content": "word " * 2000}]}, "this server takes at most 768"),
])
def test_bad_requests_get_400_with_the_reason(served, body, message):
    status, reply = _post(served.url, body)
    assert status == 400 and message in reply["error"]["message"]


def test_concurrent_requests_share_batches(served):
    """Requests that arrive while the sampler is busy go into one generate call together."""
    batches, replies = served.batches, []
    body = {"messages": [{"role": "user", "content": "Go."}], "max_tokens": 16, "temperature": 1.0}
    threads = [threading.Thread(target=lambda: replies.append(_post(served.url, body))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [status for status, _ in replies] == [200] * 8
    assert served.batches - batches < 8


def test_eval_games_against_the_served_model(served, tiny_ctx, tmp_path):
    """An openai:NAME@URL opponent plays evaluation games through the server: every game ends, and
    the opponent's responses are the server's answers (the tiny model's text, not empty)."""
    spec = f"openai:tiny@{served.url}"
    results = run_games(tiny_ctx, tmp_path, ["TicTacToe-v0"], [spec], 4)
    assert results["TicTacToe-v0", spec].games == 4
    games = read_transcripts(next((tmp_path / "transcripts").glob("*.jsonl")))
    api_turns = [t for g in games for t in g["turns"] if t["policy"] == spec]
    assert api_turns and all(t["response"] for t in api_turns)


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """An endpoint that misbehaves as told by the model name: garbage, 500, slow or a good answer."""

    seen: list = []

    def do_GET(self):  # noqa: N802
        self.send_response(401 if "refuse" in self.path else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeApi.seen.append((body["model"], self.headers.get("Authorization")))
        kind = body["model"]
        if kind == "slow":
            time.sleep(1.0)
        status = 500 if kind == "broken" else 200
        payload = b"not json" if kind == "garbage" else json.dumps(
            {"choices": [{"message": {"content": "\\boxed{4}" if kind == "good" else None}}]}).encode()
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


@pytest.mark.parametrize("kind,requests", [("garbage", 1), ("broken", 3), ("slow", 3), ("null", 1)])
def test_unusable_replies_are_counted_invalid_moves(fake_api, kind, requests, caplog):
    """Unreadable bodies and replies without text fail at once; server errors and timeouts are retried
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


def test_dead_endpoint_refused_key_and_bad_specs_are_clear_errors(fake_api):
    with pytest.raises(ConnectionError, match="cannot reach the API opponent at http://127.0.0.1:9/v1"):
        ApiPlayer.from_spec("openai:m@http://127.0.0.1:9/v1", timeout_s=2).check()
    with pytest.raises(PermissionError, match="refused the API key"):
        ApiPlayer.from_spec(f"openai:m@{fake_api}/refuse").check()
    ApiPlayer.from_spec(f"openai:m@{fake_api}").check()  # alive: no error
    for spec in ("openai:gpt", "openai:@http://x/v1", "openai:m@ftp://x", "gpt@http://x"):
        with pytest.raises(ValueError, match="write it openai:MODEL@BASE_URL"):
            ApiPlayer.from_spec(spec)
