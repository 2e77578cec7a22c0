"""The serving loop: every request's answers decode side by side in the slots of one `DecodeEngine`.

Continuous batching: an answer takes a free slot as soon as one is free, and gives it back the step
it ends, so a long answer never holds short ones back, and an answer whose client has gone (or that
reached a stop string) is cancelled and frees its slot at once. Each slot keeps its own temperature,
top-p and token limit; the engine's sampling mode (greedy, plain, tempered, truncated) is shared, so
the loop keeps one engine per mode and switches, in arrival order, when the running one is empty.
Only the running engine holds a KV cache.

Randomness: an answer of a request that gives a `seed` is keyed by (seed, its choice index), so the
same request gets the same answer, whatever else is being decoded; other answers are keyed by the
server's seed and a running counter. One thread owns the engine and the parameters; request threads
hand it `Job`s and wait on them.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time

from spiral_jax.sampling import SamplingParams
from spiral_jax.sampling.engine import DecodeEngine, Request
from spiral_jax.sampling.scoring import top_logprobs
from spiral_jax.serve.protocol import ApiError, Ask, Choice

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Answer:
    job: "Job"
    index: int
    prompt: list[int]
    sent: str = ""  # text streamed so far
    choice: Choice | None = None


class Job:
    """A request's answers in the making. `done` is set when they are all there (`choices`) or the
    request failed (`error`). A streaming job also puts (index, new text, finish reason or None) on
    `events` as the text grows, and None at the end."""

    def __init__(self, ask: Ask):
        self.ask = ask
        self.answers = [_Answer(self, i, p) for i, p in enumerate(p for p in ask.prompts for _ in range(ask.n))]
        self.events: queue.Queue = queue.Queue()
        self.done = threading.Event()
        self.choices: list[Choice] | None = None
        self.error: ApiError | None = None
        self.cancelled = False

    def fail(self, error: ApiError) -> None:
        if not self.done.is_set():
            self.error = error
            self.events.put(None)
            self.done.set()


def _first_stop(text: str, stops) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


class Scheduler:
    """Decodes submitted jobs on `sampler`'s model with `params` in `slots` engine slots."""

    def __init__(self, sampler, tokenizer, params, slots: int, max_tokens: int, seed: int = 0, max_queued: int = 256,
                 stream_steps: int = 16):
        self.sampler, self.tokenizer, self.params = sampler, tokenizer, params
        self.slots, self.max_tokens, self.seed, self.max_queued = slots, max_tokens, seed, max_queued
        self.stream_steps = stream_steps
        self.pending: collections.deque[_Answer] = collections.deque()  # answers not started, in arrival order
        self.started: set[Job] = set()  # jobs with an answer started and not yet complete, failed or cancelled
        self.engines: dict[str, DecodeEngine] = {}
        self.engine: DecodeEngine | None = None
        self.lock = threading.Condition()
        self.closing = False
        self.deadline = float("inf")
        self.answers_started = 0  # also the row id of the next unseeded answer
        self.decode_calls = 0
        self._engine_for("plain")  # a sampler too small for these limits fails here, not in the loop
        self._thread = threading.Thread(target=self._loop, name="spiral-jax-serve-decode", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------- request threads

    def submit(self, job: Job) -> None:
        try:
            self.sampler.check_prompts(job.ask.prompts)
        except ValueError as err:
            raise ApiError(400, str(err)) from None
        with self.lock:
            if self.closing:
                raise ApiError(503, "the server is shutting down; retry on another replica or later")
            if len(self.pending) + len(job.answers) > self.max_queued:
                raise ApiError(503, f"the server is busy ({len(self.pending)} answers waiting for a slot); "
                                    f"retry later")
            self.pending.extend(job.answers)
            self.lock.notify()

    def cancel(self, job: Job) -> None:
        """The client has gone: free its slots, drop what has not started."""
        with self.lock:
            job.cancelled = True
            self.lock.notify()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Take no more jobs, refuse the waiting ones (503), give the running ones `timeout_s` to finish,
        then cancel them (503) and end the loop; returns at once (`join` waits for the end)."""
        with self.lock:
            self.closing = True
            self.deadline = time.monotonic() + timeout_s
            self.lock.notify()

    def join(self) -> None:
        self._thread.join()

    # ------------------------------------------------------------------------------- the loop

    def _engine_for(self, mode: str) -> DecodeEngine:
        if mode not in self.engines:
            stop = self.tokenizer.stop_ids
            sp = {"greedy": SamplingParams(self.max_tokens, greedy=True, stop_token_ids=stop),
                  "plain": SamplingParams(self.max_tokens, 1.0, stop_token_ids=stop),
                  "tempered": SamplingParams(self.max_tokens, 0.5, stop_token_ids=stop),
                  "truncated": SamplingParams(self.max_tokens, 1.0, 0, 0.5, stop_token_ids=stop)}[mode]
            self.engines[mode] = DecodeEngine(self.sampler, sp, self.slots, min_finished=1,
                                              max_steps=self.stream_steps)
        return self.engines[mode]

    def _live(self) -> list[_Answer]:
        return [r.tag for r in self.engine.busy if r is not None] if self.engine else []

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.pending and not self._live() and not self.closing:
                    self.lock.wait()
                if self.closing:
                    self._refuse_waiting()
                    if not self._live():
                        return
                admit = []
            try:
                with self.lock:
                    admit = self._admissions()
                    self.started = {j for j in self.started if not j.done.is_set() and not j.cancelled}
                    self.started.update(a.job for a in admit)
                if admit or self._live():  # an admission of only cancelled answers leaves nothing to do
                    self._step(admit)
            except Exception as err:  # noqa: BLE001 (the clients hear of it; the server keeps serving)
                log.exception("decoding failed")
                self._reset(ApiError(500, f"decoding failed: {type(err).__name__}: {err}"), admit)

    def _refuse_waiting(self) -> None:
        for answer in self.pending:
            answer.job.fail(ApiError(503, "the server shut down before this request started"))
        self.pending.clear()
        if time.monotonic() > self.deadline:
            for answer in self._live():
                answer.job.fail(ApiError(503, "the server shut down before this answer was complete"))
                answer.job.cancelled = True

    def _admissions(self) -> list[_Answer]:
        """Answers to start now: from the front of the queue, while slots are free and they share the
        running engine's mode (an empty engine switches to the next answer's mode)."""
        while self.pending and (self.pending[0].job.cancelled or self.pending[0].job.done.is_set()):
            self.pending.popleft()
        if not self.pending:
            return []
        mode = self.pending[0].job.ask.sampling.mode
        if self.engine is not None and not self._live() and self.engine.sampling.mode != mode:
            self.engine.forget()  # one KV cache at a time
            self.engine = None
        if self.engine is None:
            self.engine = self._engine_for(mode)
        free, admit = len(self.engine.free_slots()), []
        while self.pending and len(admit) < free and self.pending[0].job.ask.sampling.mode == self.engine.sampling.mode:
            answer = self.pending.popleft()
            if not answer.job.cancelled:
                admit.append(answer)
        return admit

    def _step(self, admit: list[_Answer]) -> None:
        engine = self.engine
        requests = []
        for a in admit:
            ask = a.job.ask
            seed, row = (ask.seed, a.index) if ask.seed is not None else (self.seed, self.answers_started)
            self.answers_started += 1
            requests.append(Request(a.prompt, seed, row, tag=a, sampling=ask.sampling))
        engine.insert(self.params, requests)
        engine.cancel([s for s, r in enumerate(engine.busy) if r is not None and r.tag.job.cancelled])
        finished = engine.decode(self.params)
        self.decode_calls += 1
        watched = {s: r.tag for s, r in enumerate(engine.busy)
                   if r is not None and (r.tag.job.ask.stream or r.tag.job.ask.stop) and not r.tag.job.cancelled}
        if watched:
            for slot, tokens in engine.peek().items():
                if slot in watched and self._grow(watched[slot], tokens, None):
                    engine.cancel([slot])  # reached a stop string
        for f in finished:
            if not f.request.tag.job.cancelled:
                self._grow(f.request.tag, f.tokens, f)

    def _grow(self, answer: _Answer, tokens: list[int], finished) -> bool:
        """Take an answer's tokens so far (or its final ones): stream the new text, cut it at a stop
        string, and complete the answer when it has ended. True if a stop string ended it."""
        ask, decode = answer.job.ask, self.tokenizer.decode
        text = decode(tokens)
        cut = _first_stop(text, ask.stop)
        if cut is not None:
            text = text[:cut]
        if ask.stream:
            ready = text
            if finished is None and cut is None:  # hold back what may be the start of a stop string or a character
                ready = text[:max(0, len(text) - max((len(s) - 1 for s in ask.stop), default=0))].rstrip("\ufffd")
            if len(ready) > len(answer.sent) and ready.startswith(answer.sent):
                answer.job.events.put((answer.index, ready[len(answer.sent):], None))
                answer.sent = ready
        if finished is None:
            return cut is not None
        if cut is not None:  # keep the tokens whose text lies before the stop string
            lo, hi = 0, len(tokens)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if len(decode(tokens[:mid])) <= cut else (lo, mid - 1)
            tokens = tokens[:lo]
        reason = "stop" if cut is not None or finished.finish_reason == "stop" else "length"
        answer.choice = Choice(answer.index, text, tokens, [float(x) for x in finished.raw_logprobs[:len(tokens)]],
                               reason)
        if ask.stream:
            answer.job.events.put((answer.index, None, reason))
        if all(a.choice is not None for a in answer.job.answers):
            self._complete(answer.job)
        return cut is not None

    def _complete(self, job: Job) -> None:
        if job.ask.top_logprobs:
            for c, a in zip((a.choice for a in job.answers), job.answers):
                if c.tokens:
                    ids, lps = top_logprobs(self.params, self.sampler.cfg, a.prompt, c.tokens, job.ask.top_logprobs)
                    c.top = [list(zip(i.tolist(), v.tolist())) for i, v in zip(ids, lps)]
                else:
                    c.top = []
        job.choices = [a.choice for a in job.answers]
        job.events.put(None)
        job.done.set()

    def _reset(self, error: ApiError, admitted: list[_Answer]) -> None:
        """After a failed step: fail every job in flight (those whose answers had all left their slots
        but were not complete yet too) and start from a fresh engine."""
        for job in self.started | {a.job for a in self._live() + admitted}:
            job.fail(error)
        self.started.clear()
        if self.engine is not None:
            self.engines.pop(self.engine.sampling.mode, None)
        self.engine = None
