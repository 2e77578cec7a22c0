"""`spiral-jax serve`: a model behind an OpenAI-compatible HTTP endpoint, from the same sampler.

Endpoints: `GET /v1/models` and `POST /v1/chat/completions` (messages, max_tokens, temperature, top_p,
n, seed). The messages are rendered with the config's prompt template, so a game move sent by an API
player (`api_player.py`: one user message holding the instruction, observation and suffix) reaches the
model as exactly the prompt the trainer's own rollouts give it. Generation stops at the tokenizer's
stop ids.

One worker thread owns the sampler. Requests that arrive while it is busy are sampled together: it
takes every waiting request with the same settings into one `generate` call (up to `max_rows` rows).
Their randomness comes from the server's seed and a running row counter; a request that gives its own
`seed` is sampled alone, keyed by that seed and its choice index, so its answer is reproducible.
"""
from __future__ import annotations

import dataclasses
import http.server
import json
import logging
import queue
import threading
import time
import uuid

from spiral_jax.sampling import SamplingParams

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request the server answers with HTTP 400 and this message."""


@dataclasses.dataclass
class _Job:
    prompt: list[int]
    sampling: SamplingParams
    n: int
    seed: int | None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: object = None  # SampleOutput rows for this job, or an exception


class ChatServer:
    """Serves `params` through `sampler` on host:port (port 0: any free port; see `url`)."""

    def __init__(self, sampler, tokenizer, params, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                 max_rows: int = 64, max_tokens: int = 4096, seed: int = 0):
        self.sampler, self.tokenizer, self.params = sampler, tokenizer, params
        self.model_name, self.max_rows, self.max_tokens, self.seed = model_name, max_rows, max_tokens, seed
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.rows_sampled = 0
        self.batches = 0
        self.http = http.server.ThreadingHTTPServer((host, port), _handler(self))
        self.http.daemon_threads = True
        self._worker = threading.Thread(target=self._work, name="spiral-jax-serve-sampler", daemon=True)
        self._worker.start()

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

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.jobs.put(None)
        self._worker.join()

    # ---------------------------------------------------------------------------- requests

    def complete(self, body: dict) -> dict:
        """A chat completion for one request body (the OpenAI format)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                for m in messages):
            raise BadRequest("messages must be a non-empty list of {\"role\": ..., \"content\": \"...\"}")
        n = _number(body, "n", 1, int)
        if not 1 <= n <= self.max_rows:
            raise BadRequest(f"n must be between 1 and {self.max_rows}, got {n}")
        max_tokens = _number(body, "max_tokens", self.max_tokens, int)
        if not 1 <= max_tokens <= self.max_tokens:
            raise BadRequest(f"max_tokens must be between 1 and {self.max_tokens}, got {max_tokens}")
        try:
            sampling = SamplingParams(max_tokens, _number(body, "temperature", 1.0, float), 0,
                                      _number(body, "top_p", 1.0, float),
                                      stop_token_ids=self.tokenizer.stop_ids)
        except ValueError as err:
            raise BadRequest(str(err)) from None
        prompt = self.tokenizer.encode(self.tokenizer.template.render_chat(messages, self.tokenizer.hf))
        if len(prompt) > self.sampler.max_prompt_len:
            raise BadRequest(f"the prompt is {len(prompt)} tokens; this server takes at most "
                             f"{self.sampler.max_prompt_len}")
        seed = body.get("seed")
        job = _Job(prompt, sampling, n, None if seed is None else _number(body, "seed", 0, int))
        self.jobs.put(job)
        job.done.wait()
        if isinstance(job.result, Exception):
            raise job.result
        choices, used = [], 0
        for i, (ids, reason) in enumerate(job.result):
            used += len(ids)
            choices.append({"index": i, "message": {"role": "assistant", "content": self.tokenizer.decode(ids)},
                            "finish_reason": "length" if reason == "length" else "stop"})
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": used,
                          "total_tokens": len(prompt) * n + used}}

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "spiral-jax"}]}

    # ----------------------------------------------------------------------------- sampler

    def _work(self) -> None:
        """The sampler's one thread: take a job and every waiting job it can batch with, sample them."""
        held: list[_Job] = []
        while True:
            job = held.pop(0) if held else self.jobs.get()
            if job is None:
                return
            batch, rows = [job], job.n
            while job.seed is None:
                try:
                    other = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if other is None:
                    self.jobs.put(None)
                    break
                if other.seed is None and other.sampling == job.sampling and rows + other.n <= self.max_rows:
                    batch.append(other)
                    rows += other.n
                else:
                    held.append(other)
            self._sample(batch, rows)

    def _sample(self, batch: list[_Job], rows: int) -> None:
        try:
            prompts = [j.prompt for j in batch for _ in range(j.n)]
            if batch[0].seed is not None:
                seed, row_ids = batch[0].seed, list(range(rows))
            else:
                seed, row_ids = self.seed, [self.rows_sampled + i for i in range(rows)]
            out = self.sampler.generate(self.params, prompts, batch[0].sampling, seed=seed, row_ids=row_ids)
            self.rows_sampled += rows
            self.batches += 1
            results = list(zip(out.tokens, out.finish_reasons))
            for j in batch:
                j.result, results = results[:j.n], results[j.n:]
        except Exception as err:  # the client hears of it (HTTP 500); the server keeps serving
            log.exception("sampling failed")
            for j in batch:
                j.result = err
        for j in batch:
            j.done.set()


def _number(body: dict, key: str, default, kind):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be a number{' (whole)' if kind is int else ''}, got {value!r}")
    return kind(value)


def _handler(server: ChatServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error"
                                          if status == 400 else "server_error"}})

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, server.models())
            else:
                self._error(404, f"no such endpoint {self.path}; this server has GET /v1/models and "
                                 "POST /v1/chat/completions")

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._error(404, f"no such endpoint {self.path}; POST /v1/chat/completions")
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                self._send(200, server.complete(body))
            except (BadRequest, json.JSONDecodeError) as err:
                self._error(400, str(err))
            except Exception as err:  # noqa: BLE001 (reported to the client, the server lives on)
                self._error(500, f"{type(err).__name__}: {err}")

        def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
