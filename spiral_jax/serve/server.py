"""The HTTP side of `spiral-jax serve`: routes, limits, authentication, streaming and shutdown.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/completions` (the OpenAI
formats, `protocol.py`). What a hostile or broken client can do is bounded:

- the body: `Content-Length` is required and checked before anything is read (413 above
  `max_body_bytes`); its JSON and every field are checked (400 naming the field);
- connections: the listen backlog and the number of connections served at once are sized for the
  configured concurrency (503 beyond it); a connection idle or trickling for `timeout_s` is closed;
  a client that goes away has its answers cancelled; disconnects are logged in one line;
- access: with `api_key`, every request needs `Authorization: Bearer <key>` (401); a browser page
  from another origin is refused (403) unless `allow_origin` names it, and on a loopback address
  the `Host` header must be a loopback name, so a web page cannot reach the server by DNS rebinding.
"""
from __future__ import annotations

import dataclasses
import hmac
import http.server
import ipaddress
import json
import logging
import math
import queue
import re
import select
import socket
import sys
import threading

from spiral_jax.serve import protocol
from spiral_jax.serve.protocol import ApiError, Limits
from spiral_jax.serve.scheduler import Job, Scheduler

log = logging.getLogger(__name__)
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")  # what a browser sends as Origin: scheme://host[:port]


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How `ChatServer` listens and what it takes."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (see ChatServer.url)
    max_rows: int = 64  # decode slots, also the most answers one request may ask for
    max_tokens: int = 4096  # new tokens per answer
    seed: int = 0
    api_key: str | None = None  # bearer key every request must carry
    allow_origin: tuple[str, ...] = ()  # browser origins allowed to call ("*": any)
    max_body_bytes: int = 4 << 20
    timeout_s: float = 60.0  # a connection that sends nothing for this long is closed
    max_connections: int = 256  # served at once; more are answered 503
    max_queued: int = 1024  # answers waiting for a slot; more are answered 503
    shutdown_s: float = 30.0  # how long `close` lets running answers finish
    stream_steps: int = 16  # decode steps between looks at the running answers (stream chunks, stop strings)

    def __post_init__(self):
        for name in ("max_rows", "max_tokens", "max_body_bytes", "max_connections", "max_queued", "stream_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"serve: {name} must be at least 1, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("serve: api_key is empty; give a key or none")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"serve: port {self.port} is not a TCP port; give one of 1-65535, or 0 for any free one")
        if not 0 < self.timeout_s < math.inf:  # 0 would make every socket non-blocking, below 0 fail each request
            raise ValueError(f"serve: timeout_s must be a number of seconds above 0, got {self.timeout_s:g}")
        if not 0 <= self.shutdown_s <= math.inf:
            raise ValueError(f"serve: shutdown_s must be a number of seconds, 0 or more, got {self.shutdown_s:g}")
        if bad := [o for o in self.allow_origin if o not in ("*", "null") and not _ORIGIN.fullmatch(o)]:
            raise ValueError(f"serve: allow_origin {bad[0]!r} is not an origin as browsers send it: scheme://host[:port], "
                             f"no path or trailing /, e.g. https://app.example (or '*' for any)")


class ChatServer:
    """Serves `params` through `sampler` (its model and mesh) with `tokenizer`'s template."""

    def __init__(self, sampler, tokenizer, params, model_name: str, settings: ServeSettings | None = None, **changes):
        self.settings = s = dataclasses.replace(settings or ServeSettings(), **changes)
        slots = -(-s.max_rows // sampler.min_batch_bucket) * sampler.min_batch_bucket
        self.limits = Limits(model_name, s.max_rows, s.max_tokens, sampler.max_prompt_len)
        self.tokenizer, self.model_name = tokenizer, model_name
        self.scheduler = Scheduler(sampler, tokenizer, params, slots, s.max_tokens, s.seed, s.max_queued,
                                   s.stream_steps)
        self.http = _HttpServer((s.host, s.port), _handler(self), s.max_connections)

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        self.http.serve_forever()

    def start(self) -> threading.Thread:
        """Serve from a background thread (tests, notebooks); `close()` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="spiral-jax-serve-http", daemon=True)
        thread.start()
        return thread

    def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting connections, answer waiting requests 503, let running answers finish for
        `timeout_s` (default: settings.shutdown_s), then cancel them (503)."""
        self.scheduler.stop(self.settings.shutdown_s if timeout_s is None else timeout_s)  # the bound starts now
        self.http.shutdown()  # returns once serve_forever has seen it (within its half-second poll)
        self.http.server_close()
        self.scheduler.join()

    @property
    def answers_started(self) -> int:
        """Answers (choices) that have begun decoding since the server started."""
        return self.scheduler.answers_started

    def piece(self, token: int) -> str:
        return self.tokenizer.decode([token])


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        self.request_queue_size = max(128, max_connections)  # the listen backlog
        self.connections = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.connections.acquire(blocking=False):
            try:
                body = json.dumps(ApiError(503, "too many connections; retry later").body()).encode()
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            log.info("client %s went away (%s)", client_address[0], type(err).__name__)
        else:
            log.exception("error while serving %s", client_address[0])


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _handler(server: ChatServer):
    s = server.settings
    loopback = _is_loopback(s.host)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = s.timeout_s  # socket timeout: idle keep-alive connections and slow bodies

        # ------------------------------------------------------------------------------ replies

        def _cors(self) -> None:
            origin = self.headers.get("Origin")
            if origin and ("*" in s.allow_origin or origin in s.allow_origin):
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Vary", "Origin")

        def _send(self, status: int, payload: dict, headers: tuple = (), cors: bool = True) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers:
                self.send_header(name, value)
            if cors:
                self._cors()
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, err: ApiError) -> None:
            self._send(err.status, err.body())

        def send_error(self, code, message=None, explain=None):
            """http.server's own refusals (a malformed request line or header, a method with no do_
            here), in JSON like every other error; the connection closes after."""
            if code == 501:  # the method: this API has GET, HEAD, POST and OPTIONS
                code, message = 405, (f"method {self.command} is not allowed; this server has GET /v1/models, "
                                      "POST /v1/chat/completions and POST /v1/completions")
            message = message or self.responses.get(code, ("error",))[0]
            self.close_connection = True
            self.request_version = self.protocol_version  # a request line it could not read still gets a status line
            # No CORS headers: the request's headers may not have been read (or be an earlier request's).
            self._send(code, ApiError(code, f"{message} ({explain})" if explain else message).body(),
                       (("Allow", "GET, HEAD, POST, OPTIONS"),) if code == 405 else (), cors=False)

        def _guard(self) -> None:
            """Host, origin and key checks every request passes first."""
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
            if loopback and host not in _LOOPBACK_NAMES:
                raise ApiError(403, f"Host {host!r} is not a loopback name; this server listens on {s.host} "
                                    "(serve with --host 0.0.0.0 to take other names)")
            origin = self.headers.get("Origin")
            if origin and not ("*" in s.allow_origin or origin in s.allow_origin):
                raise ApiError(403, f"requests from the browser origin {origin!r} are refused; serve with "
                                    f"--allow_origin={origin} to allow it")
            if s.api_key is not None:
                given = self.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {s.api_key}".encode()):
                    raise ApiError(401, "missing or wrong API key: send Authorization: Bearer <the server's "
                                        "--api_key>")

        def _body(self) -> dict:
            length = (self.headers.get("Content-Length") or "").strip()
            if self.headers.get("Transfer-Encoding"):
                raise ApiError(411, "chunked bodies are not supported; send Content-Length")
            if not length:
                raise ApiError(411, "a POST needs a Content-Length header")
            if len({v.strip() for v in self.headers.get_all("Content-Length")}) > 1:  # which one would a proxy read?
                raise protocol.bad("the request has Content-Length headers that disagree")
            if not (length.isascii() and length.isdigit()):  # str.isdigit takes "²" too
                raise protocol.bad(f"Content-Length must be a non-negative whole number, got {length!r}")
            length = length.lstrip("0") or "0"
            if len(length) > len(str(s.max_body_bytes)) or int(length) > s.max_body_bytes:  # int() takes 4300 digits
                raise ApiError(413, f"the body is {length if len(length) < 20 else 'over 10^19'} bytes; this server "
                                    f"takes at most {s.max_body_bytes}")
            return protocol.decode_body(self.rfile.read(int(length)))

        # ------------------------------------------------------------------------------- routes

        def _bodiless(self) -> None:
            """A GET, HEAD or OPTIONS with a body: it is not read, so the connection closes after the
            answer (left there, it would read as the next request)."""
            if self.headers.get("Transfer-Encoding") or (self.headers.get("Content-Length") or "0").strip() != "0":
                self.close_connection = True

        def do_OPTIONS(self):  # noqa: N802 (a browser's CORS preflight)
            self._bodiless()
            try:
                self._guard()
            except ApiError as err:
                return self._error(err)
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
            self.send_header("Content-Length", "0")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self._bodiless()
            try:
                self._guard()
                if self.path.rstrip("/") not in ("/v1/models", "/models"):
                    raise ApiError(404, f"no such endpoint GET {self.path}; this server has GET /v1/models, "
                                        "POST /v1/chat/completions and POST /v1/completions")
                self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model",
                                                             "created": 0, "owned_by": "spiral-jax"}]})
            except ApiError as err:
                self._error(err)

        do_HEAD = do_GET  # noqa: N815 (GET's status and headers, no body: _send)

        def do_POST(self):  # noqa: N802
            body = None
            try:
                self._guard()
                path = self.path.rstrip("/").removeprefix("/v1")
                parse = {"/chat/completions": protocol.parse_chat, "/completions": protocol.parse_text}.get(path)
                if parse is None:
                    raise ApiError(404, f"no such endpoint POST {self.path}; POST /v1/chat/completions or "
                                        "/v1/completions")
                body = self._body()
                ask = parse(body, server.tokenizer, server.limits)
                job = Job(ask)
                server.scheduler.submit(job)
            except ApiError as err:
                if body is None:  # refused before its body was read: left there, it would read as a request
                    self.close_connection = True
                return self._error(err)
            except (ConnectionError, TimeoutError):  # the client went away: nobody to answer
                raise
            except Exception as err:  # noqa: BLE001 (a bug in reading this request: answer it, keep serving)
                log.exception("reading a request to %s failed", self.path)
                self.close_connection = True
                return self._error(ApiError(500, f"the server failed to read this request ({type(err).__name__}); "
                                                 "its log has the details"))
            if ask.stream:
                return self._stream(job)
            if not self._wait(job):
                return
            if job.error is not None:
                return self._error(job.error)
            self._send(200, protocol.completion(ask, job.choices, server.model_name, server.piece))

        # ----------------------------------------------------------------------------- waiting

        def _gone(self) -> bool:
            """Has the client closed its end? (A readable socket with nothing to read.)"""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except (OSError, ValueError):
                return True

        def _wait(self, job: Job) -> bool:
            while not job.done.wait(0.25):
                if self._gone():
                    server.scheduler.cancel(job)
                    self.close_connection = True
                    log.info("client %s went away; its request is cancelled", self.client_address[0])
                    return False
            return True

        def _event(self, payload) -> None:
            self.wfile.write(b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
                             + b"\n\n")
            self.wfile.flush()

        def _stream(self, job: Job) -> None:
            """Server-sent events: a first chunk per answer, its text as it grows, its end, the usage
            chunk (stream_options.include_usage), then [DONE]. The connection closes after."""
            ask, model = job.ask, server.model_name
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self._cors()
            self.end_headers()
            try:
                for i in range(ask.rows):
                    self._event(protocol.chunk(ask, model, i, "", first=True))
                while True:
                    try:
                        event = job.events.get(timeout=0.25)
                    except queue.Empty:  # nothing new: is the client still there?
                        if self._gone():
                            raise ConnectionResetError("the client closed the stream") from None
                        continue
                    if event is None:
                        break
                    index, text, finish = event
                    self._event(protocol.chunk(ask, model, index, text, finish))
                if job.error is not None:
                    self._event(job.error.body())
                elif ask.include_usage:
                    self._event(protocol.chunk(ask, model, totals=protocol.usage(ask, job.choices)))
                self._event(b"[DONE]")
            except (ConnectionError, TimeoutError):
                server.scheduler.cancel(job)
                log.info("client %s went away mid-stream; its request is cancelled", self.client_address[0])

        def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
