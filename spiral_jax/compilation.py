"""A process-wide count of XLA compilations, so tests and logs can prove a hot loop never recompiles.

JAX reports a backend compile for every executable it builds, also one it loads from the persistent
compilation cache (`jax_compilation_cache_dir`) instead: either way the in-memory jit cache missed,
which is what a hot loop must never do (tests/test_compilation.py checks both).
"""
from __future__ import annotations

import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _on_event(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _BACKEND_COMPILE_EVENT:
        with _lock:
            _count += 1


def compile_count() -> int:
    """Number of backend compilations since the counter was first used in this process."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _installed = True
        return _count
