"""HTTP for API players: one request bounded in time and size, with redirects refused.

`fetch` is urllib with three guards an endpoint on the internet needs: a deadline for the whole
request (name lookup, connect, headers and body), a cap on the reply's size that holds while it is
read, and no redirects, so the key in the Authorization header never reaches another address. Whatever
the server says (a status line, a Location header, an error body) reaches logs and errors short, with
control characters escaped and the key shown as ***.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request


class RedirectRefused(ConnectionError):
    """The endpoint answered with a redirect, which is not followed (the key would go with it)."""


class ReplyTooLarge(ConnectionError):
    """A reply body longer than `max_reply_bytes`."""


def fetch(url: str, data: bytes | None, headers: dict, timeout_s: float, max_bytes: int,
          secret: str | None = None) -> bytes:
    """The body of the reply to a GET (`data` None) or a POST of `data`, within `timeout_s` in all and
    `max_bytes`. Raises urllib's HTTPError for an error status (its `detail`: what the error body says),
    TimeoutError past the deadline, RedirectRefused, ReplyTooLarge, ConnectionError for a malformed
    reply and OSError for the rest. `secret` is never shown in an error."""
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
    deadline = _Deadline(timeout_s)
    opener = urllib.request.build_opener(_RefuseRedirects(), _DeadlineHTTPHandler(deadline),
                                         _DeadlineHTTPSHandler(deadline))
    late = TimeoutError(f"no complete reply from {url} within timeout_s={timeout_s:g} s")
    try:
        with opener.open(req, timeout=timeout_s) as response:
            raw = _read_capped(response, max_bytes, url)
    except urllib.error.HTTPError as err:
        err.detail = _error_detail(err, secret)  # read now, while the deadline still holds
        raise
    except (OSError, http.client.HTTPException) as err:
        if isinstance(getattr(err, "reason", None), TimeoutError):  # urllib's wrapping of a lookup or connect
            raise TimeoutError(f"{late}: {err.reason}") from None
        if deadline.expired:
            raise late from None
        if isinstance(err, http.client.HTTPException):  # a malformed status line, a cut-off body
            shown = _shown(repr(err), secret)
            raise ConnectionError(f"{url} sent a malformed HTTP reply ({shown})") from None
        raise
    finally:
        deadline.cancel()
    if deadline.expired:  # the shut-down socket read as the end: what came may be cut off
        raise late
    return raw


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


def _error_detail(err: urllib.error.HTTPError, secret: str | None) -> str:
    """What an error reply says, short and safe (`_shown`): its error message where it is JSON that has
    one (OpenAI's {"error": {"message": ...}}, or {"detail": ...}), else its first bytes as text."""
    try:
        raw = err.read(4096)
    except (OSError, http.client.HTTPException):
        return ""
    try:
        body = json.loads(raw)
        error = body.get("error") if isinstance(body, dict) else None
        text = next((m for m in (error.get("message") if isinstance(error, dict) else error,
                                 body.get("detail") if isinstance(body, dict) else None) if isinstance(m, str)), "")
    except (ValueError, RecursionError):  # not JSON (an HTML error page, plain text) or cut off at 4 KiB
        text = raw.decode("utf-8", "replace")
    return _shown(" ".join(text.split()), secret)


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
