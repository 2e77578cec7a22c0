"""A game player behind an OpenAI-compatible chat completions endpoint (an API model, or another
model served by `spiral-jax serve`).

Opponents are written `openai:MODEL@BASE_URL`, e.g. `openai:gemini-2.0-flash@https://host/v1`; the
key comes from the environment variable the config names (`api.key_env`). A player sends each move's
prompt as one user message and returns the reply's text, which the game's action rules then read like
the model's own. A reply that cannot be had (timeouts and server errors after the retries, a refused
request, a body without text) is an empty response, hence that player's invalid move: counted in
`failures`, logged, never an exception. `check()` reaches the endpoint before a run starts, so a dead
URL, a refused key or an endpoint that is not an API is a clear error up front.

Each request is bounded (`api_http.fetch`): `timeout_s` is the whole request's deadline (name lookup,
connect, headers and body; a server that trickles bytes is cut off at it), a reply larger than
`max_reply_bytes` is refused while it is read, and a redirect is never followed, so the key in the
Authorization header never reaches an address other than BASE_URL. What an error reply says goes into
the log line of the invalid move, and into `check()`'s error.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import email.utils
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
from typing import Sequence

from spiral_jax.api_http import RedirectRefused, ReplyTooLarge, fetch
from spiral_jax.policies import API_PREFIX, kind

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}  # worth another try; other 4xx are final
# More characters than `max_tokens` tokens of any real vocabulary spell: a server that ignored
# max_tokens. Such a reply is refused, as a game's move parser may take time quadratic in its length.
_MAX_CHARS_PER_TOKEN = 32
# The tokens `check()`'s move asks for: enough that no server refuses the request as too short to answer.
_PROBE_TOKENS = 16
# The longest wait between tries that a busy server's Retry-After is followed for (a day's quota is not).
_MAX_RETRY_AFTER_S = 60.0


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
        self._token_field = "max_tokens"  # or max_completion_tokens, where the server asks for it (`_move`)

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

    @classmethod
    def playing(cls, spec: str, sampling, api: dict) -> "ApiPlayer":
        """The player of a seat whose moves are sampled as `sampling` (a SamplingParams: its temperature,
        0 where greedy, its top-p and its token limit), with the config's `api` settings."""
        return cls.from_spec(spec, temperature=0.0 if sampling.greedy else sampling.temperature,
                             top_p=sampling.top_p, max_tokens=sampling.max_new_tokens, **api)

    def _request(self, path: str, body: dict | None = None) -> dict:
        """The decoded JSON reply to one request, within `timeout_s` in all and `max_reply_bytes`."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        url = f"{self.base_url}{path}"
        raw = fetch(url, data, headers, self.timeout_s, self.max_reply_bytes, self.api_key)
        try:
            return json.loads(raw)
        except RecursionError:  # e.g. "[[[[...": Python's decoder recurses once per level
            raise ValueError(f"the reply from {url} nests JSON too deeply to decode") from None

    def check(self) -> None:
        """Reach the endpoint once before a run: GET /models, then one move's request cut to a few tokens.
        A dead URL, a refused key, an endpoint that is not an API, and a move the server refuses (a model
        name it does not serve, a temperature the model does not take) are a clear error now instead of a
        run of invalid moves. Raises PermissionError for a refused key and ConnectionError for anything
        else; a busy endpoint (429, 503) passes with a warning, as its moves retry."""
        err = self._reach("/models")
        if err is not None and err.code != 404:  # an endpoint without /models is still alive
            raise ConnectionError(f"{self.base_url}/models answered HTTP {err.code}{_said(err)}")
        err = self._reach("/chat/completions", "Reply with OK.", min(self.max_tokens, _PROBE_TOKENS))
        if err is not None:
            raise ConnectionError(
                f"{self.base_url}/chat/completions refused a move's request (HTTP {err.code}{_said(err)}); check "
                f"the model name {self.model!r} and the sampling the server is sent: temperature "
                f"{self.temperature:g}, top_p {self.top_p:g}, {self._token_field} {self.max_tokens} (the "
                f"seat's rollout or eval temperature, top_p and max_new_tokens)")

    def _reach(self, path: str, prompt: str | None = None, max_tokens: int = 1) -> urllib.error.HTTPError | None:
        """GET `path`, or POST a move's request for `prompt`: None when it is answered or the server is busy
        now (429, 503: logged), the HTTPError of any other status; PermissionError for a refused
        key, ConnectionError when no answer that is JSON can be had."""
        url = f"{self.base_url}{path}"
        try:
            self._request(path) if prompt is None else self._move(prompt, max_tokens)
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise PermissionError(f"{self.base_url} refused the API key (HTTP {err.code}{_said(err)}); set the "
                                      "environment variable named by api.key_env") from None
            if err.code not in (429, 503):
                return err
            log.warning("API opponent %s: %s answered HTTP %d%s (busy); going on, moves retry", self.model, url,
                        err.code, _said(err))
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
        return None

    def _move(self, prompt: str, max_tokens: int) -> dict:
        """POST one move's request. A model that takes max_completion_tokens in place of max_tokens
        (OpenAI's reasoning models answer 400 naming it) is sent that field from then on."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "top_p": self.top_p}
        try:
            return self._request("/chat/completions", {**body, self._token_field: max_tokens})
        except urllib.error.HTTPError as err:
            if not (err.code == 400 and self._token_field == "max_tokens" and
                    "max_completion_tokens" in getattr(err, "detail", "")):
                raise
        with self._lock:
            if self._token_field == "max_tokens":
                log.info("API opponent %s: the server asks for max_completion_tokens; sending it in place of "
                         "max_tokens", self.model)
            self._token_field = "max_completion_tokens"
        return self._request("/chat/completions", {**body, self._token_field: max_tokens})

    def reply(self, prompt: str) -> str:
        """The model's answer to one user message; "" (counted and logged) when none can be had."""
        problem, asked = "", 0.0
        for attempt in range(self.retries + 1):
            if attempt:  # doubling waits, or longer where the server said how long (429's Retry-After)
                time.sleep(max(self.backoff_s * 2 ** (attempt - 1), asked))
            try:
                content = _text(self._move(prompt, self.max_tokens)["choices"][0]["message"]["content"])
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
                problem = f"HTTP {err.code}{_said(err)}"
                if err.code not in _RETRY_STATUS:
                    break
                asked = _retry_after(err.headers or {})
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


def _retry_after(headers) -> float:
    """The wait a busy server asks for before the next try, in seconds, at most `_MAX_RETRY_AFTER_S`:
    `retry-after-ms` (OpenAI's) or `Retry-After` (seconds or an HTTP date); 0 where it names none."""
    try:
        if headers.get("retry-after-ms"):
            wait = float(headers["retry-after-ms"]) / 1000
        elif (value := (headers.get("Retry-After") or "").strip()).replace(".", "", 1).isdigit():
            wait = float(value)
        elif value:
            wait = (email.utils.parsedate_to_datetime(value) - datetime.datetime.now(datetime.timezone.utc)
                    ).total_seconds()
        else:
            return 0.0
    except (TypeError, ValueError, OverflowError):  # a date without a zone, or nothing a date can be
        return 0.0
    return min(max(wait, 0.0), _MAX_RETRY_AFTER_S) if math.isfinite(wait) else 0.0


def _said(err: urllib.error.HTTPError) -> str:
    detail = getattr(err, "detail", "")
    return f": {detail}" if detail else ""


def _text(content):
    """A reply's text: its content when a string; for content given as parts (some OpenAI-compatible
    servers send [{"type": "text", "text": ...}, ...], a reasoning model's thinking among them) the
    text parts joined; anything else as it is, for the caller to refuse."""
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return content
