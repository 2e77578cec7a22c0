"""A game player behind an OpenAI-compatible chat completions endpoint (an API model, or another
model served by `spiral-jax serve`).

Opponents are written `openai:MODEL@BASE_URL`, e.g. `openai:gemini-2.0-flash@https://host/v1`; the
key comes from the environment variable the config names (`api.key_env`). A player sends each move's
prompt as one user message and returns the reply's text, which the game's action rules then read like
the model's own. A reply that cannot be had (timeouts and server errors after the retries, a refused
request, a body without text) is an empty response, hence that player's invalid move: counted in
`failures`, logged, never an exception. `check()` reaches the endpoint before a run starts, so a dead
URL or a refused key is a clear error up front.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Sequence

log = logging.getLogger(__name__)

PREFIX = "openai:"
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}  # worth another try; other 4xx are final


def is_api_spec(name: str) -> bool:
    return name.startswith(PREFIX)


@dataclasses.dataclass
class ApiPlayer:
    model: str
    base_url: str  # up to and including the version, e.g. http://localhost:8000/v1
    api_key: str | None = None
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 4096
    timeout_s: float = 60.0
    retries: int = 3  # further tries after the first, with doubling waits from `backoff_s`
    backoff_s: float = 1.0
    concurrency: int = 8  # requests in flight at once
    failures: int = 0  # moves that got no usable reply
    calls: int = 0

    def __post_init__(self):
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str, key_env: str = "OPENAI_API_KEY", **settings) -> "ApiPlayer":
        """`openai:MODEL@BASE_URL`, the key read from the environment variable `key_env` (none is
        sent when it is unset, as local servers need none)."""
        model, sep, url = spec[len(PREFIX):].rpartition("@") if is_api_spec(spec) else ("", "", "")
        if not (model and sep and url.startswith(("http://", "https://"))):
            raise ValueError(f"API opponent {spec!r}: write it openai:MODEL@BASE_URL, e.g. "
                             "openai:gpt-4o-mini@https://api.openai.com/v1 or openai:local@http://localhost:8000/v1")
        return cls(model, url.rstrip("/"), os.environ.get(key_env) or None, **settings)

    def _request(self, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=headers,
                                     method="GET" if body is None else "POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as response:
            return json.loads(response.read())

    def check(self) -> None:
        """Reach the endpoint (GET /models) once: a clear error now instead of a run of invalid moves."""
        try:
            self._request("/models")
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise PermissionError(f"{self.base_url} refused the API key (HTTP {err.code}); set the "
                                      "environment variable named by api.key_env") from None
            if err.code != 404:  # an endpoint without /models is still alive
                raise ConnectionError(f"{self.base_url}/models answered HTTP {err.code}") from None
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(f"cannot reach the API opponent at {self.base_url} ({err}); start the "
                                  f"server (e.g. spiral-jax serve) or fix the URL") from None

    def reply(self, prompt: str) -> str:
        """The model's answer to one user message; "" (counted and logged) when none can be had."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                content = self._request("/chat/completions", body)["choices"][0]["message"]["content"]
                if isinstance(content, str):
                    with self._lock:
                        self.calls += 1
                    return content
                problem = f"a reply without text ({type(content).__name__})"
                break
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code}"
                if err.code not in _RETRY_STATUS:
                    break
            except (urllib.error.URLError, OSError) as err:  # refused, reset, timed out
                problem = str(err)
            except (ValueError, KeyError, IndexError, TypeError) as err:  # not JSON, or not a completion
                problem = f"an unreadable reply ({err!r})"
                break
        with self._lock:
            self.calls += 1
            self.failures += 1
        log.warning("API opponent %s@%s: no usable reply (%s); the move is invalid", self.model, self.base_url,
                    problem)
        return ""

    def replies(self, prompts: Sequence[str]) -> list[str]:
        """Answers to many prompts, at most `concurrency` requests at once, in order."""
        if len(prompts) <= 1:
            return [self.reply(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self.reply, prompts))
