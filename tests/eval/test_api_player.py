"""The API player against hostile endpoints on 127.0.0.1: a redirect never carries the key anywhere,
a server that trickles bytes is cut off at the request's deadline, an oversized reply is refused while
it is read, `check()` says what is wrong as ConnectionError or PermissionError, and any JSON a server
answers is a move or a counted failure."""
import http.server
import json
import socket
import threading
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiral_jax.api_player import ApiPlayer

HUGE = 64 * 2**20
GOOD = json.dumps({"choices": [{"message": {"content": "\\boxed{4}"}}]}).encode()
BYTE_CHUNKS = b"".join(b"1\r\n%c\r\n" % c for c in GOOD.ljust(2**17)) + b"0\r\n\r\n"  # 128 KiB, a chunk a byte


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Misbehaves as the first path segment after /v1 says; every request is recorded."""

    protocol_version = "HTTP/1.1"
    seen: list = []
    redirect_to = ""
    written: dict = {}

    def _handle(self):
        _Hostile.seen.append((self.command, self.path, self.headers.get("Authorization"), self.server.server_port))
        if self.headers.get("Content-Length"):
            self.rfile.read(int(self.headers["Content-Length"]))
        kind = self.path.split("/")[2]
        try:
            if kind == "redirect":
                self.send_response(302)
                self.send_header("Location", _Hostile.redirect_to + self.path.split("/", 3)[3])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif kind in ("echo_redirect", "echo_status"):  # 64 KiB of server text: the key, escapes, filler
                words = f"{self.headers.get('Authorization')} \x1b[2J" + "a" * 65000
                if kind == "echo_status":
                    self.wfile.write(words.encode() + b"\r\n\r\n")
                else:
                    self.send_response(302)
                    self.send_header("Location", "http://elsewhere/" + words)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
            elif kind in ("odd_length", "long_length"):  # a Content-Length that http.client ignores
                length = b"\xb2" if kind == "odd_length" else b"1" * 5000
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\nConnection: close\r\n\r\n" + GOOD)
                self.close_connection = True
            elif kind == "byte_chunks":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(BYTE_CHUNKS)
            elif kind == "trickle_body":  # whole headers, then a byte every 0.1 s of a 1000-byte body
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(1000):
                    self.wfile.write(b" ")
                    time.sleep(0.1)
            elif kind == "trickle_headers":  # the status line, then the headers a byte every 0.1 s
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for byte in b"X-Slow: " + b"a" * 1000:
                    self.wfile.write(bytes([byte]))
                    time.sleep(0.1)
            elif kind in ("huge_declared", "huge_streamed"):  # 64 MiB, with or without Content-Length
                self.send_response(200)
                if kind == "huge_declared":
                    self.send_header("Content-Length", str(HUGE))
                self.send_header("Connection", "close")
                self.end_headers()
                _Hostile.written[kind] = 0
                for _ in range(HUGE // 65536):
                    self.wfile.write(b"[" * 65536)
                    _Hostile.written[kind] += 65536
            else:
                status, payload = {"badutf8": (200, b'{"data": "\xff\xfe"}'), "notjson": (200, b"<html>hi</html>"),
                                   "badutf8_long": (200, b'{"data": "' + b"\xff" * 2**20 + b'"}'),
                                   "forbidden": (403, b"{}"),
                                   "deep": (200, b"[" * 200_000),
                                   "long_text": (200, GOOD.replace(b"\\\\boxed{4}", b" " * 200_000 + b"\\\\boxed{4}"))
                                   }.get(kind, (200, GOOD))
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
        except OSError:  # the client gave up, as it should
            pass

    do_GET = do_POST = _handle  # noqa: N815

    def log_message(self, *args):
        pass


def _serve():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def hostile():
    """(url of the hostile endpoint, port of a second host the redirects point at)."""
    server, other = _serve(), _serve()
    _Hostile.redirect_to = f"http://127.0.0.1:{other.server_port}/v1/good/"
    yield f"http://127.0.0.1:{server.server_port}/v1", other.server_port
    for s in (server, other):
        s.shutdown()
        s.server_close()


def _player(url, kind, **settings):
    return ApiPlayer.from_spec(f"openai:m@{url}/{kind}", key_env="HOSTILE_TEST_KEY",
                               **{"retries": 0, "backoff_s": 0.01, **settings})


def test_a_redirect_is_refused_and_the_key_never_leaves(hostile, monkeypatch, caplog):
    url, other_port = hostile
    monkeypatch.setenv("HOSTILE_TEST_KEY", "sk-secret")
    _Hostile.seen.clear()
    player = _player(url, "redirect", retries=2)
    with pytest.raises(ConnectionError, match=rf"HTTP 302, a redirect to http://127.0.0.1:{other_port}/v1/good/models"):
        player.check()
    assert player.replies(["a"]) == [""] and player.failures == 1
    assert "redirects are not followed" in caplog.text
    assert [port for *_, port in _Hostile.seen if port == other_port] == []  # nothing reached the other host
    assert len(_Hostile.seen) == 2  # check, then one try: a redirect is not retried


@pytest.mark.parametrize("kind", ["trickle_body", "trickle_headers"])
def test_timeout_s_bounds_the_whole_request(hostile, kind, caplog):
    """Each byte comes well within the socket timeout, yet the request ends at timeout_s."""
    player = _player(hostile[0], kind, timeout_s=0.5)
    start = time.perf_counter()
    assert player.reply("a") == ""
    assert time.perf_counter() - start < 1.5
    assert "within timeout_s=0.5 s" in caplog.text
    with pytest.raises(ConnectionError, match="did not answer in time"):
        player.check()


@pytest.mark.parametrize("kind", ["huge_declared", "huge_streamed"])
def test_a_reply_over_max_reply_bytes_is_refused_while_read(hostile, kind, caplog):
    """The client stops reading past the limit, so the server cannot send the whole body."""
    player = _player(hostile[0], kind, max_reply_bytes=2**20)
    assert player.reply("a") == ""
    assert "larger than max_reply_bytes=1048576" in caplog.text
    time.sleep(0.2)  # the server's writes fail once the client has closed
    assert _Hostile.written[kind] < HUGE / 2
    with pytest.raises(ConnectionError, match="larger than max_reply_bytes"):
        player.check()
    assert _player(hostile[0], "good", max_reply_bytes=len(GOOD)).reply("a") == "\\boxed{4}"  # the limit itself is fine


@pytest.mark.parametrize("kind,error,message", [
    ("notjson", ConnectionError, r"answered something that is not JSON \(JSONDecodeError"),
    ("badutf8", ConnectionError, r"answered something that is not JSON \(UnicodeDecodeError"),
    ("deep", ConnectionError, r"answered something that is not JSON \(ValueError: .* nests JSON too deeply"),
    ("forbidden", PermissionError, r"refused the API key \(HTTP 403\)"),
])
def test_check_says_what_is_wrong(hostile, kind, error, message):
    with pytest.raises(error, match=message):
        _player(hostile[0], kind).check()
    assert _player(hostile[0], kind).reply("a") == ""  # and in a game: an invalid move, no exception


def test_eval_transcripts_of_a_spec_with_dot_dot_stay_in_the_report_folder(hostile, tiny_ctx, tmp_path):
    """`spiral-jax eval` (suite.run_games) names the transcript after the spec without leaving its folder."""
    from spiral_jax.eval.suite import run_games

    spec = f"openai:m@{hostile[0].rsplit('/v1', 1)[0]}/ok/../../../../escaped/v1"
    results = run_games(tiny_ctx, tmp_path / "report", ["TicTacToe-v0"], [spec], 2)
    assert results["TicTacToe-v0", spec].games == 2
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl")]
    assert len(written) == 1 and written[0].parts[0] == "report" and written[0].suffix == ".jsonl", written


@pytest.mark.parametrize("key", ["sk-secret\n", "sk-secret\r\nX-Injected: 1", "sk-s\u2019cret"])
def test_a_key_a_header_cannot_carry_is_refused_without_showing_it(key, monkeypatch):
    """A trailing newline (a key read from a file) would make http.client raise an error quoting the
    key, for the log line and check()'s error; the player is refused instead. Its repr shows no key."""
    monkeypatch.setenv("HOSTILE_TEST_KEY", key)
    with pytest.raises(ValueError, match="an HTTP header cannot carry; check the environment variable") as err:
        _player("http://127.0.0.1:9/v1", "good")
    assert "cret" not in repr(err.value)
    assert "sk-secret" not in repr(ApiPlayer("m", "http://127.0.0.1:9/v1", "sk-secret"))


@pytest.mark.parametrize("url", ["http://user:hunter2@127.0.0.1:9/v1", "https://:hunter2@host/v1",
                                 "ftp://user:hunter2@host/v1", "http://user:pa/ss@hunter2@host/v1"])
def test_credentials_in_the_url_are_refused_without_showing_them(url):
    with pytest.raises(ValueError) as err:
        ApiPlayer.from_spec(f"openai:m@{url}")
    assert "hunter2" not in str(err.value) and "://***@" in str(err.value), err.value


@pytest.mark.parametrize("kind", ["badutf8_long", "echo_redirect", "echo_status"])
def test_the_log_line_and_error_hold_a_short_escaped_part_of_what_the_server_sent(hostile, kind, monkeypatch, caplog):
    """A 1 MiB body that is not UTF-8 (whose UnicodeDecodeError's repr holds it four times over), a
    64 KiB Location or status line with terminal escapes and an echoed key: the log line and the
    error keep under 1,000 characters, escape the escapes and show the key as ***."""
    monkeypatch.setenv("HOSTILE_TEST_KEY", "sk-secret")
    player = _player(hostile[0], kind)
    assert player.reply("a") == ""
    with pytest.raises(ConnectionError) as err:
        player.check()
    for text in (caplog.text, str(err.value)):
        assert len(text) < 1000 and "\x1b" not in text and "sk-secret" not in text, text[:300]


def test_a_reply_in_one_byte_chunks_takes_about_its_size_in_memory(hostile):
    """Each chunk is a piece read1 returns; a list of 1-byte pieces would take ~85 bytes a byte."""
    player = _player(hostile[0], "byte_chunks", max_reply_bytes=2**18)
    tracemalloc.start()
    try:
        assert player.reply("a") == "\\boxed{4}"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


def test_timeout_s_bounds_the_connect_to_a_host_with_many_addresses(hostile, monkeypatch):
    """Three addresses that never answer take timeout_s in all, not three times it; a refused
    address is passed over for the next one."""
    full = socket.create_server(("127.0.0.1", 0), backlog=0)  # once its queue is full it drops SYNs
    fillers = [socket.socket() for _ in range(4)]
    for f in fillers:
        f.setblocking(False)
        f.connect_ex(full.getsockname())
    probe = socket.socket()
    probe.settimeout(0.2)
    if probe.connect_ex(full.getsockname()) == 0:
        pytest.skip("this kernel completes connects to a full listener")
    good = ("127.0.0.1", int(hostile[0].rsplit(":", 1)[1].split("/")[0]))
    addresses = {"silent.test": [full.getsockname()] * 3, "fallback.test": [("127.0.0.1", 9), good]}
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", addr) for addr in addresses[host]] if host in addresses
        else real(host, port, *a, **k))
    start = time.perf_counter()
    assert _player("http://silent.test/v1", "good", timeout_s=0.5).reply("a") == ""
    assert time.perf_counter() - start < 1.0
    assert _player("http://fallback.test/v1", "good").reply("a") == "\\boxed{4}"
    for sock in [full, probe, *fillers]:
        sock.close()


def test_timeout_s_bounds_a_name_lookup_that_does_not_answer(hostile, monkeypatch):
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "stuck.test":  # a resolver that never answers
            time.sleep(5)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    player = _player("http://stuck.test/v1", "good", timeout_s=0.5)
    start = time.perf_counter()
    assert player.reply("a") == "" and player.failures == 1
    assert time.perf_counter() - start < 1.5
    with pytest.raises(ConnectionError, match="did not answer in time .*name lookup of stuck.test"):
        player.check()
    assert _player("http://nosuchhost.invalid/v1", "good", timeout_s=5).reply("a") == ""  # a failed lookup: at once


def test_a_reply_longer_than_max_tokens_can_spell_is_an_invalid_move(hostile, caplog):
    """200,000 characters against max_tokens=4096: a server that ignored max_tokens, and a move some
    games' parsers would take seconds to read."""
    assert _player(hostile[0], "long_text").reply("a") == ""
    assert "a reply of 200009 characters, more than max_tokens=4096 tokens can spell" in caplog.text
    assert _player(hostile[0], "long_text", max_tokens=8192).reply("a").endswith("\\boxed{4}")


@pytest.mark.parametrize("kind", ["odd_length", "long_length"])
def test_a_content_length_http_client_ignores_does_not_spoil_the_reply(hostile, kind):
    """'²' (a digit to str.isdigit, not to int()) and 5,000 digits (past int()'s limit): http.client
    drops such a length and reads the body to the end, and so does the player."""
    assert _player(hostile[0], kind).reply("a") == "\\boxed{4}"
    _player(hostile[0], kind).check()


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                               st.just("\ud800")),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner,
                                                                                          max_size=3)), max_leaves=10)
_CONTENT = st.one_of(st.text(max_size=40), _JSON, st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "reasoning"]), "text": _JSON}), _JSON), max_size=3))
# Completion-shaped replies with anything where the text belongs, and any JSON at all.
_REPLY = st.one_of(_JSON, _CONTENT.map(lambda c: {"choices": [{"message": {"content": c}}]}),
                   st.fixed_dictionaries({"choices": st.one_of(_JSON, st.lists(_JSON, max_size=2))}))


@given(reply=_REPLY)
@settings(max_examples=500, deadline=None)
def test_any_decoded_reply_is_a_move_or_a_counted_failure(reply):
    """Whatever JSON an endpoint answers, a move's reply is text (possibly "", an invalid move counted in
    failures), never an exception; only a reply with usable text counts as a success."""
    player = ApiPlayer("m", "http://127.0.0.1:9/v1", retries=0, max_tokens=8)
    player._request = lambda path, body=None: reply
    text = player.reply("Your move.")
    assert isinstance(text, str) and player.calls == 1
    text.encode("utf-8")  # real text: no lone surrogate
    assert player.failures in (0, 1) and not (text and player.failures)
    if text:  # the reply's own text, all of it
        content = reply["choices"][0]["message"]["content"]
        assert text == (content if isinstance(content, str) else "".join(
            p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"))
