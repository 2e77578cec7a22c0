"""A game player behind an OpenAI-compatible chat completions endpoint (an API model, or another
model served by `spiral-jax serve`).

Opponents are written `openai:MODEL@BASE_URL`, e.g. `openai:gemini-2.0-flash@https://host/v1`; the
key comes from the environment variable the config names (`api.key_env`). A player sends each move's
prompt as one user message and returns the reply's text, which the game's action rules then read like
the model's own. A reply that cannot be had (timeouts and server errors after the retries, a refused
request, a body without text) is an empty response, hence that player's invalid move: counted in
`failures`, logged, never an exception. `check()` reaches the endpoint before a run starts, so a dead
URL, a refused key or an endpoint that is not an API is a clear error up front.

Each request is bounded: `timeout_s` is the whole request's deadline (name lookup, connect, headers
and body; a server that trickles bytes is cut off at it), a reply larger than `max_reply_bytes` is refused while
it is read, and a redirect is never followed, so the key in the Authorization header never reaches an
address other than BASE_URL.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Sequence

from spiral_jax.policies import API_PREFIX, kind

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}  # worth another try; other 4xx are final
# More characters than `max_tokens` tokens of any real vocabulary spell: a server that ignored
# max_tokens. Such a reply is refused, as a game's move parser may take time quadratic in its length.
_MAX_CHARS_PER_TOKEN = 32


@dataclasses.dataclass
class ApiPlayer:
    model: str
    base_url: str  # up to and including the version, e.g. http://localhost:8000/v1
    api_key: str | None = dataclasses.field(default=None, repr=False)  # never in a repr, log or error
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 4096
    timeout_s: float = 60.0  # the deadline of one request, from connecting to the last byte
    max_reply_bytes: int = 4 * 2**20  # a longer reply is refused while it is read
    retries: int = 3  # further tries after the first, with doubling waits from `backoff_s`
    backoff_s: float = 1.0
    concurrency: int = 8  # requests in flight at once
    failures: int = 0  # moves that got no usable reply
    calls: int = 0

    def __post_init__(self):
        """Refuses a key an HTTP header cannot carry (a line break, say, from a key file) now: sending
        it would fail in http.client with an error that quotes the key."""
        if self.api_key and not (self.api_key.isascii() and self.api_key.isprintable()):
            raise ValueError("the API key holds a line break, a control character or a non-ASCII character, "
                             "which an HTTP header cannot carry; check the environment variable named by "
                             "api.key_env")
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str, key_env: str = "OPENAI_API_KEY", **settings) -> "ApiPlayer":
        """`openai:MODEL@BASE_URL`, the key read from the environment variable `key_env` (none is
        sent when it is unset, as local servers need none). Credentials in the URL (user:pass@) are
        refused, and the error shows them as ***."""
        model, sep, url = spec[len(API_PREFIX):].rpartition("@") if kind(spec) == "api" else ("", "", "")
        shown = re.sub(r"://.*@", "://***@", spec)
        if "://" in model:  # the last "@" ended a user:pass in the URL
            raise ValueError(f"API opponent {shown!r}: credentials in BASE_URL are not sent; put the key in the "
                             "environment variable named by api.key_env (OPENAI_API_KEY by default)")
        if not (model and sep and url.startswith(("http://", "https://"))):
            raise ValueError(f"API opponent {shown!r}: write it openai:MODEL@BASE_URL, e.g. "
                             "openai:gpt-4o-mini@https://api.openai.com/v1 or openai:local@http://localhost:8000/v1")
        return cls(model, url.rstrip("/"), os.environ.get(key_env) or None, **settings)

    def _request(self, path: str, body: dict | None = None) -> dict:
        """The decoded JSON reply to one request, within `timeout_s` in all and `max_reply_bytes`."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        url = f"{self.base_url}{path}"
        req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
        deadline = _Deadline(self.timeout_s)
        opener = urllib.request.build_opener(_RefuseRedirects(), _DeadlineHTTPHandler(deadline),
                                             _DeadlineHTTPSHandler(deadline))
        late = TimeoutError(f"no complete reply from {url} within timeout_s={self.timeout_s:g} s")
        try:
            with opener.open(req, timeout=self.timeout_s) as response:
                raw = _read_capped(response, self.max_reply_bytes, url)
        except urllib.error.HTTPError:
            raise
        except (OSError, http.client.HTTPException) as err:
            if isinstance(getattr(err, "reason", None), TimeoutError):  # urllib's wrapping of a lookup or connect
                raise TimeoutError(f"{late}: {err.reason}") from None
            if deadline.expired:
                raise late from None
            if isinstance(err, http.client.HTTPException):  # a malformed status line, a cut-off body
                shown = _shown(repr(err), self.api_key)
                raise ConnectionError(f"{url} sent a malformed HTTP reply ({shown})") from None
            raise
        finally:
            deadline.cancel()
        if deadline.expired:  # the shut-down socket read as the end: what came may be cut off
            raise late
        try:
            return json.loads(raw)
        except RecursionError:  # e.g. "[[[[...": Python's decoder recurses once per level
            raise ValueError(f"the reply from {url} nests JSON too deeply to decode") from None

    def check(self) -> None:
        """Reach the endpoint (GET /models) once: a clear error now instead of a run of invalid moves.
        Raises PermissionError for a refused key and ConnectionError for anything else that is wrong
        (no server, a redirect, a timeout, a reply that is too large or not JSON); a busy endpoint
        (429, 503) passes with a warning."""
        url = f"{self.base_url}/models"
        try:
            self._request("/models")
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise PermissionError(f"{self.base_url} refused the API key (HTTP {err.code}); set the "
                                      "environment variable named by api.key_env") from None
            if err.code in (429, 503):  # alive but busy now: each move retries as it would later
                log.warning("API opponent %s: %s answered HTTP %d (busy); going on, moves retry", self.model, url,
                            err.code)
            elif err.code != 404:  # an endpoint without /models is still alive
                raise ConnectionError(f"{url} answered HTTP {err.code}") from None
        except (RedirectRefused, ReplyTooLarge) as err:
            raise ConnectionError(str(err)) from None
        except TimeoutError as err:
            raise ConnectionError(f"the API opponent at {self.base_url} did not answer in time ({err}); "
                                  f"check the server, or raise api.timeout_s") from None
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(f"cannot reach the API opponent at {self.base_url} ({err}); start the "
                                  f"server (e.g. spiral-jax serve) or fix the URL") from None
        except ValueError as err:  # not UTF-8, not JSON
            raise ConnectionError(f"{url} answered something that is not JSON ({type(err).__name__}: "
                                  f"{str(err)[:200]}); is {self.base_url} an OpenAI-compatible endpoint "
                                  f"(ending in /v1)?") from None

    def reply(self, prompt: str) -> str:
        """The model's answer to one user message; "" (counted and logged) when none can be had."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                content = _text(self._request("/chat/completions", body)["choices"][0]["message"]["content"])
                if isinstance(content, str) and len(content) > self.max_tokens * _MAX_CHARS_PER_TOKEN:
                    problem = (f"a reply of {len(content)} characters, more than max_tokens={self.max_tokens} "
                               f"tokens can spell: the server ignored max_tokens")
                    break
                if isinstance(content, str):
                    content.encode("utf-8")  # a lone surrogate (JSON can hold one) is no text: ValueError
                    with self._lock:
                        self.calls += 1
                    return content
                problem = f"a reply without text ({type(content).__name__})"
                break
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code}"
                if err.code not in _RETRY_STATUS:
                    break
            except (RedirectRefused, ReplyTooLarge) as err:  # the same again next time: final
                problem = str(err)
                break
            except (urllib.error.URLError, OSError) as err:  # refused, reset, timed out
                problem = str(err)
            except (ValueError, KeyError, IndexError, TypeError) as err:  # not JSON, or not a completion
                problem = f"an unreadable reply ({type(err).__name__}: {err})"  # a repr could hold the body
                break
        with self._lock:
            self.calls += 1
            self.failures += 1
            failures = self.failures
        if failures <= 3 or str(failures).strip("0") == "1":  # a dead server: the 1st-3rd, 10th, 100th, ...
            log.warning("API opponent %s@%s: no usable reply (%s); the move is invalid%s", self.model,
                        self.base_url, problem, f" ({failures} such moves so far; logged at 1-3, 10, 100, ...)"
                        if failures > 3 else "")
        return ""

    def replies(self, prompts: Sequence[str]) -> list[str]:
        """Answers to many prompts, at most `concurrency` requests at once, in order."""
        if len(prompts) <= 1:
            return [self.reply(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self.reply, prompts))


class RedirectRefused(ConnectionError):
    """The endpoint answered with a redirect, which is not followed (the key would go with it)."""


class ReplyTooLarge(ConnectionError):
    """A reply body longer than `max_reply_bytes`."""


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Replaces urllib's redirect handler, which would resend the request, Authorization header
    included, to whatever address the Location header names."""

    def _refuse(self, req, fp, code, msg, headers):
        fp.close()
        key = (req.get_header("Authorization") or "").removeprefix("Bearer ")
        location = _shown(headers.get("Location", "(no Location header)"), key)
        raise RedirectRefused(f"{req.full_url} answered HTTP {code}, a redirect to {location}; redirects are "
                              f"not followed, so the API key is never sent elsewhere: set BASE_URL in "
                              f"openai:MODEL@BASE_URL to the address that answers directly")

    http_error_301 = http_error_302 = http_error_303 = http_error_307 = http_error_308 = _refuse


class _Deadline:
    """A whole request's time limit. Socket timeouts bound each read, not their sum, so a server
    sending a byte at a time never trips them; at the deadline this shuts the request's sockets down,
    which ends any read blocked on them."""

    def __init__(self, seconds: float):
        self.expired, self._sockets, self._lock = False, [], threading.Lock()
        self._end = time.monotonic() + seconds
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            self._shut(sock)

    def connect(self, address, timeout, source_address=None) -> socket.socket:
        """socket.create_connection, each of the host's addresses tried in the time left (that function
        gives each one the whole timeout: N addresses that do not answer would take N times timeout_s)."""
        error = None
        for family, kind_, proto, _, addr in self._lookup(*address):
            left = self._end - time.monotonic()
            if left <= 0:
                break
            sock = socket.socket(family, kind_, proto)
            try:
                sock.settimeout(min(timeout, left))
                if source_address:
                    sock.bind(source_address)
                sock.connect(addr)
            except OSError as err:
                sock.close()
                error = err
                continue
            self.watch(sock)  # from now on, e.g. through a TLS handshake
            return sock
        raise error or TimeoutError("timed out")

    def _lookup(self, host, port) -> list:
        """socket.getaddrinfo within the time left. It cannot be interrupted, so it runs in a daemon
        thread, which a resolver that does not answer leaves behind until the system's own limit."""
        found, done = [], threading.Event()

        def resolve():
            try:
                found.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
            except OSError as err:
                found.append(err)
            done.set()

        threading.Thread(target=resolve, daemon=True).start()
        if not done.wait(max(0.0, self._end - time.monotonic())):
            raise TimeoutError(f"the name lookup of {host} did not finish in time")
        if isinstance(found[0], OSError):
            raise found[0]
        return found[0]

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock) -> None:
        try:  # the plain socket's shutdown, also under TLS: it wakes a reader blocked on the descriptor
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:  # already closed
            pass

    def cancel(self) -> None:
        self._timer.cancel()


class _WatchedConnections:
    """A urllib handler mix-in whose connections hand their sockets to the request's deadline."""

    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class, req, **kwargs):
        deadline = self._deadline

        class Watched(http_class):
            def connect(self):
                self._create_connection = deadline.connect
                super().connect()
                deadline.watch(self.sock)

        return super().do_open(Watched, req, **kwargs)


class _DeadlineHTTPHandler(_WatchedConnections, urllib.request.HTTPHandler):
    pass


class _DeadlineHTTPSHandler(_WatchedConnections, urllib.request.HTTPSHandler):
    pass


def _shown(text: str, secret: str | None, limit: int = 200) -> str:
    """A server's words (a status line, a Location header) as they go into a log line or an error:
    `secret` (the key, which the server may echo) as ***, control characters escaped, at most `limit`
    characters of it; a hostile server can send 64 KiB of them."""
    if secret:
        text = text.replace(secret, "***")
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _read_capped(response, limit: int, url: str) -> bytes:
    """The body, read a piece at a time so that one larger than `limit` bytes is never held whole.
    The pieces go into one bytearray: a list would cost ~85 bytes a piece, and a server sending
    one-byte chunks makes a piece of each byte."""
    too_large = (f"the reply from {url} is larger than max_reply_bytes={limit} (api.max_reply_bytes); "
                 f"is it an OpenAI-compatible endpoint?")
    try:  # read as http.client reads it
        declared = int(response.headers.get("Content-Length", ""))
    except ValueError:  # none, '²' (a digit to str.isdigit) or past int's 4,300 digits: read to the end
        declared = 0
    if declared > limit:
        raise ReplyTooLarge(too_large)
    body = bytearray()
    while piece := response.read1(65536):
        if len(body) + len(piece) > limit:
            raise ReplyTooLarge(too_large)
        body += piece
    return bytes(body)


def _text(content):
    """A reply's text: its content when a string; for content given as parts (some OpenAI-compatible
    servers send [{"type": "text", "text": ...}, ...], a reasoning model's thinking among them) the
    text parts joined; anything else as it is, for the caller to refuse."""
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return content
