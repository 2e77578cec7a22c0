"""Compiling the programs a caller will likely need next, on background threads.

XLA compiles one program on about one core, and a real model's sampler program takes tens of seconds
(its decode step unrolled over the layers on a GPU). A rollout meets its programs one after another,
in a known order: a round of games starts at the full batch bucket, and later rounds have fewer games
live, so the smaller buckets follow; a decode engine's rows grow into ever larger attention windows,
and its inserts after the first take fewer prompts and shorter blocks.
Compiling those ahead, in parallel and while the accelerator runs the current call, takes most of
the program making off a first step's critical path.

A program compiled through `jax.jit(...).lower(...).compile()` is the one a later call of the same
jitted function with arguments of the same types runs: JAX keeps the executable with the lowering, so
the call does not compile again. A caller waits for a program still compiling here rather than
compile it a second time (`wait`), and that wait is reported to `jax.monitoring` as WAIT_EVENT, so
timers that leave out program making can leave it out too. A program no thread has begun yet is
taken off the queue instead: the caller compiles it at once rather than wait behind others. A
compile that fails here is dropped: the caller's own call then compiles the program, and raises what
is wrong where it can be handled.

On a CPU backend the same cores run the programs, so compiling ahead only slows them down:
`auto_workers` gives 0 there. At exit, compiles not yet started are dropped and those running are
let finish: XLA must not be torn down under a compiling thread.
"""
from __future__ import annotations

import atexit
import contextvars
import os
import queue
import threading
import time
import weakref
from typing import Callable, Hashable

import jax

WAIT_EVENT = "/spiral_jax/sampling/compile_ahead_wait_duration"
# Threads on an accelerator's host by default: compiles hold about a core each, and a host also
# runs the games, the tokenizer and the input pipeline.
_MAX_AUTO_WORKERS = 8
# Seconds a thread waits for work before it ends (a later submit starts another).
_IDLE_SECONDS = 60.0
# Seconds the interpreter's exit waits for compiles still running (a real model's: tens of seconds).
_EXIT_WAIT_SECONDS = 180.0


def auto_workers(platform: str | None = None) -> int:
    """Background compile threads for `platform` (default: JAX's backend): none on a CPU, else half
    this host's cores, at most 8."""
    if (platform or jax.default_backend()) == "cpu":
        return 0
    return max(1, min(_MAX_AUTO_WORKERS, (os.cpu_count() or 2) // 2))


_working: weakref.WeakSet = weakref.WeakSet()  # every CompileAhead whose threads may be running


@atexit.register
def _close_all() -> None:
    for ahead in list(_working):
        ahead.close(timeout=_EXIT_WAIT_SECONDS)


class CompileAhead:
    """A queue of programs to compile, worked by `workers` daemon threads (0: never compile ahead).

    submit(key, lower) queues `lower().compile()` once per key; `lower` runs on the worker under the
    submitter's context variables (what platform a program is traced for, say), and may return None
    to withdraw the job (what it would lower for is gone): its key may then be submitted again.
    wait(key) returns once that key's compile has ended; at once for a key never submitted, and for
    one still queued, which it drops (the caller's own call compiles it)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._ended: dict[Hashable, threading.Event] = {}
        self._queued: set[Hashable] = set()  # submitted, not yet taken by a thread or a caller
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def __contains__(self, key: Hashable) -> bool:
        """Whether `key` was queued (and not withdrawn)."""
        return key in self._ended

    def submit(self, key: Hashable, lower: Callable[[], jax.stages.Lowered]) -> bool:
        """Queue the program; False (and nothing queued) when it was queued before or workers is 0."""
        if not self.workers or self._closed:
            return False
        with self._lock:
            if key in self._ended:
                return False
            self._ended[key] = threading.Event()
            self._queued.add(key)
            self._jobs.put((key, contextvars.copy_context(), lower))
            if len(self._threads) < self.workers:
                thread = threading.Thread(target=self._work, name=f"spiral-jax-compile-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                _working.add(self)
                thread.start()
        return True

    def wait(self, key: Hashable) -> None:
        """Return once `key`'s compile has ended; at once if it never was queued or no thread has
        begun it (then it is dropped, for the caller to compile)."""
        ended = self._ended.get(key)
        if ended is None or ended.is_set():
            return
        with self._lock:
            if key in self._queued:
                self._queued.discard(key)
                ended.set()
                return
        start = time.perf_counter()
        ended.wait()
        jax.monitoring.record_event_duration_secs(WAIT_EVENT, time.perf_counter() - start)

    def join(self, timeout: float | None = None) -> bool:
        """Return once every program queued so far has ended (compiled here, or taken back by a
        caller's `wait`; join takes none back), or after `timeout` seconds; whether all have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for ended in list(self._ended.values()):
            if not ended.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                return False
        return True

    def close(self, timeout: float | None = None) -> None:
        """Queue nothing more, drop what has not started, and return once the compiles running end (or
        after `timeout` seconds)."""
        self._closed = True
        self.join(timeout)

    def _work(self) -> None:
        while True:
            try:
                key, context, lower = self._jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:  # submit queues under the lock: nothing can arrive unseen
                    if self._jobs.empty():
                        self._threads.remove(threading.current_thread())
                        return
                continue
            with self._lock:  # a job a caller took is left to the caller's own call
                mine = key in self._queued
                self._queued.discard(key)
                ended = self._ended[key]
            try:
                if mine and not self._closed:
                    lowered = context.run(lower)
                    lower = None  # what it holds (the parameters) is not needed to compile
                    if lowered is None:  # withdrawn: a later submit queues it again
                        with self._lock:
                            del self._ended[key]
                    else:
                        context.run(lowered.compile)
            except Exception:  # noqa: BLE001 - the caller's own call compiles it, and raises there
                pass
            finally:
                lower = lowered = None  # nothing of the job outlives it, while the thread idles
                ended.set()
